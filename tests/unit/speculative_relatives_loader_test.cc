// DSpark / DFlash2 loaders through the drafter registry: the accepted spellings and the refusals
// and bad input, each error naming the key or tensor (and the CLI exits with 1 on them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kData = BS_TEST_DATA;
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDSpark = kData + "/dspark-stories260K";
const std::string kDFlash2 = kData + "/dflash2-stories260K";

class RelativesLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto t = load_target(kStories, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    dir_ = fs::temp_directory_path() /
           ("bs_relatives_loader_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static json config_of(const std::string& src) {
    auto j = io::read_json_file(src + "/config.json");
    EXPECT_TRUE(j.ok()) << j.status().message();
    return *j;
  }

  // Writes `config` and the tensors of `src` passed through `edit` (rename, drop: empty name,
  // or reshape), then loads the folder.
  Result<std::unique_ptr<Drafter>> load(
      const std::string& src, const json& config,
      const std::function<void(io::TensorToWrite&)>& edit = nullptr) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
    auto ck = io::Checkpoint::open(src);
    EXPECT_TRUE(ck.ok()) << ck.status().message();
    std::vector<io::TensorToWrite> tensors;
    for (const auto& name : ck->names()) {
      const io::TensorInfo* t = *ck->get(name);
      io::TensorToWrite w{name, t->dtype, t->shape, t->data};
      if (edit) edit(w);
      if (!w.name.empty()) tensors.push_back(w);
    }
    EXPECT_TRUE(io::write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
    return load_drafter(dir_.string(), *target_, {});
  }

  static void expect_error(const Result<std::unique_ptr<Drafter>>& r, StatusCode code,
                           std::vector<std::string> parts) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    for (const auto& p : parts) {
      EXPECT_NE(r.status().message().find(p), std::string::npos)
          << "'" << p << "' not in: " << r.status().message();
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  fs::path dir_;
};

TEST_F(RelativesLoader, GoldenCheckpointsLoad) {
  for (const auto& [src, family, drafts] :
       std::vector<std::tuple<std::string, std::string, int64_t>>{{kDSpark, "dspark", 7},
                                                                  {kDFlash2, "dflash2", 5}}) {
    auto r = load(src, config_of(src));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)->family(), family);
    EXPECT_EQ((*r)->max_drafts(), drafts);
    // Without architectures the dflash_config keys pick the family.
    json c = config_of(src);
    c.erase("architectures");
    r = load(src, c);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)->family(), family);
  }
}

TEST_F(RelativesLoader, DSparkSpellings) {
  // Raw Markov names and the "model." prefix.
  auto r = load(kDSpark, config_of(kDSpark), [](io::TensorToWrite& t) {
    if (t.name.rfind("markov_head.", 0) == 0) t.name = t.name.substr(0, t.name.size() - 7);
    t.name = "model." + t.name;
  });
  EXPECT_TRUE(r.ok()) << r.status().message();
  // markov_rank 0 without Markov tensors and no confidence head: the shifted backbone alone.
  json c = config_of(kDSpark);
  c["dflash_config"]["markov_rank"] = 0;
  c["dflash_config"]["enable_confidence_head"] = false;
  r = load(kDSpark, c, [](io::TensorToWrite& t) {
    if (t.name.rfind("markov_head.", 0) == 0) t.name.clear();
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE((*r)->has_confidence());
}

TEST_F(RelativesLoader, DSparkRefusalsAndBadInput) {
  json c = config_of(kDSpark);
  c["dflash_config"]["markov_head_type"] = "gated";
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"markov_head_type", "gated"});
  c = config_of(kDSpark);
  c["dflash_config"]["markov_head_type"] = "rnn";
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"markov_head_type", "rnn"});
  c = config_of(kDSpark);
  c["dflash_config"]["dspark_bonus_anchor"] = true;
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"dspark_bonus_anchor"});
  c = config_of(kDSpark);
  c["dflash_config"]["sample_from_anchor"] = false;
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"sample_from_anchor"});
  c = config_of(kDSpark);
  c["dflash_config"].erase("projector_type");
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument, {"projector_type"});
  // A rank that disagrees with the tensors.
  c = config_of(kDSpark);
  c["dflash_config"]["markov_rank"] = 8;
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument,
               {"markov_head.markov_w1", "markov_rank"});
  // A Markov rank with no Markov tensors.
  expect_error(load(kDSpark, config_of(kDSpark),
                    [](io::TensorToWrite& t) {
                      if (t.name.rfind("markov_head.", 0) == 0) t.name.clear();
                    }),
               StatusCode::kNotFound, {"markov_head.markov_w1", "markov_rank"});
  // Markov tensors but rank 0.
  c = config_of(kDSpark);
  c["dflash_config"]["markov_rank"] = 0;
  c["dflash_config"]["confidence_head_with_markov"] = false;
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument, {"markov_rank"});
  // The confidence head's projection is missing / of the wrong width.
  expect_error(load(kDSpark, config_of(kDSpark),
                    [](io::TensorToWrite& t) {
                      if (t.name == "confidence_head.proj.weight") t.name.clear();
                    }),
               StatusCode::kNotFound, {"confidence_head.proj.weight"});
  c = config_of(kDSpark);
  c["dflash_config"]["confidence_head_with_markov"] = false;
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument,
               {"confidence_head.proj.weight", "confidence_head_with_markov"});
  c = config_of(kDSpark);
  c["dflash_config"]["dspark_draft_topk"] = 100000;
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument, {"dspark_draft_topk"});
}

TEST_F(RelativesLoader, DFlash2SpellingsAndBadInput) {
  // Codebooks spelled with ".weight", names with "model.".
  auto r = load(kDFlash2, config_of(kDFlash2), [](io::TensorToWrite& t) {
    if (t.name.find("_codebook") != std::string::npos) t.name += ".weight";
    t.name = "model." + t.name;
  });
  EXPECT_TRUE(r.ok()) << r.status().message();
  // Missing codebook.
  expect_error(load(kDFlash2, config_of(kDFlash2),
                    [](io::TensorToWrite& t) {
                      if (t.name == "candidate_selector.predecessor_codebook") t.name.clear();
                    }),
               StatusCode::kNotFound, {"candidate_selector.predecessor_codebook", "selector_rank"});
  // A selector rank that disagrees with the codebooks.
  json c = config_of(kDFlash2);
  c["dflash_config"]["selector_rank"] = 4;
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument,
               {"candidate_selector.predecessor_codebook", "selector_rank"});
  // Conv shapes.
  c = config_of(kDFlash2);
  c["dflash_config"]["conv_group_size"] = 8;
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument,
               {"layers.0.attention_conv.kernel_projection.weight", "conv_group_size"});
  c = config_of(kDFlash2);
  c["dflash_config"]["conv_group_size"] = 7;
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument, {"conv_group_size"});
  c = config_of(kDFlash2);
  c["dflash_config"].erase("conv_kernel_size");
  c.erase("architectures");  // still DFlash2 (selector_rank), then the missing key
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument, {"conv_kernel_size"});
  expect_error(load(kDFlash2, config_of(kDFlash2),
                    [](io::TensorToWrite& t) {
                      if (t.name == "layers.1.mlp_conv.base_kernel") t.name.clear();
                    }),
               StatusCode::kNotFound, {"layers.1.mlp_conv.base_kernel"});
  c = config_of(kDFlash2);
  c["dflash_config"]["selector_top_k"] = 0;
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument, {"selector_top_k"});
}

// The CLI turns a bad drafter into a message and exit code 1 (no crash).
TEST_F(RelativesLoader, CliExitsWithOne) {
  json c = config_of(kDFlash2);
  c["dflash_config"]["selector_rank"] = 4;
  ASSERT_FALSE(load(kDFlash2, c).ok());
  const std::string err_file = (dir_ / "stderr.txt").string();
  const std::string cmd = std::string(BS_BINARY_DIR) + "/blockspec generate --model " + kStories +
                          " --drafter " + dir_.string() +
                          " --prompt hi --max-tokens 4 --device cpu >/dev/null 2>" + err_file;
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream f(err_file);
  const std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("selector_rank"), std::string::npos) << err;
}

}  // namespace
}  // namespace bs
