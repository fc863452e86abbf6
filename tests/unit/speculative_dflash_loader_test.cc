// DFlash loader and drafter registry: config spellings, the default tap rule, mask variants, and
// bad input (each error names the offending field, tensor or path).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/drafters/dflash.h"
#include "models/registry.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBase = std::string(BS_TEST_DATA) + "/dflash-stories260K";
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

json base_config() {
  auto j = io::read_json_file(kBase + "/config.json");
  EXPECT_TRUE(j.ok()) << j.status().message();
  return *j;
}

class DFlashLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto t = load_target(kStories, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    dir_ = fs::temp_directory_path() /
           ("bs_dflash_loader_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `config` (and the base checkpoint unless told otherwise) and loads it.
  Result<std::unique_ptr<Drafter>> load(const json& config, bool copy_weights = true) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
    if (copy_weights) {
      fs::copy_file(kBase + "/model.safetensors", dir_ / "model.safetensors",
                    fs::copy_options::overwrite_existing);
    }
    return load_drafter(dir_.string(), *target_, {});
  }

  // Expects an error of `code` whose message contains every string of `parts`.
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

TEST_F(DFlashLoader, BaseLoads) {
  auto r = load(base_config());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->family(), "dflash");
}

TEST_F(DFlashLoader, MissingDirectoryAndConfig) {
  auto r = load_drafter((dir_ / "nope").string(), *target_, {});
  expect_error(r, StatusCode::kNotFound, {"nope"});
  r = load_drafter(dir_.string(), *target_, {});  // empty folder
  expect_error(r, StatusCode::kNotFound, {"config.json"});
}

TEST_F(DFlashLoader, MaskIdOutOfRange) {
  json c = base_config();
  c["dflash_config"]["mask_token_id"] = 512;
  expect_error(load(c), StatusCode::kInvalidArgument, {"mask_token_id", "512"});
  c["dflash_config"]["mask_token_id"] = -1;
  expect_error(load(c), StatusCode::kInvalidArgument, {"mask_token_id"});
}

TEST_F(DFlashLoader, MaskIdMissing) {
  json c = base_config();
  c["dflash_config"].erase("mask_token_id");
  expect_error(load(c), StatusCode::kInvalidArgument, {"mask_token_id"});
  // The top-level spelling is accepted.
  c["mask_token_id"] = 3;
  EXPECT_TRUE(load(c).ok());
}

TEST_F(DFlashLoader, LayerIdBeyondTarget) {
  json c = base_config();
  c["dflash_config"]["target_layer_ids"] = {1, 2, 5};
  expect_error(load(c), StatusCode::kInvalidArgument, {"target_layer_ids", "5"});
}

TEST_F(DFlashLoader, NumTargetLayersMismatch) {
  json c = base_config();
  c["num_target_layers"] = 36;
  expect_error(load(c), StatusCode::kInvalidArgument, {"num_target_layers", "36"});
}

TEST_F(DFlashLoader, HiddenMismatch) {
  json c = base_config();
  c["hidden_size"] = 32;
  expect_error(load(c), StatusCode::kInvalidArgument, {"hidden_size", "32", "64"});
}

TEST_F(DFlashLoader, VocabMismatch) {
  json c = base_config();
  c["vocab_size"] = 500;
  expect_error(load(c), StatusCode::kInvalidArgument, {"vocab_size", "500"});
}

TEST_F(DFlashLoader, FcShapeMismatch) {
  json c = base_config();
  c["dflash_config"]["target_layer_ids"] = {1, 2};  // fc is [64, 192]: 3 taps
  expect_error(load(c), StatusCode::kInvalidArgument, {"fc.weight", "[64,192]", "128"});
}

TEST_F(DFlashLoader, BlockSizeMissing) {
  json c = base_config();
  c.erase("block_size");
  expect_error(load(c), StatusCode::kInvalidArgument, {"block_size"});
  c["dflash_config"]["block_size"] = 1;
  expect_error(load(c), StatusCode::kInvalidArgument, {"block_size"});
  c["dflash_config"]["block_size"] = 4;
  auto r = load(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->block_size(), 4);
}

TEST_F(DFlashLoader, MissingTensor) {
  auto ck = io::Checkpoint::open(kBase);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  std::vector<io::TensorToWrite> tensors;
  for (const auto& name : ck->names()) {
    if (name == "layers.1.mlp.up_proj.weight") continue;
    const io::TensorInfo* t = *ck->get(name);
    tensors.push_back({name, t->dtype, t->shape, t->data});
  }
  ASSERT_TRUE(io::write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
  expect_error(load(base_config(), /*copy_weights=*/false), StatusCode::kNotFound,
               {"layers.1.mlp.up_proj.weight"});
}

TEST_F(DFlashLoader, PrefixedNames) {
  auto ck = io::Checkpoint::open(kBase);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  std::vector<io::TensorToWrite> tensors;
  for (const auto& name : ck->names()) {
    const io::TensorInfo* t = *ck->get(name);
    tensors.push_back({"model." + name, t->dtype, t->shape, t->data});
  }
  ASSERT_TRUE(io::write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
  auto r = load(base_config(), /*copy_weights=*/false);
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST_F(DFlashLoader, UnsupportedArchitectures) {
  json c = base_config();
  c["architectures"] = {"MysteryDraftModel"};
  expect_error(load(c), StatusCode::kUnimplemented, {"MysteryDraftModel"});
  // The relatives go to their own loaders, which want their own keys. A DSpark class name is
  // enough for DSpark (DeepSpec writes no projector_type): this checkpoint is a DSpark without
  // heads (DeepSpec's DFlash baselines), drafting B rows.
  c["architectures"] = {"DSparkDraftModel"};
  {
    auto r = load(c);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)->family(), "dspark");
    EXPECT_FALSE((*r)->has_confidence());
  }
  c["architectures"] = {"DFlash2DraftModel"};
  expect_error(load(c), StatusCode::kInvalidArgument, {"conv_kernel_size"});
  // No architectures: a plain dflash_config is DFlash, a DSpark one is DSpark.
  c.erase("architectures");
  EXPECT_TRUE(load(c).ok());
  c["dflash_config"]["projector_type"] = "dspark";
  auto dspark = load(c);
  ASSERT_TRUE(dspark.ok()) << dspark.status().message();
  EXPECT_EQ((*dspark)->family(), "dspark");
  // DFlash architecture with the shifted layout.
  c = base_config();
  c["dflash_config"]["sample_from_anchor"] = true;
  expect_error(load(c), StatusCode::kUnimplemented, {"sample_from_anchor"});
}

TEST_F(DFlashLoader, FlashMapIsDispatchedElsewhere) {
  // Whatever the FlashMap loader says about this config, it is not the DFlash loader or the
  // "unsupported architecture" fallback answering.
  json c = {{"architectures", {"FlashMapDraftModel"}}};
  auto r = load(c, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("unsupported drafter architecture"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(r.status().message().find("mask_token_id"), std::string::npos);
}

TEST(DFlashConfigTest, DefaultTargetLayers) {
  EXPECT_EQ(dflash_default_target_layers(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(dflash_default_target_layers(5, 3), (std::vector<int>{1, 2, 2}));  // 1.5 -> 2
  EXPECT_EQ(dflash_default_target_layers(7, 3), (std::vector<int>{1, 2, 4}));  // 2.5 -> 2
  EXPECT_EQ(dflash_default_target_layers(9, 3), (std::vector<int>{1, 4, 6}));  // 3.5 -> 4
  EXPECT_EQ(dflash_default_target_layers(36, 1), (std::vector<int>{18}));
  EXPECT_EQ(dflash_default_target_layers(5, 2), (std::vector<int>{1, 2}));
}

TEST(DFlashConfigTest, MaskVariants) {
  json c = base_config();
  auto parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  for (const auto& m : parsed->layer_masks) {  // b16-style: full attention, non-causal
    EXPECT_FALSE(m.causal);
    EXPECT_EQ(m.window, 0);
  }
  // Sliding layers are causal and windowed, full layers not.
  c["layer_types"] = {"sliding_attention", "full_attention"};
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->layer_masks[0].causal);
  EXPECT_EQ(parsed->layer_masks[0].window, 16);
  EXPECT_FALSE(parsed->layer_masks[1].causal);
  EXPECT_EQ(parsed->layer_masks[1].window, 0);
  // dflash_config.causal overrides the layer types; is_causal overrides both.
  c["dflash_config"]["causal"] = true;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->layer_masks[1].causal);
  c["is_causal"] = false;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->layer_masks[0].causal);
  EXPECT_EQ(parsed->layer_masks[0].window, 16);
  // use_swa windows every layer, non-causal unless overridden.
  c = base_config();
  c["dflash_config"]["use_swa"] = true;
  c["dflash_config"]["swa_window_size"] = 8;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  for (const auto& m : parsed->layer_masks) {
    EXPECT_FALSE(m.causal);
    EXPECT_EQ(m.window, 8);
  }
  // The same keys at the top level (checkpoints that keep no dflash_config for them).
  c = base_config();
  c["use_swa"] = true;
  c["swa_window_size"] = 12;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  for (const auto& m : parsed->layer_masks) EXPECT_EQ(m.window, 12);
  c["swa_window_size"] = 0;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("swa_window_size"), std::string::npos);
  c = base_config();
  c["use_aux_hidden_state"] = false;
  parsed = parse_dflash_config(c, "config.json", 5);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("use_aux_hidden_state"), std::string::npos);
}

}  // namespace
}  // namespace bs
