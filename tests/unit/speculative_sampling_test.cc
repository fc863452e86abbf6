// The acceptance rule of speculative decoding: greedy prefix matching, and rejection sampling,
// which must leave the output distribution exactly the target sampler's.
//
// Statistical tests use fixed seeds (so they are deterministic) and a chi-square goodness-of-fit
// test against the exact distribution; each fails only when p < 1e-4, so a correct implementation
// would trip a given test for 1 seed set in 10,000 (false-alarm rate 1e-4 per test). A biased rule
// (e.g. accepting on u < q/p, or drawing corrections from p instead of the residual) gives
// p-values far below that at these sample sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "chi_square.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative_accept.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "naive_logit_rules.h"
#include "test_util.h"

namespace bs {
namespace {

const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_TEST_DATA) + "/dflash-stories260K";
using test_util::chi2_pvalue;
using test_util::goodness_of_fit;
using test_util::kAlpha;

TEST(ChiSquare, KnownQuantiles) {
  EXPECT_NEAR(chi2_pvalue(3.841459, 1), 0.05, 1e-6);
  EXPECT_NEAR(chi2_pvalue(23.209251, 10), 0.01, 1e-6);
  EXPECT_NEAR(chi2_pvalue(124.342, 100), 0.05, 1e-4);
  EXPECT_NEAR(chi2_pvalue(2.0, 4), 0.7357589, 1e-6);
}

// ---- Hand-made p / q. ----

TEST(AcceptGreedy, LongestMatchingPrefixPlusTargetToken) {
  const std::vector<int32_t> drafts = {5, 6, 7};
  auto r = accept_greedy(drafts, std::vector<int32_t>{5, 6, 9, 3});
  EXPECT_EQ(r.accepted, 2);
  EXPECT_EQ(r.next, 9);  // the target's correction at the first mismatch
  r = accept_greedy(drafts, std::vector<int32_t>{5, 6, 7, 3});
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(r.next, 3);  // bonus from the last row
  r = accept_greedy(drafts, std::vector<int32_t>{1, 6, 7, 3});
  EXPECT_EQ(r.accepted, 0);  // a later match does not count after a mismatch
  EXPECT_EQ(r.next, 1);
  r = accept_greedy({}, std::vector<int32_t>{4});
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next, 4);
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  return p;
}

TEST(AcceptSampled, EqualDistributionsAlwaysAccept) {
  const int64_t V = 4;
  const std::vector<float> row = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> q, p;
  for (int i = 0; i < 3; ++i) q.insert(q.end(), row.begin(), row.end());
  for (int i = 0; i < 4; ++i) p.insert(p.end(), row.begin(), row.end());
  Sampler sampler(seeded(1));
  for (int t = 0; t < 1000; ++t) {
    std::vector<int32_t> d = {sampler.sample_from(row), sampler.sample_from(row),
                              sampler.sample_from(row)};
    const auto r = accept_sampled(d, q, p, V, sampler);
    ASSERT_EQ(r.accepted, 3);
  }
}

TEST(AcceptSampled, ZeroTargetProbabilityAlwaysRejects) {
  const int64_t V = 3;
  const std::vector<float> q = {0.0f, 1.0f, 0.0f};                    // always drafts token 1
  const std::vector<float> p = {0.5f, 0.0f, 0.5f, 0.2f, 0.3f, 0.5f};  // target never says 1
  Sampler sampler(seeded(2));
  std::map<int32_t, int64_t> counts;
  const int64_t n = 20000;
  for (int64_t t = 0; t < n; ++t) {
    const auto r = accept_sampled(std::vector<int32_t>{1}, q, p, V, sampler);
    ASSERT_EQ(r.accepted, 0);
    ++counts[r.next];
  }
  std::string detail;
  const std::map<int32_t, double> want = {{0, 0.5}, {2, 0.5}};  // residual = p here
  EXPECT_GT(goodness_of_fit(counts, want, n, &detail), kAlpha) << detail;
}

// The first committed token is distributed as p_0 and, given that the first draft was accepted,
// the second as p_1, for drafts drawn from quite different q.
TEST(AcceptSampled, OutputDistributionIsTheTargets) {
  const int64_t V = 5;
  const std::vector<float> q0 = {0.40f, 0.30f, 0.15f, 0.10f, 0.05f};
  const std::vector<float> q1 = {0.05f, 0.05f, 0.10f, 0.40f, 0.40f};
  const std::vector<float> p0 = {0.10f, 0.20f, 0.30f, 0.40f, 0.00f};
  const std::vector<float> p1 = {0.25f, 0.25f, 0.00f, 0.20f, 0.30f};
  const std::vector<float> p2 = {0.20f, 0.20f, 0.20f, 0.20f, 0.20f};
  std::vector<float> q = q0, p = p0;
  q.insert(q.end(), q1.begin(), q1.end());
  p.insert(p.end(), p1.begin(), p1.end());
  p.insert(p.end(), p2.begin(), p2.end());
  Sampler sampler(seeded(3));
  std::map<int32_t, int64_t> first, second;
  std::map<int64_t, int64_t> accepted;
  const int64_t n = 200000;
  int64_t n_second = 0;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t> d = {sampler.sample_from(q0), sampler.sample_from(q1)};
    const auto r = accept_sampled(d, q, p, V, sampler);
    ++accepted[r.accepted];
    ++first[r.accepted >= 1 ? d[0] : r.next];
    if (r.accepted >= 1) {
      ++second[r.accepted >= 2 ? d[1] : r.next];
      ++n_second;
    }
  }
  std::string detail;
  EXPECT_GT(goodness_of_fit(first, test_util::support(p0), n, &detail), kAlpha)
      << "first: " << detail;
  EXPECT_GT(goodness_of_fit(second, test_util::support(p1), n_second, &detail), kAlpha)
      << "second: " << detail;
  // Acceptance probability of the first draft = sum min(p0, q0) = 0.1+0.2+0.15+0.1+0 = 0.55.
  const double acc1 = 1.0 - static_cast<double>(accepted[0]) / static_cast<double>(n);
  EXPECT_NEAR(acc1, 0.55, 0.005);
}

// ---- End to end on stories260K: the joint distribution of the first three generated tokens. ----

class StoriesSampling : public ::testing::Test {
 protected:
  static constexpr int kTopK = 8;

  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto t = load_target(kStories, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    params_.temperature = 1.0f;
    params_.top_k = kTopK;
    compute_exact();
  }

  // Target logits after `tokens` (a fresh cache each time).
  std::vector<float> last_logits(const std::vector<int32_t>& tokens) {
    return test_util::forward_logits(*target_, tokens, 1);
  }

  // P(t1, t2, t3 | prompt) under the plain sampler (temperature 1, top-k 8).
  void compute_exact() {
    Sampler s(params_);
    std::vector<float> p1, p2, p3;
    // The distribution at each position: the logits processed (params_' penalties and bias,
    // written out naively) given the tokens drawn before it.
    const auto probs = [&](std::vector<float> logits, const std::vector<int32_t>& output,
                           std::vector<float>* p) {
      test_util::naive_penalize(logits, prompt_, output, params_);
      s.probs(logits, p);
    };
    probs(last_logits(prompt_), {}, &p1);
    for (int32_t a = 0; a < 512; ++a) {
      if (p1[a] == 0) continue;
      std::vector<int32_t> ctx = prompt_;
      ctx.push_back(a);
      after1_[a] = last_logits(ctx);
      probs(after1_[a], {a}, &p2);
      for (int32_t b = 0; b < 512; ++b) {
        if (p2[b] == 0) continue;
        ctx.push_back(b);
        after2_[{a, b}] = last_logits(ctx);
        probs(after2_[{a, b}], {a, b}, &p3);
        for (int32_t c = 0; c < 512; ++c) {
          if (p3[c] > 0) exact_[{a, b, c}] = static_cast<double>(p1[a]) * p2[b] * p3[c];
        }
        ctx.pop_back();
      }
    }
  }

  // Runs n seeded generations of 4 tokens (`drafter` null: plain) and tests the first three.
  // `batched`: all n as requests of one Scheduler decoding up to 8 at a time (the batched step),
  // else one generate_* each.
  void check(Drafter* drafter, int64_t n, int64_t draft_tokens, const std::string& what,
             bool batched = false) {
    std::map<std::array<int32_t, 3>, int64_t> counts;
    GenerateOptions o;
    o.max_tokens = 4;
    o.max_context = 32;
    o.sampling = params_;
    o.draft_tokens = draft_tokens;
    o.draft_confidence_min = confidence_min_;
    o.verify_budget = verify_budget_;
    int64_t steps = 0, accepted = 0;
    const auto count = [&](const std::vector<int32_t>& out, const GenerateStats& st) {
      ASSERT_EQ(out.size(), 4u);
      ++counts[{out[0], out[1], out[2]}];
      steps += st.steps;
      accepted += st.accepted;
    };
    // Batched runs take other seeds: a sample independent of the single-sequence one.
    const auto seed = [&](int64_t i) {
      return 1000003 * static_cast<uint64_t>(i) + (batched ? 29 : 17);
    };
    if (batched) {
      Scheduler scheduler(*target_, drafter,
                          {.max_num_seqs = 8, .max_context = 32, .step_time = step_time_});
      for (int64_t i = 0; i < n; ++i) {
        o.sampling.seed = seed(i);
        ASSERT_TRUE(scheduler
                        .add(static_cast<RequestId>(i), prompt_, o, nullptr,
                             [&](Completion c) {
                               ASSERT_TRUE(c.status.ok()) << c.status.message();
                               count(c.tokens, c.stats);
                             })
                        .ok());
      }
      while (!scheduler.idle()) ASSERT_TRUE(scheduler.step().ok());
    }
    for (int64_t i = 0; i < n && !batched; ++i) {
      o.sampling.seed = seed(i);
      GenerateStats st;
      auto out = drafter ? generate_speculative(*target_, *drafter, prompt_, o, nullptr, &st)
                         : generate_plain(*target_, prompt_, o, nullptr, &st);
      ASSERT_TRUE(out.ok()) << out.status().message();
      count(*out, st);
    }
    std::string detail;
    const double pv = goodness_of_fit(counts, exact_, n, &detail);
    EXPECT_GT(pv, kAlpha) << what << ": " << detail << ", p = " << pv;
    std::printf("%s: %lld runs, %lld verify steps, %lld drafts accepted; %s, p = %.3g\n",
                what.c_str(), static_cast<long long>(n), static_cast<long long>(steps),
                static_cast<long long>(accepted), detail.c_str(), pv);
    if (drafter) {
      RecordProperty(what + "_accepted_per_step",
                     std::to_string(static_cast<double>(accepted) / static_cast<double>(steps)));
      accepted_ = accepted;
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  SamplingParams params_;
  // A high-entropy context (random ids): ~170 cells of the joint expect >= 5 samples at n = 5000.
  const std::vector<int32_t> prompt_ = {1, 273, 185, 345};
  std::map<int32_t, std::vector<float>> after1_;                      // logits after prompt + t1
  std::map<std::pair<int32_t, int32_t>, std::vector<float>> after2_;  // after prompt + t1 t2
  std::map<std::array<int32_t, 3>, double> exact_;
  int64_t accepted_ = 0;
  double confidence_min_ = 0;  // GenerateOptions::draft_confidence_min of check()'s runs
  VerifyBudget verify_budget_ = VerifyBudget::kOff;  // GenerateOptions::verify_budget
  StepTimeModel step_time_;  // SchedulerOptions::step_time of the batched runs
};

// A drafter whose proposals overlap the target's (its logits are the target's own, perturbed) for
// the first step and are uninformative afterwards, so that acceptances, rejections, corrections
// and bonus tokens all occur.
class NearTargetDrafter final : public Drafter {
 public:
  NearTargetDrafter(Backend& backend, int64_t prompt_len,
                    const std::map<int32_t, std::vector<float>>& after1,
                    const std::map<std::pair<int32_t, int32_t>, std::vector<float>>& after2)
      : backend_(backend), prompt_len_(prompt_len), after1_(after1), after2_(after2) {}
  std::string family() const override { return "near-target"; }
  int64_t block_size() const override { return 4; }
  int64_t max_drafts() const override { return 3; }
  const std::vector<int>& target_layers() const override { return layers_; }
  KvPool make_kv_pool(int64_t num_blocks) override { return KvPool{.num_blocks = num_blocks}; }
  Status observe(KvPool&, std::span<const int32_t>, const Tensor&, int64_t) override {
    return Status::Ok();
  }
  Status propose(KvPool&, const ProposeRequest& req, Tensor* logits) override {
    const int64_t V = 512;
    std::vector<float> host(static_cast<size_t>(req.num_drafts * V), 0.0f);
    auto it = after1_.find(req.anchor);
    if (req.anchor_pos == prompt_len_ && it != after1_.end()) {
      std::mt19937 rng(static_cast<uint32_t>(req.anchor));
      std::normal_distribution<float> noise(0.0f, 0.7f);
      const std::vector<float>* rows[2] = {&it->second, nullptr};
      const int32_t guess = argmax(it->second);
      auto it2 = after2_.find({req.anchor, guess});
      if (it2 != after2_.end()) rows[1] = &it2->second;
      for (int64_t j = 0; j < std::min<int64_t>(req.num_drafts, 2); ++j) {
        if (!rows[j]) continue;
        for (int64_t v = 0; v < V; ++v) host[j * V + v] = 0.8f * (*rows[j])[v] + noise(rng);
      }
    }
    buf_ = backend_.empty({req.num_drafts, V});
    backend_.copy_from_host(buf_, host.data());
    *logits = buf_;
    return Status::Ok();
  }

 private:
  Backend& backend_;
  int64_t prompt_len_;
  const std::map<int32_t, std::vector<float>>& after1_;
  const std::map<std::pair<int32_t, int32_t>, std::vector<float>>& after2_;
  std::vector<int> layers_ = {1};
  Tensor buf_;
};

TEST_F(StoriesSampling, PlainSamplerMatchesExactDistribution) {
  // Validates the harness itself: generate_plain against the exact joint distribution.
  check(nullptr, 2000, 0, "plain");
}

TEST_F(StoriesSampling, NearTargetDrafterLeavesDistributionUnchanged) {
  NearTargetDrafter drafter(*backend_, static_cast<int64_t>(prompt_.size()), after1_, after2_);
  check(&drafter, 5000, 3, "near_target");
  EXPECT_GT(accepted_, 5000 / 5) << "the drafter should get many drafts accepted";
}

TEST_F(StoriesSampling, RandomDFlashDrafterLeavesDistributionUnchanged) {
  auto drafter = load_drafter(kDrafter, *target_, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  check(drafter->get(), 2500, 7, "dflash");
}

// The DFlash relatives draw their own drafts (DSpark: Markov chain, q = filtered_probs(U + b);
// DFlash2: selector walk, q over the top-16 candidates): the random test drafters, one sequence at
// a time and batched, DSpark also with confidence cuts (the verified prefix depends on the drafts).
TEST_F(StoriesSampling, RandomDSparkAndDFlash2DraftersLeaveDistributionUnchanged) {
  for (const char* name : {"dspark-stories260K", "dflash2-stories260K"}) {
    auto drafter = load_drafter(std::string(BS_TEST_DATA) + "/" + name, *target_, {});
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    check(drafter->get(), 2500, 0, name);
    check(drafter->get(), 2500, 0, std::string(name) + "_batched", /*batched=*/true);
  }
}

// min-p shapes the target's distribution (top-k 8, then min-p 0.1 of the most likely token):
// plain sampling draws it, and speculative sampling keeps it with a drafter near the target (many
// drafts accepted), the random DFlash drafter (drafts drawn from its logits under the same filter)
// and the random DFlash2 drafter (whose candidate walk proposes without min-p:
// device_sampling.cc).
TEST_F(StoriesSampling, MinPDistributionIsKeptBySpeculativeSampling) {
  params_.min_p = 0.1f;
  const size_t cells_top_k = exact_.size();
  after1_.clear();
  after2_.clear();
  exact_.clear();
  compute_exact();
  ASSERT_LT(exact_.size(), cells_top_k) << "min-p 0.1 should drop some of top-k 8's tokens";
  check(nullptr, 2000, 0, "plain_min_p");
  NearTargetDrafter near(*backend_, static_cast<int64_t>(prompt_.size()), after1_, after2_);
  check(&near, 5000, 3, "near_target_min_p");
  EXPECT_GT(accepted_, 5000 / 5) << "the drafter should get many drafts accepted";
  for (const std::string& dir : {kDrafter, std::string(BS_TEST_DATA) + "/dflash2-stories260K"}) {
    auto drafter = load_drafter(dir, *target_, {});
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    check(drafter->get(), 2500, 0, (*drafter)->family() + "_min_p");
  }
}

// Logits processing (presence / frequency / repetition penalties, a logit bias) shapes each
// position's distribution from the tokens drawn before it: a verify row must count the drafts
// before it as output. Plain sampling draws the processed joint law, and speculative sampling
// keeps it with the near-target drafter (many multi-draft acceptances) and the random drafters
// of every DFlash family (the relatives draw their own drafts), single and batched.
TEST_F(StoriesSampling, PenalizedDistributionIsKeptBySpeculativeSampling) {
  const std::map<std::array<int32_t, 3>, double> unpenalized = exact_;
  // Penalties that reward repeats (negative; a repetition penalty below 1), so that repeats
  // become likely and the counts matter: a random context rarely repeats a token otherwise.
  params_.presence_penalty = -2.0f;
  params_.frequency_penalty = -2.0f;
  params_.repetition_penalty = 0.5f;
  params_.logit_bias = {{273, 1.0f}};
  after1_.clear();
  after2_.clear();
  exact_.clear();
  compute_exact();
  double moved = 0;  // total variation distance from the unpenalized law
  for (const auto& [cell, p] : exact_) {
    const auto it = unpenalized.find(cell);
    moved += std::abs(p - (it == unpenalized.end() ? 0.0 : it->second)) / 2;
  }
  ASSERT_GT(moved, 0.05) << "the penalties should change the joint law";
  std::printf("penalized joint law: total variation %.3f from the unpenalized one\n", moved);
  check(nullptr, 2000, 0, "plain_penalized");
  NearTargetDrafter near(*backend_, static_cast<int64_t>(prompt_.size()), after1_, after2_);
  check(&near, 5000, 3, "near_target_penalized");
  EXPECT_GT(accepted_, 5000 / 5) << "the drafter should get many drafts accepted";
  check(&near, 5000, 3, "near_target_penalized_batched", /*batched=*/true);
  for (const char* name : {"dspark-stories260K", "dflash2-stories260K"}) {
    auto drafter = load_drafter(std::string(BS_TEST_DATA) + "/" + name, *target_, {});
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    check(drafter->get(), 2500, 0, std::string(name) + "_penalized");
  }
}

TEST_F(StoriesSampling, DSparkConfidenceCutLeavesDistributionUnchanged) {
  auto drafter = load_drafter(std::string(BS_TEST_DATA) + "/dspark-stories260K", *target_, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  confidence_min_ = 0.5;
  check(drafter->get(), 2500, 0, "dspark_cut_batched", /*batched=*/true);
}

// Random drafters rarely propose what the target samples, so the tests above mostly exercise the
// rejection branch. These two relatives propose close to the target, so that acceptances,
// corrections and bonus tokens all occur often:
//   DSpark "bigram": the random test drafter with its final norm scaled down (U ~ 0) and a
//     full-rank Markov head, W1 = I and W2[:, a] = the target's logits after [BOS, a]: each draft
//     is drawn from the target's next-token distribution given the previous draft alone, chained
//     left to right;
//   DFlash2 "identity": the shipped trained DFlash drafter with DFlash2's identity-initialised
//     convolutions (base[0] = 1, base[1] = 0, zero projection) and a small random selector, so its
//     drafts are the trained drafter's top-16, re-scored by the selector walk.
class RelativeSampling : public StoriesSampling {
 protected:
  std::string write(
      const std::string& name, const std::string& src, const nlohmann::json& config,
      const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& extra) {
    const std::string dir = ::testing::TempDir() + "/bs_" + name + "_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config.dump(2);
    auto ck = io::Checkpoint::open(src);
    EXPECT_TRUE(ck.ok()) << ck.status().message();
    std::vector<io::TensorToWrite> tensors;
    for (const auto& n : ck->names()) {
      if (extra.count(n)) continue;
      const io::TensorInfo* t = *ck->get(n);
      tensors.push_back({n, t->dtype, t->shape, t->data});
    }
    for (const auto& [n, v] : extra) tensors.push_back({n, DType::kF32, v.first, v.second.data()});
    EXPECT_TRUE(io::write_safetensors(dir + "/model.safetensors", tensors).ok());
    return dir;
  }

  using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;
  // The bigram DSpark's tensors (below): W1 = I, W2[:, a] = the target's logits after [BOS, a],
  // the final norm scaled down.
  Tensors bigram_markov() {
    std::vector<float> w1(512 * 512, 0.0f), w2(512 * 512), norm(64, 1e-3f);
    for (int32_t a = 0; a < 512; ++a) {
      w1[a * 512 + a] = 1.0f;
      const std::vector<float> l = last_logits({1, a});
      for (int32_t v = 0; v < 512; ++v) w2[v * 512 + a] = l[v];
    }
    return {{"markov_head.markov_w1.weight", {{512, 512}, w1}},
            {"markov_head.markov_w2.weight", {{512, 512}, w2}},
            {"norm.weight", {{64}, norm}}};
  }
};

TEST_F(RelativeSampling, BigramDSparkLeavesDistributionUnchanged) {
  const std::string src = std::string(BS_TEST_DATA) + "/dspark-stories260K";
  auto config = io::read_json_file(src + "/config.json");
  ASSERT_TRUE(config.ok());
  (*config)["dflash_config"]["markov_rank"] = 512;
  (*config)["dflash_config"]["enable_confidence_head"] = false;
  const std::string dir = write("dspark_bigram", src, *config, bigram_markov());
  auto drafter = load_drafter(dir, *target_, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  check(drafter->get(), 2500, 0, "dspark_bigram");
  EXPECT_GT(accepted_, 2500 / 4) << "the bigram drafter should get many drafts accepted";
  check(drafter->get(), 2500, 0, "dspark_bigram_batched", /*batched=*/true);
  EXPECT_GT(accepted_, 2500 / 4);
}

// Verify-length scheduling (engine/verify_budget.h) in batches of 8: the bigram DSpark drafter
// with a confidence head whose survival depends strongly on the previous draft (W1 = I, so the
// head's weight on W1[prev] is a random score per token), under a step-time curve that leaves
// room for about 4 drafts per step: which drafts are verified depends on the drafts themselves
// (through a_j, a function of drafts 1..j-1) and on the other sequences'; the rule's stop at the
// first drop of tokens per second keeps that non-anticipating, so the output law is the
// target's.
TEST_F(RelativeSampling, BigramDSparkUnderVerifyBudgetLeavesDistributionUnchanged) {
  const std::string src = std::string(BS_TEST_DATA) + "/dspark-stories260K";
  auto config = io::read_json_file(src + "/config.json");
  ASSERT_TRUE(config.ok());
  (*config)["dflash_config"]["markov_rank"] = 512;
  (*config)["dflash_config"]["enable_confidence_head"] = true;
  (*config)["dflash_config"]["confidence_head_with_markov"] = true;
  std::mt19937 rng(11);
  std::normal_distribution<float> score(0.0f, 2.0f);
  std::vector<float> proj(64 + 512, 0.0f);  // [h ; W1[prev]]: a random score per previous draft
  for (size_t i = 64; i < proj.size(); ++i) proj[i] = score(rng);
  Tensors tensors = bigram_markov();
  tensors["confidence_head.proj.weight"] = {{1, 64 + 512}, proj};
  tensors["confidence_head.proj.bias"] = {{1}, {1.0f}};
  const std::string dir = write("dspark_bigram_conf", src, *config, tensors);
  auto drafter = load_drafter(dir, *target_, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  ASSERT_TRUE((*drafter)->has_confidence());
  verify_budget_ = VerifyBudget::kAuto;
  // 1 s up to 12 rows (8 anchors + 4 drafts), then 0.3 s more per row.
  step_time_ = StepTimeModel({{12, 1.0}, {13, 1.3}, {64, 16.6}}, 0);
  check(drafter->get(), 2500, 0, "dspark_bigram_budget_batched", /*batched=*/true);
  EXPECT_GT(accepted_, 2500 / 4) << "the bigram drafter should get many drafts accepted";
}

TEST_F(RelativeSampling, IdentityDFlash2LeavesDistributionUnchanged) {
  const std::string src = std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash";
  auto config = io::read_json_file(src + "/config.json");
  ASSERT_TRUE(config.ok());
  (*config)["architectures"] = {"DFlash2DraftModel"};
  auto& d = (*config)["dflash_config"];
  d["conv_kernel_size"] = 2;
  d["conv_group_size"] = 16;
  d["selector_rank"] = 8;
  d["selector_top_k"] = 16;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> extra;
  std::vector<float> base(2 * 2 * 64, 0.0f);
  for (int s = 0; s < 2; ++s) std::fill_n(base.begin() + s * 2 * 64, 64, 1.0f);
  for (int l = 0; l < 2; ++l) {
    for (const char* sub : {"attention_conv", "mlp_conv"}) {
      const std::string p = "layers." + std::to_string(l) + "." + sub + ".";
      extra[p + "base_kernel"] = {{2, 2, 64}, base};
      extra[p + "kernel_projection.weight"] = {{16, 64}, std::vector<float>(16 * 64, 0.0f)};
    }
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.1f);
  auto random = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = n(rng);
    return v;
  };
  extra["candidate_selector.predecessor_codebook"] = {{512, 8}, random(512 * 8)};
  extra["candidate_selector.successor_codebook"] = {{512, 8}, random(512 * 8)};
  extra["candidate_selector.hidden_projection.weight"] = {{8, 64}, random(8 * 64)};
  const std::string dir = write("dflash2_identity", src, *config, extra);
  auto drafter = load_drafter(dir, *target_, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  check(drafter->get(), 2500, 0, "dflash2_identity");
  EXPECT_GT(accepted_, 2500 / 4) << "the identity DFlash2 drafter should get many drafts accepted";
  check(drafter->get(), 2500, 0, "dflash2_identity_batched", /*batched=*/true);
  EXPECT_GT(accepted_, 2500 / 4);
}

// The same through the Scheduler's batched step (sampled drafts drawn and accepted on the device
// for up to 8 sequences per step, each with its own sampler): the near-target drafter (one propose
// per sequence) and the shipped trained drafters (DFlash: one batched propose; FlashMap).
TEST_F(StoriesSampling, NearTargetDrafterInBatchesLeavesDistributionUnchanged) {
  NearTargetDrafter drafter(*backend_, static_cast<int64_t>(prompt_.size()), after1_, after2_);
  check(&drafter, 5000, 3, "near_target_batched", /*batched=*/true);
  EXPECT_GT(accepted_, 5000 / 5);
}

TEST_F(StoriesSampling, ShippedDrafterInBatchesLeavesDistributionUnchanged) {
  for (const char* name : {"stories260K-dflash", "stories260K-flashmap"}) {
    auto drafter = load_drafter(std::string(BS_SOURCE_DIR) + "/models/" + name, *target_, {});
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    check(drafter->get(), 2500, 0, std::string(name) + "_batched", /*batched=*/true);
  }
}

}  // namespace
}  // namespace bs
