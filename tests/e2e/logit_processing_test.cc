// Logits processing (presence / frequency / repetition penalties, logit_bias, min_tokens;
// backend/logit_rules.h) through the engine on stories260K:
//   - greedy plain decoding follows the rule written out here independently (a step-by-step
//     forward, the penalties applied by a naive loop over the vocabulary, the argmax);
//   - logit_bias +100 and min_tokens do what they say;
//   - greedy speculative decoding with every drafter family (the shipped trained drafters, which
//     get multi-draft blocks accepted, so a verify row's counts must include the drafts before it)
//     equals plain decoding token for token, one sequence at a time and batched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "naive_logit_rules.h"
#include "test_util.h"

namespace bs {
namespace {

class LogitProcessing : public ::testing::Test {
 protected:
  void SetUp() override { test_util::load_stories("", &backend_, &target_, nullptr); }

  std::vector<int32_t> plain(const std::vector<int32_t>& prompt, const GenerateOptions& o) {
    GenerateStats st;
    auto r = generate_plain(*target_, prompt, o, nullptr, &st);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::vector<int32_t>();
  }

  static GenerateOptions penalized() {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_ids = {2};
    o.sampling.presence_penalty = 1.0f;
    o.sampling.frequency_penalty = 1.5f;
    o.sampling.repetition_penalty = 1.8f;
    o.sampling.logit_bias = {{261, 1.5f}, {400, -2.0f}};
    o.sampling.min_tokens = 12;
    return o;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
};

TEST_F(LogitProcessing, GreedyPlainFollowsTheRule) {
  GenerateOptions o = penalized();
  o.stop_ids = {};  // (min_tokens has nothing to forbid: checked below)
  o.max_tokens = 20;
  GenerateOptions off = o;
  off.sampling = {};
  int changed = 0;  // prompts whose output the processing changes (else this proves little)
  for (const auto& prompt : test_util::kStoryPrompts) {
    std::vector<int32_t> want;
    for (int i = 0; i < o.max_tokens; ++i) {
      std::vector<int32_t> ctx = prompt;
      ctx.insert(ctx.end(), want.begin(), want.end());
      std::vector<float> logits = test_util::forward_logits(*target_, ctx, 1);
      test_util::naive_penalize(logits, prompt, want, o.sampling);
      want.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    EXPECT_EQ(plain(prompt, o), want);
    changed += plain(prompt, off) != want ? 1 : 0;
  }
  EXPECT_GE(changed, 3);
}

TEST_F(LogitProcessing, LogitBiasAndMinTokens) {
  GenerateOptions o;
  o.max_tokens = 10;
  o.stop_ids = {2};
  o.sampling.logit_bias = {{300, 100.0f}};  // +100: chosen every time
  EXPECT_EQ(plain({1}, o), std::vector<int32_t>(10, 300));
  o.sampling.logit_bias = {{2, 100.0f}};  // the stop token, forbidden for 5 tokens
  o.sampling.min_tokens = 5;
  const std::vector<int32_t> out = plain({1}, o);
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out.back(), 2);
  EXPECT_EQ(std::count(out.begin(), out.end(), 2), 1);
  o.sampling.logit_bias = {{300, -100.0f}};  // banned
  o.sampling.min_tokens = 0;
  o.max_tokens = 60;
  const std::vector<int32_t> banned = plain({1, 403, 407, 261, 378}, o);
  EXPECT_EQ(std::count(banned.begin(), banned.end(), 300), 0);
}

// Logprobs report the model's own distribution (vLLM's default): a +100 bias makes token 300 the
// choice every time, yet its logprob is the raw log-softmax at that position, computed here from
// a plain forward; speculative decoding reports the same values.
TEST_F(LogitProcessing, LogprobsAreTheRawModels) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  GenerateOptions o;
  o.max_tokens = 6;
  o.logprobs = 0;
  o.sampling.logit_bias = {{300, 100.0f}};
  o.sampling.frequency_penalty = 1.0f;
  std::vector<float> want;
  std::vector<int32_t> ctx = prompt;
  for (int i = 0; i < o.max_tokens; ++i) {
    const std::vector<float> x = test_util::forward_logits(*target_, ctx, 1);
    const float m = *std::max_element(x.begin(), x.end());
    double z = 0;
    for (float e : x) z += std::exp(static_cast<double>(e) - m);
    want.push_back(static_cast<float>(x[300] - m - std::log(z)));
    ctx.push_back(300);
  }
  ASSERT_LT(want[0], -1.0f) << "token 300 should be unlikely without the bias";
  auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash", *target_, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  for (const bool speculative : {false, true}) {
    std::vector<TokenLogprobs> got;
    const LogprobsCallback keep = [&](const TokenLogprobs& lp) { got.push_back(lp); };
    auto out = speculative ? generate_speculative(*target_, **d, prompt, o, nullptr, nullptr, keep)
                           : generate_plain(*target_, prompt, o, nullptr, nullptr, keep);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, std::vector<int32_t>(6, 300));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token, 300);
      EXPECT_NEAR(got[i].logprob, want[i], 1e-4)
          << "token " << i << ", speculative " << speculative;
    }
  }
}

TEST_F(LogitProcessing, OutOfRangeParametersAreRefused) {
  const std::vector<int32_t> kBos = {1};
  GenerateOptions o;
  o.sampling.logit_bias = {{512, 1.0f}};  // stories260K has 512 tokens
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
  o.sampling.logit_bias = {{5, 101.0f}};
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
  o.sampling.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
  o.sampling = {.presence_penalty = 2.5f};
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
  o.sampling = {.repetition_penalty = 0.0f};
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
  o.sampling = {.min_tokens = -1};
  EXPECT_FALSE(generate_plain(*target_, kBos, o, nullptr, nullptr).ok());
}

TEST_F(LogitProcessing, GreedySpeculativeEqualsPlainForEveryFamily) {
  const std::string models = std::string(BS_SOURCE_DIR) + "/models/";
  const GenerateOptions o = penalized();
  std::vector<std::vector<int32_t>> want;
  for (const auto& prompt : test_util::kStoryPrompts) want.push_back(plain(prompt, o));
  for (const char* name : {"stories260K-dflash", "stories260K-flashmap", "stories260K-dspark",
                           "stories260K-dflash2"}) {
    auto d = load_drafter(models + name, *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    int64_t multi = 0;  // steps that accepted 2 or more drafts
    for (size_t i = 0; i < want.size(); ++i) {
      GenerateStats st;
      auto got = generate_speculative(*target_, **d, test_util::kStoryPrompts[i], o, nullptr, &st);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(*got, want[i]) << name << ", prompt " << i;
      for (size_t k = 1; k < st.position_accepted.size(); ++k) multi += st.position_accepted[k];
    }
    EXPECT_GT(multi, 0) << name << ": no step accepted two drafts";
    std::vector<GenerateStats> stats;
    auto batch = generate_speculative_batch(*target_, **d, test_util::kStoryPrompts, o, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    EXPECT_EQ(*batch, want) << name << " (batched)";
  }
  auto plain_batch = generate_plain_batch(*target_, test_util::kStoryPrompts, o, nullptr);
  ASSERT_TRUE(plain_batch.ok()) << plain_batch.status().message();
  EXPECT_EQ(*plain_batch, want) << "plain batched";
}

}  // namespace
}  // namespace bs
