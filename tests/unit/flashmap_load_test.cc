// FlashMap checkpoint format: load-time validation (errors name the field or tensor), draft
// vocabulary spellings (d2t, draft_vocab.safetensors), name prefixes, run-time options.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/drafters/flashmap.h"
#include "models/registry.h"

namespace bs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTarget = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_TEST_DATA) + "/flashmap-stories260K";
const std::string kDrafterDv = std::string(BS_TEST_DATA) + "/flashmap-stories260K-dv128";

class FlashMapLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto t = load_target(kTarget, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    auto cfg = io::read_json_file(kDrafter + "/config.json");
    ASSERT_TRUE(cfg.ok());
    config_ = *cfg;
    auto ck = io::Checkpoint::open(kDrafter);
    ASSERT_TRUE(ck.ok());
    source_ = std::make_unique<io::Checkpoint>(std::move(*ck));
    root_ = fs::path(testing::TempDir()) / ("flashmap_load_" + std::to_string(::getpid()));
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A copy of the test checkpoint with a modified config and tensor set: `rename` maps each
  // source name to its new name ("" drops it); `extra` adds tensors.
  std::string write_variant(const std::string& name, const json& config,
                            const std::function<std::string(const std::string&)>& rename = {},
                            std::vector<io::TensorToWrite> extra = {}) {
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    std::vector<io::TensorToWrite> tensors;
    for (const std::string& n : source_->names()) {
      const std::string out = rename ? rename(n) : n;
      if (out.empty()) continue;
      const io::TensorInfo* info = *source_->get(n);
      tensors.push_back({out, info->dtype, info->shape, info->data});
    }
    for (auto& t : extra) tensors.push_back(std::move(t));
    const Status st = io::write_safetensors((dir / "model.safetensors").string(), tensors);
    EXPECT_TRUE(st.ok()) << st.message();
    return dir.string();
  }

  Result<std::unique_ptr<FlashMapDrafter>> load(const std::string& dir, const json& config,
                                                DrafterOptions opt = {}) {
    return load_flashmap_drafter(dir, config, *target_, opt);
  }

  // Loading fails and the message mentions every string of `needles`.
  void expect_error(const std::string& dir, const json& config, std::vector<std::string> needles,
                    DrafterOptions opt = {}) {
    auto d = load(dir, config, opt);
    ASSERT_FALSE(d.ok()) << "loaded, expected an error mentioning " << needles[0];
    for (const auto& n : needles) {
      EXPECT_NE(d.status().message().find(n), std::string::npos)
          << "'" << d.status().message() << "' lacks '" << n << "'";
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  json config_;
  std::unique_ptr<io::Checkpoint> source_;
  fs::path root_;
};

TEST_F(FlashMapLoad, LoadsTheTestCheckpoint) {
  auto d = load(kDrafter, config_);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->family(), "flashmap");
  EXPECT_EQ((*d)->block_size(), 8);
  EXPECT_EQ((*d)->max_drafts(), 8);
  EXPECT_EQ((*d)->target_layers(), (std::vector<int>{0, 1, 2}));  // aux ids [1, 2, 3] - 1
  EXPECT_EQ((*d)->num_steps(), 1);
  EXPECT_TRUE((*d)->folded());
  EXPECT_TRUE((*d)->draft_vocab().empty());
  // The generic entry point too.
  auto g = load_flashmap(kDrafter, config_, *target_, {});
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ((*g)->family(), "flashmap");
}

TEST_F(FlashMapLoad, ConfigErrorsNameTheField) {
  for (const char* field :
       {"hidden_size", "target_hidden_size", "time_grids", "noise_gate", "timestep_embed_dim",
        "eagle_aux_hidden_state_layer_ids", "adaln_eps", "block_size", "num_steps", "time_scale"}) {
    json c = config_;
    c.erase(field);
    expect_error(kDrafter, c, {field});
  }
  json c = config_;
  c["target_hidden_size"] = 32;
  expect_error(kDrafter, c, {"target_hidden_size", "32", "64"});
  c = config_;
  c["eagle_aux_hidden_state_layer_ids"] = {0, 1};
  expect_error(kDrafter, c, {"eagle_aux_hidden_state_layer_ids", "0"});
  c["eagle_aux_hidden_state_layer_ids"] = {1, 6};  // stories260K has 5 layers
  expect_error(kDrafter, c, {"eagle_aux_hidden_state_layer_ids", "6"});
  c = config_;
  c["time_grids"] = {{0.0, 1.0}, {0.0, 0.7, 0.4}};
  expect_error(kDrafter, c, {"time_grids[1]"}, {.flashmap_steps = 2});
  c["time_grids"] = {{0.0, 1.0}, {0.0, 1.0}};
  expect_error(kDrafter, c, {"time_grids[1]", "3"}, {.flashmap_steps = 2});
  c["time_grids"] = {{0.0, "x"}};
  expect_error(kDrafter, c, {"time_grids[0]"});
  c = config_;
  c["vocab_size"] = 1024;
  expect_error(kDrafter, c, {"vocab_size", "1024"});
  c = config_;
  c["head_dim"] = 15;
  expect_error(kDrafter, c, {"head_dim"});
  c = config_;
  c["draft_vocab_size"] = 600;
  expect_error(kDrafter, c, {"draft_vocab_size"});
  // Options.
  expect_error(kDrafter, config_, {"time_grids", "4 jump"}, {.flashmap_steps = 4});
  expect_error(kDrafter, config_, {"flashmap_steps"}, {.flashmap_steps = -1});
  expect_error(kDrafter, config_, {"flashmap_noise_scale"},
               {.flashmap_noise_scale = std::nanf("")});
}

TEST_F(FlashMapLoad, TensorErrorsNameTheTensor) {
  // Missing.
  std::string dir = write_variant("missing", config_, [](const std::string& n) {
    return n == "layers.1.mlp.fc2.bias" ? "" : n;
  });
  expect_error(dir, config_, {"layers.1.mlp.fc2.bias", "missing"});
  dir = write_variant("missing_jump", config_, [](const std::string& n) {
    return n == "jump_embed.linear_2.weight" ? "" : n;
  });
  expect_error(dir, config_, {"jump_embed.linear_2.weight"});
  // Unexpected.
  const float one = 1.0f;
  dir = write_variant("unexpected", config_, {},
                      {{"layers.0.mlp.fc3.weight", DType::kF32, {1}, &one}});
  expect_error(dir, config_, {"unexpected", "layers.0.mlp.fc3.weight"});
  // Wrong shape: config says 3 heads of 16 where the tensors hold 4.
  json c = config_;
  c["num_attention_heads"] = 2;
  c["head_dim"] = 16;
  expect_error(kDrafter, c, {"self_attn.q_proj.weight", "[32,64]"});
  // The target's own tensors and t2d are skipped, as in the seed.
  std::vector<float> emb(512 * 64, 0.0f);
  std::vector<int64_t> t2d(512, 0);
  dir = write_variant("with_target", config_, {},
                      {{"embed_tokens.weight", DType::kF32, {512, 64}, emb.data()},
                       {"lm_head.weight", DType::kF32, {512, 64}, emb.data()},
                       {"t2d", DType::kI64, {512}, t2d.data()}});
  auto d = load(dir, config_);
  EXPECT_TRUE(d.ok()) << d.status().message();
}

TEST_F(FlashMapLoad, ModelPrefixedNames) {
  const std::string dir =
      write_variant("prefixed", config_, [](const std::string& n) { return "model." + n; });
  auto d = load(dir, config_);
  EXPECT_TRUE(d.ok()) << d.status().message();
}

TEST_F(FlashMapLoad, DraftVocabularySpellings) {
  auto dv_cfg = io::read_json_file(kDrafterDv + "/config.json");
  ASSERT_TRUE(dv_cfg.ok());
  auto from_file = load(kDrafterDv, *dv_cfg);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  const std::vector<int32_t> hot = (*from_file)->draft_vocab();
  ASSERT_EQ(hot.size(), 128u);
  EXPECT_TRUE(std::is_sorted(hot.begin(), hot.end()));
  // The same vocabulary as EAGLE-3 offsets in the checkpoint: d2t[j] = hot[j] - j.
  std::vector<int64_t> d2t(128);
  for (int64_t j = 0; j < 128; ++j) d2t[j] = hot[j] - j;
  const std::string dir =
      write_variant("d2t", *dv_cfg, {}, {{"d2t", DType::kI64, {128}, d2t.data()}});
  auto from_d2t = load(dir, *dv_cfg);
  ASSERT_TRUE(from_d2t.ok()) << from_d2t.status().message();
  EXPECT_EQ((*from_d2t)->draft_vocab(), hot);
  // Same drafts from both (same weights, same seed).
  auto logits = [&](FlashMapDrafter& d) {
    KvPool kv = d.make_kv_pool(2);
    const std::vector<int32_t> table{1, 0};
    Tensor taps = backend_->empty({4, 192}, DType::kF32);
    std::vector<float> x(4 * 192);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) * 0.1f - 0.5f;
    backend_->copy_from_host(taps, x.data());
    EXPECT_TRUE(d.observe(kv, table, taps, 0).ok());
    Tensor out;
    EXPECT_TRUE(
        d.propose(kv, {.anchor = 300, .anchor_pos = 4, .block_table = table, .num_drafts = 5}, &out)
            .ok());
    return backend_->to_host_f32(out);
  };
  const std::vector<float> a = logits(**from_file), b = logits(**from_d2t);
  EXPECT_EQ(a, b);
  // -inf outside the draft vocabulary, finite inside.
  for (int64_t r = 0; r < 5; ++r) {
    int finite = 0;
    for (int64_t v = 0; v < 512; ++v) finite += std::isfinite(a[r * 512 + v]) ? 1 : 0;
    EXPECT_EQ(finite, 128);
  }
  // A restricted config with neither spelling.
  json no_vocab = config_;
  no_vocab["draft_vocab_size"] = 128;
  expect_error(kDrafter, no_vocab, {"d2t", "draft_vocab.safetensors"});
  // d2t pointing outside the vocabulary or twice at one token.
  d2t[5] = 10000;
  std::string bad =
      write_variant("d2t_bad", *dv_cfg, {}, {{"d2t", DType::kI64, {128}, d2t.data()}});
  expect_error(bad, *dv_cfg, {"draft vocabulary", "entry 5"});
  d2t[5] = hot[4] - 5;
  bad = write_variant("d2t_dup", *dv_cfg, {}, {{"d2t", DType::kI64, {128}, d2t.data()}});
  expect_error(bad, *dv_cfg, {"draft vocabulary", "entry 5"});
  // d2t with an unrestricted config.
  d2t[5] = hot[5] - 5;
  bad = write_variant("d2t_unrestricted", config_, {}, {{"d2t", DType::kI64, {128}, d2t.data()}});
  expect_error(bad, config_, {"d2t", "draft_vocab_size"});
}

TEST_F(FlashMapLoad, RuntimeErrors) {
  auto d = load(kDrafter, config_);
  ASSERT_TRUE(d.ok());
  KvPool kv = (*d)->make_kv_pool(2);
  const std::vector<int32_t> table{0, 1};
  Tensor out;
  EXPECT_FALSE(
      (*d)->propose(kv, {.anchor = 1, .anchor_pos = 3, .block_table = table, .num_drafts = 9}, &out)
          .ok());
  EXPECT_FALSE(
      (*d)->propose(kv, {.anchor = 1, .anchor_pos = 3, .block_table = table, .num_drafts = 0}, &out)
          .ok());
  EXPECT_FALSE(
      (*d)->propose(kv, {.anchor = 512, .anchor_pos = 3, .block_table = table, .num_drafts = 2},
                    &out)
          .ok());
  EXPECT_FALSE((*d)->propose(kv,
                             {.anchor = 1, .anchor_pos = 32, .block_table = table, .num_drafts = 2},
                             &out)
                   .ok());
  Tensor taps = backend_->empty({2, 100}, DType::kF32);
  EXPECT_FALSE((*d)->observe(kv, table, taps, 0).ok());
  Tensor good = backend_->empty({2, 192}, DType::kF32);
  EXPECT_FALSE((*d)->observe(kv, table, good, 31).ok());
  EXPECT_TRUE((*d)->observe(kv, table, good, 30).ok());
  (*d)->inject_noise(std::vector<float>(3, 0.0f));
  EXPECT_FALSE(
      (*d)->propose(kv, {.anchor = 1, .anchor_pos = 3, .block_table = table, .num_drafts = 2}, &out)
          .ok());
}

}  // namespace
}  // namespace bs
