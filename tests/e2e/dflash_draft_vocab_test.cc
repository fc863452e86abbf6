// DFlash with a restricted draft vocabulary (a checkpoint that ships EAGLE-3 `d2t`): the draft
// logits are the full-vocabulary drafter's logits at the draft-vocabulary tokens and -inf
// elsewhere (the compact head is a copy of those LM-head rows, FP8 too with --drafter-fp8, or the
// drafter's own [draft_vocab, H] lm_head), so greedy drafts are the restricted argmax and the
// sampled proposal q is the softmax over the draft vocabulary only; speculative decoding stays
// lossless (greedy == plain; seeded sampled == the host reference). Bad d2t / draft_vocab_size
// input is an error naming the tensor or key; DSpark and DFlash2 refuse a restricted vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/sampling.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "host_speculative.h"
#include "io/json_file.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

using nlohmann::json;

const std::string kData = BS_TEST_DATA;
const std::string kBase = kData + "/dflash-stories260K";
constexpr int64_t kVocab = 512;

json config_of(const std::string& dir) {
  auto j = io::read_json_file(dir + "/config.json");
  EXPECT_TRUE(j.ok()) << j.status().message();
  return j.ok() ? *j : json::object();
}

class DFlashDraftVocab : public ::testing::Test {
 protected:
  void SetUp() override { test_util::load_stories("", &backend_, &target_, nullptr); }

  // dir/<name>: the base drafter with d2t of `hot` (dtype I64) and draft_vocab_size = its size.
  std::string d2t_drafter(const std::string& name, const std::vector<int32_t>& hot,
                          std::vector<io::TensorToWrite> extra = {}) {
    const std::string dir = tmp_.file(name);
    json c = config_of(kBase);
    c["draft_vocab_size"] = hot.size();
    d2t_.push_back(test_util::d2t_offsets(hot));
    extra.push_back({"d2t", DType::kI64, {static_cast<int64_t>(hot.size())}, d2t_.back().data()});
    test_util::write_drafter_variant(kBase, dir, c, std::move(extra));
    return dir;
  }

  std::unique_ptr<Drafter> load(const std::string& dir, DrafterOptions o = {}) {
    auto d = load_drafter(dir, *target_, o);
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(*d) : nullptr;
  }

  // The error of loading `dir`; its message must contain every string of `parts`.
  void expect_error(const std::string& dir, std::vector<std::string> parts) {
    auto d = load_drafter(dir, *target_, {});
    ASSERT_FALSE(d.ok()) << dir << " loaded; expected an error mentioning " << parts[0];
    for (const auto& p : parts) {
      EXPECT_NE(d.status().message().find(p), std::string::npos)
          << "'" << p << "' not in: " << d.status().message();
    }
  }

  // Prefill `prompt` with the drafter's taps, observe all but the last token, propose the
  // maximum number of drafts after it: the draft logits [max_drafts, V] on the host.
  std::vector<float> draft_logits(Drafter& d, const std::vector<int32_t>& prompt) {
    const int64_t P = static_cast<int64_t>(prompt.size()), B = d.block_size();
    const int64_t blocks = (P + B) / kKvBlockSize + 2;
    KvPool tkv = target_->make_kv_pool(blocks), dkv = d.make_kv_pool(blocks);
    BlockAllocator alloc(blocks);
    SequenceKv seq(alloc, kKvBlockSize);
    EXPECT_TRUE(seq.reserve(P + B).ok());
    EXPECT_TRUE(test_util::prefill_and_observe(*target_, d, prompt, seq, tkv, dkv).ok());
    Tensor logits;
    const Status st = d.propose(dkv,
                                {.anchor = prompt.back(),
                                 .anchor_pos = P - 1,
                                 .block_table = seq.block_table(),
                                 .num_drafts = d.max_drafts()},
                                &logits);
    EXPECT_TRUE(st.ok()) << st.message();
    return st.ok() ? backend_->to_host_f32(logits) : std::vector<float>();
  }

  // Restricted logits == the full drafter's at the draft-vocabulary columns, -inf elsewhere;
  // the restricted argmax (the greedy draft) is the full row's argmax over the draft vocabulary.
  void expect_restriction_of(const std::vector<float>& full, const std::vector<float>& restricted,
                             const std::vector<int32_t>& hot, const std::string& what) {
    ASSERT_EQ(full.size(), restricted.size()) << what;
    ASSERT_FALSE(full.empty()) << what;
    const std::set<int32_t> in(hot.begin(), hot.end());
    const int64_t rows = static_cast<int64_t>(full.size()) / kVocab;
    for (int64_t r = 0; r < rows; ++r) {
      const float* f = full.data() + r * kVocab;
      const float* x = restricted.data() + r * kVocab;
      int32_t want = -1;  // first maximum over the draft vocabulary (ascending ids)
      for (int32_t v = 0; v < kVocab; ++v) {
        if (in.count(v)) {
          EXPECT_NEAR(x[v], f[v], 1e-5f * (1.0f + std::fabs(f[v]))) << what << " row " << r;
          if (want < 0 || f[v] > f[want]) want = v;
        } else {
          EXPECT_EQ(x[v], -std::numeric_limits<float>::infinity()) << what << " row " << r;
        }
      }
      const int32_t got = static_cast<int32_t>(std::max_element(x, x + kVocab) - x);
      EXPECT_EQ(got, want) << what << " row " << r;
      EXPECT_TRUE(in.count(got)) << what << " row " << r;
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  test_util::TempDir tmp_;
  std::vector<std::vector<int64_t>> d2t_;  // storage of the d2t tensors written
};

TEST_F(DFlashDraftVocab, LogitsAreTheFullHeadsDraftVocabularyColumns) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab(/*shuffled=*/true);
  auto full = load(kBase);
  auto dv = load(d2t_drafter("dv", hot));
  ASSERT_TRUE(full && dv);
  for (const auto& prompt : test_util::kStoryPrompts) {
    if (prompt.size() < 2) continue;
    expect_restriction_of(draft_logits(*full, prompt), draft_logits(*dv, prompt), hot,
                          fmt::format("prompt of {}", prompt.size()));
  }
}

// FP8 drafter weights: the compact head is the FP8 copy of the same rows (one scale per row), so
// it matches the FP8 full-vocabulary drafter at those columns.
TEST_F(DFlashDraftVocab, Fp8CompactHeadIsTheFp8FullHeadsRows) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab();
  auto full = load(kBase, {.fp8_weights = true});
  auto dv = load(d2t_drafter("dv", hot), {.fp8_weights = true});
  ASSERT_TRUE(full && dv);
  const auto& prompt = test_util::kStoryPrompts[3];
  expect_restriction_of(draft_logits(*full, prompt), draft_logits(*dv, prompt), hot, "fp8");
}

// A drafter that ships its own lm_head of draft_vocab rows (in draft-id order) uses it as is.
TEST_F(DFlashDraftVocab, OwnCompactLmHead) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab(/*shuffled=*/true);
  const std::vector<float> lm = backend_->to_host_f32(target_->lm_head());  // [V, H]
  const int64_t H = static_cast<int64_t>(lm.size()) / kVocab;
  std::vector<float> rows;
  for (int32_t t : hot) rows.insert(rows.end(), lm.begin() + t * H, lm.begin() + (t + 1) * H);
  auto full = load(kBase);
  auto own = load(d2t_drafter(
      "own", hot,
      {{"lm_head.weight", DType::kF32, {static_cast<int64_t>(hot.size()), H}, rows.data()}}));
  ASSERT_TRUE(full && own);
  const auto& prompt = test_util::kStoryPrompts[2];
  expect_restriction_of(draft_logits(*full, prompt), draft_logits(*own, prompt), hot, "own head");
}

TEST_F(DFlashDraftVocab, GreedySpeculativeEqualsPlain) {
  auto dv = load(d2t_drafter("dv", test_util::stories_draft_vocab()));
  ASSERT_TRUE(dv);
  for (const auto& prompt : test_util::kStoryPrompts) {
    GenerateOptions o;
    o.max_tokens = 60;
    o.stop_ids = {2};
    auto plain = generate_plain(*target_, prompt, o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    for (int64_t dt : {3, 0}) {  // 0: the drafter's maximum
      o.draft_tokens = dt;
      GenerateStats st;
      auto spec = generate_speculative(*target_, *dv, prompt, o, nullptr, &st);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      EXPECT_EQ(*spec, *plain) << "prompt of " << prompt.size() << ", draft_tokens " << dt;
      EXPECT_GT(st.drafted, 0);
    }
  }
}

// T > 0: the proposal q of a draft row (the sampler's filtered distribution of the drafter's
// logits) is the full drafter's softmax renormalised over the draft vocabulary and exactly 0
// outside it; seeded sampled speculative decoding gives the host reference's tokens.
TEST_F(DFlashDraftVocab, SampledProposalIsTheDraftVocabularySoftmax) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab();
  const std::set<int32_t> in(hot.begin(), hot.end());
  auto full = load(kBase);
  auto dv = load(d2t_drafter("dv", hot));
  ASSERT_TRUE(full && dv);
  const auto& prompt = test_util::kStoryPrompts[1];
  const std::vector<float> f = draft_logits(*full, prompt), x = draft_logits(*dv, prompt);
  ASSERT_EQ(f.size(), x.size());
  const float T = 0.7f;
  std::vector<float> q(kVocab);
  for (int64_t r = 0; r < static_cast<int64_t>(x.size()) / kVocab; ++r) {
    sampling::filtered_probs({x.data() + r * kVocab, static_cast<size_t>(kVocab)},
                             {.temperature = T}, q);
    // Reference: exp(f / T) over the draft vocabulary, normalised (double).
    double m = -INFINITY, z = 0;
    for (int32_t v : hot) m = std::max<double>(m, f[r * kVocab + v]);
    for (int32_t v : hot) z += std::exp((f[r * kVocab + v] - m) / T);
    double mass = 0;
    for (int32_t v = 0; v < kVocab; ++v) {
      if (!in.count(v)) {
        EXPECT_EQ(q[v], 0.0f) << "row " << r << " token " << v;
        continue;
      }
      const double want = std::exp((f[r * kVocab + v] - m) / T) / z;
      EXPECT_NEAR(q[v], want, 1e-5 + 1e-4 * want) << "row " << r << " token " << v;
      mass += q[v];
    }
    EXPECT_NEAR(mass, 1.0, 1e-5);
  }
  for (const SamplingParams& s : {SamplingParams{.temperature = 0.8f, .seed = 3},
                                  SamplingParams{.temperature = 1.0f, .top_k = 20, .seed = 9}}) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_ids = {2};
    o.sampling = s;
    for (const auto& p : test_util::kStoryPrompts) {
      auto spec = generate_speculative(*target_, *dv, p, o, nullptr, nullptr);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      EXPECT_EQ(*spec, test_util::host_speculative(*target_, *dv, p, o));
    }
  }
}

// draft_vocab_size may sit in dflash_config too (it wins over the top level).
TEST_F(DFlashDraftVocab, DraftVocabSizeInDflashConfig) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab();
  std::vector<int64_t> d2t = test_util::d2t_offsets(hot);
  json c = config_of(kBase);
  c["dflash_config"]["draft_vocab_size"] = 128;
  c["draft_vocab_size"] = 64;
  const std::string dir = tmp_.file("nested");
  test_util::write_drafter_variant(kBase, dir, c, {{"d2t", DType::kI64, {128}, d2t.data()}});
  auto full = load(kBase);
  auto dv = load(dir);
  ASSERT_TRUE(full && dv);
  const auto& prompt = test_util::kStoryPrompts[3];
  expect_restriction_of(draft_logits(*full, prompt), draft_logits(*dv, prompt), hot, "nested");
}

// Trainers save d2t = zeros of vocab_size when they did not restrict the vocabulary.
TEST_F(DFlashDraftVocab, ZeroD2tOfFullLengthIsUnrestricted) {
  std::vector<int64_t> zeros(kVocab, 0);
  const std::string dir = tmp_.file("zeros");
  test_util::write_drafter_variant(kBase, dir, config_of(kBase),
                                   {{"d2t", DType::kI64, {kVocab}, zeros.data()}});
  auto full = load(kBase);
  auto z = load(dir);
  ASSERT_TRUE(full && z);
  const auto& prompt = test_util::kStoryPrompts[3];
  EXPECT_EQ(draft_logits(*full, prompt), draft_logits(*z, prompt));
}

TEST_F(DFlashDraftVocab, BadInputNamesTheTensorOrKey) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab();
  std::vector<int64_t> d2t = test_util::d2t_offsets(hot);
  json c = config_of(kBase);
  c["draft_vocab_size"] = 128;
  auto variant = [&](const std::string& name, const json& config,
                     std::vector<io::TensorToWrite> extra, std::vector<std::string> drop = {}) {
    const std::string dir = tmp_.file(name);
    test_util::write_drafter_variant(kBase, dir, config, std::move(extra), drop);
    return dir;
  };
  // Wrong dtype.
  std::vector<float> f32(128, 0.0f);
  expect_error(variant("f32", c, {{"d2t", DType::kF32, {128}, f32.data()}}), {"'d2t'", "dtype"});
  // Wrong length for draft_vocab_size.
  expect_error(variant("short", c, {{"d2t", DType::kI64, {100}, d2t.data()}}),
               {"'d2t'", "[100]", "draft_vocab_size = 128"});
  // A target id out of range, and one twice.
  std::vector<int64_t> bad = d2t;
  bad[5] = 10000;
  expect_error(variant("range", c, {{"d2t", DType::kI64, {128}, bad.data()}}),
               {"'d2t'", "draft vocabulary", "entry 5"});
  bad = d2t;
  bad[5] = hot[4] - 5;
  expect_error(variant("dup", c, {{"d2t", DType::kI64, {128}, bad.data()}}),
               {"'d2t'", "draft vocabulary", "entry 5"});
  bad = d2t;
  bad[0] = -1;
  expect_error(variant("negative", c, {{"d2t", DType::kI64, {128}, bad.data()}}),
               {"'d2t'", "entry 0 is -1"});
  // draft_vocab_size without d2t; d2t without draft_vocab_size.
  expect_error(variant("no_d2t", c, {}), {"draft_vocab_size 128", "'d2t'"});
  expect_error(variant("no_size", config_of(kBase), {{"d2t", DType::kI64, {128}, d2t.data()}}),
               {"'d2t'", "draft_vocab_size"});
  // draft_vocab_size out of range.
  for (int64_t v : {int64_t{0}, int64_t{-3}, kVocab + 1}) {
    json cv = c;
    cv["draft_vocab_size"] = v;
    expect_error(variant(fmt::format("size{}", v), cv, {{"d2t", DType::kI64, {128}, d2t.data()}}),
                 {"'draft_vocab_size'", std::to_string(v)});
  }
  // An own lm_head with neither vocab_size nor draft_vocab_size rows.
  std::vector<float> head(100 * 64, 0.0f);
  expect_error(variant("head", c,
                       {{"d2t", DType::kI64, {128}, d2t.data()},
                        {"lm_head.weight", DType::kF32, {100, 64}, head.data()}}),
               {"lm_head.weight", "draft_vocab_size"});
}

// DSpark's Markov bias and DFlash2's candidate codebooks are indexed by target ids over the whole
// vocabulary (DFlash2 needs the full vocabulary): a restricted one is refused, naming d2t.
TEST_F(DFlashDraftVocab, RelativesRefuseARestrictedVocabulary) {
  const std::vector<int32_t> hot = test_util::stories_draft_vocab();
  std::vector<int64_t> d2t = test_util::d2t_offsets(hot);
  for (const char* family : {"dspark", "dflash2"}) {
    const std::string src = kData + "/" + family + "-stories260K";
    json c = config_of(src);
    c["draft_vocab_size"] = 128;
    const std::string dir = tmp_.file(family);
    test_util::write_drafter_variant(src, dir, c, {{"d2t", DType::kI64, {128}, d2t.data()}});
    auto d = load_drafter(dir, *target_, {});
    ASSERT_FALSE(d.ok()) << family;
    EXPECT_EQ(d.status().code(), StatusCode::kUnimplemented) << d.status().message();
    for (const std::string& part : {std::string("'d2t'"), std::string(family)}) {
      EXPECT_NE(d.status().message().find(part), std::string::npos)
          << "'" << part << "' not in: " << d.status().message();
    }
  }
}

}  // namespace
}  // namespace bs
