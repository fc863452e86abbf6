// DSpark / DFlash2 loaders through the drafter registry: the accepted spellings and the refusals
// and bad input, each error naming the key or tensor (and the CLI exits with 1 on them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
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
const std::string kDFlash = kData + "/dflash-stories260K";

// What a drafter proposes from fixed context features: the rows of its greedy chain (propose), the
// greedy drafts and the confidences (propose_draw).
struct Outputs {
  std::vector<float> rows;
  std::vector<int32_t> drafts;
  std::vector<float> survival;
};

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

  // Observes 12 positions of deterministic features, proposes every draft at s = 12.
  Outputs run(Drafter& d) {
    Outputs o;
    const int64_t n = 12, k = d.max_drafts();
    const int64_t width =
        static_cast<int64_t>(d.target_layers().size()) * target_->config().hidden_size;
    std::vector<float> feats(static_cast<size_t>(n * width));
    for (size_t i = 0; i < feats.size(); ++i) feats[i] = std::sin(0.37f * static_cast<float>(i));
    Tensor taps = backend_->empty({n, width});
    backend_->copy_from_host(taps, feats.data());
    const std::vector<int32_t> table = {5, 2, 7, 0, 3};
    KvPool pool = d.make_kv_pool(8);
    const Status obs = d.observe(pool, table, taps, 0);
    EXPECT_TRUE(obs.ok()) << obs.message();
    const ProposeRequest req{.anchor = 17, .anchor_pos = n, .block_table = table, .num_drafts = k};
    Tensor logits;
    const Status prop = d.propose(pool, req, &logits);
    EXPECT_TRUE(prop.ok()) << prop.message();
    if (prop.ok()) o.rows = backend_->to_host_f32(logits);
    if (!d.draws_drafts()) return o;
    const DraftDraw draw{.ids = backend_->empty({k}, DType::kI32)};
    std::vector<std::vector<float>> conf;
    const Status s =
        d.propose_draw(pool, {&req, 1}, {&draw, 1}, d.has_confidence() ? &conf : nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    o.drafts.resize(static_cast<size_t>(k));
    backend_->copy_to_host(o.drafts.data(), draw.ids);
    if (!conf.empty()) o.survival = conf[0];
    return o;
  }

  // Loads (src, config, edit) and runs it; the drafter is gone before the next load rewrites the
  // folder.
  Outputs outputs_of(const std::string& src, const json& config,
                     const std::function<void(io::TensorToWrite&)>& edit = nullptr,
                     const std::string& family = "") {
    auto r = load(src, config, edit);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return {};
    if (!family.empty()) {
      EXPECT_EQ((*r)->family(), family);
    }
    return run(**r);
  }

  static void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
    ASSERT_FALSE(want.rows.empty()) << what;
    EXPECT_EQ(got.rows, want.rows) << what;
    EXPECT_EQ(got.drafts, want.drafts) << what;
    EXPECT_EQ(got.survival, want.survival) << what;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  fs::path dir_;
};

// DeepSpec's layout of a config c in the SpecForge layout: every dflash_config field at the top
// level, no projector_type, architectures ["Qwen3DSparkModel"] (deepspec/modeling/dspark/qwen3).
json deepspec_layout(json c) {
  for (const auto& [k, v] : c["dflash_config"].items()) {
    if (k != "projector_type" && k != "attention_mode" && k != "confidence_head_alpha") c[k] = v;
  }
  c.erase("dflash_config");
  c["architectures"] = {"Qwen3DSparkModel"};
  c["num_anchors"] = 512;
  return c;
}

bool is_markov(const io::TensorToWrite& t) { return t.name.rfind("markov_head.", 0) == 0; }

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
  // No projector_type and nothing else naming DSpark (the registry picked it by markov_rank).
  c = config_of(kDSpark);
  c["dflash_config"].erase("projector_type");
  c.erase("architectures");
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument, {"projector_type"});
  c = config_of(kDSpark);
  c["dflash_config"].erase("projector_type");
  c["projector_type"] = "dflash";
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"projector_type", "dflash"});
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

// DeepSpec's official DSpark checkpoints (deepseek-ai/dspark_qwen3_*_block7): all fields at the
// top level, architectures ["Qwen3DSparkModel"], no dflash_config / projector_type. They load and
// draft exactly as the same checkpoint in the SpecForge layout.
TEST_F(RelativesLoader, DeepSpecDSparkLayout) {
  const json golden = config_of(kDSpark);
  const Outputs want = outputs_of(kDSpark, golden);
  ASSERT_EQ(want.drafts.size(), 7u);
  ASSERT_EQ(want.survival.size(), 7u);
  const json deepspec = deepspec_layout(golden);
  ASSERT_FALSE(deepspec.contains("dflash_config"));
  expect_same(outputs_of(kDSpark, deepspec, nullptr, "dspark"), want, "DeepSpec layout");
  // The class name in any case, or model_type "dspark" with no architectures.
  json c = deepspec;
  c["architectures"] = {"qwen3_dspark"};
  expect_same(outputs_of(kDSpark, c, nullptr, "dspark"), want, "lower-case architecture");
  c = deepspec;
  c.erase("architectures");
  c["model_type"] = "dspark";
  expect_same(outputs_of(kDSpark, c, nullptr, "dspark"), want, "model_type dspark");
  // A top-level key that is read, not defaulted: another rank disagrees with the tensors.
  c = deepspec;
  c["markov_rank"] = 8;
  expect_error(load(kDSpark, c), StatusCode::kInvalidArgument, {"markov_rank"});
}

// DeepSpec's DFlash baselines: the same class with markov_rank 0 and no confidence head (and so
// neither markov_head_type nor confidence_head_with_markov): a DSpark without heads, as the
// SpecForge layout with markov_rank 0 gives.
TEST_F(RelativesLoader, DeepSpecDFlashBaseline) {
  json specforge = config_of(kDSpark);
  specforge["dflash_config"]["markov_rank"] = 0;
  specforge["dflash_config"]["enable_confidence_head"] = false;
  specforge["dflash_config"].erase("markov_head_type");
  specforge["dflash_config"].erase("confidence_head_with_markov");
  auto heads = [](io::TensorToWrite& t) {
    if (is_markov(t) || t.name.rfind("confidence_head.", 0) == 0) t.name.clear();
  };
  const Outputs want = outputs_of(kDSpark, specforge, heads, "dspark");
  EXPECT_TRUE(want.survival.empty());
  const json deepspec = deepspec_layout(specforge);
  {
    auto r = load(kDSpark, deepspec, heads);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)->family(), "dspark");
    EXPECT_FALSE((*r)->has_confidence());
    EXPECT_EQ((*r)->max_drafts(), 7);
  }
  expect_same(outputs_of(kDSpark, deepspec, heads), want, "DeepSpec DFlash baseline");
}

// sample_from_anchor: dflash_config first, then the top level (vLLM reads it there).
TEST_F(RelativesLoader, SampleFromAnchorAtTopLevel) {
  json c = config_of(kDSpark);
  c["sample_from_anchor"] = false;
  expect_error(load(kDSpark, c), StatusCode::kUnimplemented, {"sample_from_anchor"});
  c = config_of(kDSpark);
  c["sample_from_anchor"] = true;
  expect_same(outputs_of(kDSpark, c), outputs_of(kDSpark, config_of(kDSpark)),
              "DSpark, top-level sample_from_anchor true");
  c = config_of(kDSpark);
  c["sample_from_anchor"] = false;
  c["dflash_config"]["sample_from_anchor"] = true;  // dflash_config wins
  EXPECT_TRUE(load(kDSpark, c).ok());
  c = config_of(kDFlash);
  c["sample_from_anchor"] = true;
  expect_error(load(kDFlash, c), StatusCode::kUnimplemented, {"sample_from_anchor"});
  c = config_of(kDFlash);
  c["sample_from_anchor"] = false;
  EXPECT_TRUE(load(kDFlash, c).ok());
}

// DFlash2's conv_kernel_size, conv_group_size, selector_rank and selector_top_k: dflash_config
// first, then the top level (z-lab's reference). selector_top_k 8 (not the default 16) so that a
// key left unread changes the chain's rows.
TEST_F(RelativesLoader, DFlash2KeysAtTopLevel) {
  json golden = config_of(kDFlash2);
  golden["dflash_config"]["selector_top_k"] = 8;
  const Outputs want = outputs_of(kDFlash2, golden);
  json c = golden;
  for (const char* key :
       {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}) {
    c[key] = c["dflash_config"][key];
    c["dflash_config"].erase(key);
  }
  expect_same(outputs_of(kDFlash2, c, nullptr, "dflash2"), want, "DFlash2 keys at the top level");
  // Without architectures the registry finds the family by those keys there too.
  json no_arch = c;
  no_arch.erase("architectures");
  expect_same(outputs_of(kDFlash2, no_arch, nullptr, "dflash2"), want, "no architectures");
  // Read, not defaulted: the default top-k gives other rows.
  json d16 = c;
  d16.erase("selector_top_k");
  EXPECT_NE(outputs_of(kDFlash2, d16).rows, want.rows);
  // dflash_config wins over the top level.
  c["dflash_config"]["selector_rank"] = 8;
  c["selector_rank"] = 4;
  EXPECT_TRUE(load(kDFlash2, c).ok());
  // Absent in both: the error names the key.
  c.erase("conv_group_size");
  expect_error(load(kDFlash2, c), StatusCode::kInvalidArgument, {"conv_group_size"});
}

// confidence_head_with_markov absent (SpecForge / vLLM / speculators default it to false): the
// width of confidence_head.proj.weight decides, [1, H + r] -> true, [1, H] -> false.
TEST_F(RelativesLoader, ConfidenceWithMarkovFromShape) {
  const json golden = config_of(kDSpark);
  json c = golden;
  c["dflash_config"].erase("confidence_head_with_markov");
  expect_same(outputs_of(kDSpark, c), outputs_of(kDSpark, golden), "absent, [1, H + r]");

  const int64_t H = target_->config().hidden_size;
  auto narrow = [H](io::TensorToWrite& t) {  // the first H columns of the [1, H + r] row
    if (t.name == "confidence_head.proj.weight") t.shape = {1, H};
  };
  json explicit_false = golden;
  explicit_false["dflash_config"]["confidence_head_with_markov"] = false;
  const Outputs want = outputs_of(kDSpark, explicit_false, narrow);
  ASSERT_EQ(want.survival.size(), 7u);
  expect_same(outputs_of(kDSpark, c, narrow), want, "absent, [1, H]");
  // The other width's survival differs, so the inference is what the test sees.
  EXPECT_NE(outputs_of(kDSpark, golden).survival, want.survival);

  // Neither width: an error naming the tensor.
  std::vector<float> wide(static_cast<size_t>(H + 3), 0.5f);
  expect_error(load(kDSpark, c,
                    [&](io::TensorToWrite& t) {
                      if (t.name == "confidence_head.proj.weight") {
                        t.dtype = DType::kF32;
                        t.shape = {1, H + 3};
                        t.data = wide.data();
                      }
                    }),
               StatusCode::kInvalidArgument,
               {"confidence_head.proj.weight", "confidence_head_with_markov"});
}

// logit_scale != 1 is refused by every DFlash-format family (never silently ignored); 1 loads.
TEST_F(RelativesLoader, LogitScaleRefused) {
  for (const std::string& src : {kDSpark, kDFlash2, kDFlash}) {
    json c = config_of(src);
    c["logit_scale"] = 2.0;
    expect_error(load(src, c), StatusCode::kUnimplemented, {"logit_scale"});
    c = config_of(src);
    c["dflash_config"]["logit_scale"] = 0.5;
    expect_error(load(src, c), StatusCode::kUnimplemented, {"logit_scale"});
    c = config_of(src);
    c["logit_scale"] = 1.0;
    EXPECT_TRUE(load(src, c).ok()) << src;
  }
}

// mask_embedding.pt (a torch pickle replacing embed_tokens[mask_token_id] in vLLM's qwen3_dflash)
// cannot be read: DFlash and DFlash2 refuse it naming the file; DSpark ignores it, as vLLM's
// qwen3_dspark does, and drafts exactly as without it.
TEST_F(RelativesLoader, MaskEmbeddingFile) {
  const Outputs plain = outputs_of(kDSpark, config_of(kDSpark));
  std::ofstream(dir_ / "mask_embedding.pt") << "not a real pickle";
  for (const std::string& src : {kDFlash, kDFlash2}) {
    expect_error(load(src, config_of(src)), StatusCode::kUnimplemented,
                 {"mask_embedding.pt", "mask_token_id"});
  }
  expect_same(outputs_of(kDSpark, config_of(kDSpark)), plain, "dspark with mask_embedding.pt");
}

// add_swa_attention_sink_bias (vLLM: attention_sink_bias when that is absent) and
// attention_sink_bias are refused when true, in dflash_config or at the top level; false loads.
TEST_F(RelativesLoader, AttentionSinkKeysRefused) {
  for (const std::string& src : {kDFlash, kDFlash2, kDSpark}) {
    for (const char* key : {"add_swa_attention_sink_bias", "attention_sink_bias"}) {
      json c = config_of(src);
      c[key] = true;
      expect_error(load(src, c), StatusCode::kUnimplemented, {key});
      c = config_of(src);
      c["dflash_config"][key] = true;
      expect_error(load(src, c), StatusCode::kUnimplemented, {key});
      c = config_of(src);
      c[key] = false;
      c["dflash_config"][key] = false;
      EXPECT_TRUE(load(src, c).ok()) << src << " " << key;
    }
  }
}

// is_neox_style false (vLLM: interleaved GPT-J RoPE) is refused in either place; true (blockspec's
// rotate-half RoPE) gives the same drafts as the key absent.
TEST_F(RelativesLoader, NeoxStyleFalseRefused) {
  for (const std::string& src : {kDFlash, kDFlash2, kDSpark}) {
    json c = config_of(src);
    c["is_neox_style"] = false;
    expect_error(load(src, c), StatusCode::kUnimplemented, {"is_neox_style"});
    c = config_of(src);
    c["dflash_config"]["is_neox_style"] = false;
    expect_error(load(src, c), StatusCode::kUnimplemented, {"is_neox_style"});
    const Outputs plain = outputs_of(src, config_of(src));
    c = config_of(src);
    c["is_neox_style"] = true;
    c["dflash_config"]["is_neox_style"] = true;
    expect_same(outputs_of(src, c), plain, src + " with is_neox_style true");
  }
}

// Without target_layer_ids, the other trainers' tap keys are refused naming the alias (their
// index conventions differ, so the taps are not guessed); with target_layer_ids they are ignored.
TEST_F(RelativesLoader, LayerTapAliasesNeedTargetLayerIds) {
  for (const std::string& src : {kDFlash, kDFlash2, kDSpark}) {
    for (const char* alias : {"dspark_target_layer_ids", "eagle_aux_hidden_state_layer_ids"}) {
      json c = config_of(src);
      c["dflash_config"][alias] = c["dflash_config"]["target_layer_ids"];
      c["dflash_config"].erase("target_layer_ids");
      expect_error(load(src, c), StatusCode::kInvalidArgument, {alias, "target_layer_ids"});
      c = config_of(src);
      c[alias] = c["dflash_config"]["target_layer_ids"];
      c["dflash_config"].erase("target_layer_ids");
      expect_error(load(src, c), StatusCode::kInvalidArgument, {alias, "target_layer_ids"});
      const Outputs plain = outputs_of(src, config_of(src));
      c = config_of(src);
      c[alias] = json::array({0, 4, 2});
      c["dflash_config"][alias] = json::array({0, 4, 2});
      expect_same(outputs_of(src, c), plain, src + " with " + alias + " beside target_layer_ids");
    }
  }
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
