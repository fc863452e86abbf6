// engine/logit_processing's rules, step after step, against the rule written out naively
// (tests/naive_logit_rules.h: every vocabulary entry, counts recounted from the output so far):
// random prompts, penalties, logit_bias (zero and repeated entries included), min_tokens with
// stop ids (one outside the vocabulary), output carried over a preemption (generated_prefix),
// steps committing one to three tokens, and blocks of rows whose later rows also count the
// block's own tokens. The rules are kept from step to step (not rebuilt), so this is what shows
// that what a step hands out is still the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/logit_rules.h"
#include "engine/logit_processing.h"
#include "naive_logit_rules.h"

namespace bs {
namespace {

constexpr int32_t kVocab = 48;

// The naive rule for row r of a block: penalties over prompt and output (G then the block's
// first r inputs after its anchor), stop ids forbidden while min_tokens is not reached.
std::vector<float> naive_row(std::vector<float> logits, const std::vector<int32_t>& prompt,
                             std::vector<int32_t> output, const std::vector<int32_t>& extra,
                             const GenerateOptions& o) {
  output.insert(output.end(), extra.begin(), extra.end());
  test_util::naive_penalize(logits, prompt, output, o.sampling);
  if (std::ssize(output) < o.sampling.min_tokens) {
    for (int32_t t : o.stop_ids) {
      if (t >= 0 && t < kVocab) logits[static_cast<size_t>(t)] = -INFINITY;
    }
  }
  return logits;
}

TEST(LogitProcessingRules, EveryStepFollowsTheNaiveRule) {
  std::mt19937 rng(7);
  auto token = [&] { return static_cast<int32_t>(rng() % kVocab); };
  auto uniform = [&](float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(rng);
  };
  int checked = 0, changed = 0;
  for (int scenario = 0; scenario < 300; ++scenario) {
    GenerateOptions o;
    const float reps[] = {1.0f, 1.3f, 0.8f};
    o.sampling.repetition_penalty = reps[rng() % 3];
    o.sampling.frequency_penalty = rng() % 2 ? uniform(-1.0f, 1.0f) : 0.0f;
    o.sampling.presence_penalty = rng() % 2 ? uniform(-1.0f, 1.0f) : 0.0f;
    o.sampling.min_tokens = static_cast<int64_t>(rng() % 6);
    const int biases = static_cast<int>(rng() % 4);
    for (int i = 0; i < biases; ++i) {  // distinct tokens, as a JSON object gives them
      const int32_t t = token();
      if (std::ranges::find(o.sampling.logit_bias, t, [](const auto& e) { return e.first; }) ==
          o.sampling.logit_bias.end()) {
        o.sampling.logit_bias.push_back({t, rng() % 4 == 0 ? 0.0f : uniform(-5.0f, 5.0f)});
      }
    }
    o.stop_ids = {kVocab - 1, kVocab + 3};  // the second outside the vocabulary
    if (!o.sampling.processes_logits()) continue;
    std::vector<int32_t> prompt(rng() % 30);
    for (int32_t& t : prompt) t = token();
    o.generated_prefix = prompt.empty() ? 0 : static_cast<int64_t>(rng() % (prompt.size() + 1));
    // The naive rule's prompt and output so far (a preempted sequence's earlier output counts).
    const std::vector<int32_t> head(prompt.begin(), prompt.end() - o.generated_prefix);
    const std::vector<int32_t> before(prompt.end() - o.generated_prefix, prompt.end());

    detail::LogitProcessing rules(o, prompt);
    ASSERT_TRUE(rules.active());
    std::vector<int32_t> committed;
    for (int step = 0; step < 12; ++step) {
      const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
      std::vector<int32_t> block(static_cast<size_t>(rows));  // the block's inputs (anchor first)
      for (int32_t& t : block) t = token();
      std::vector<sampling::LogitRules> out;
      rules.add_rules(committed, /*first_row=*/5, rows, &out);
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].first_row, 5);
      EXPECT_EQ(out[0].rows, rows);
      std::vector<int32_t> output = before;
      output.insert(output.end(), committed.begin(), committed.end());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> logits(kVocab);
        for (float& x : logits) x = uniform(-8.0f, 8.0f);
        const std::vector<int32_t> extra(block.begin() + 1, block.begin() + 1 + r);
        const std::vector<float> want = naive_row(logits, head, output, extra, o);
        std::vector<float> got = logits;
        sampling::apply_logit_rules(got, r, out[0], extra);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "scenario " << scenario << " step " << step << " row " << r;
        ++checked;
        changed += got != logits;
      }
      const int64_t commit = 1 + static_cast<int64_t>(rng() % 3);
      for (int64_t i = 0; i < commit; ++i) committed.push_back(token());
    }
  }
  EXPECT_GT(checked, 5000);
  EXPECT_GT(changed, checked / 2);  // the rules did change most rows
}

// The rules handed out are sorted by token, one entry each (what the CPU rule's lookup and the
// CUDA kernel rely on), after long prompts and many steps.
TEST(LogitProcessingRules, TokensStaySortedAndUnique) {
  GenerateOptions o;
  o.sampling.repetition_penalty = 1.2f;
  o.sampling.min_tokens = 3;
  o.stop_ids = {0, 7};
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(5000), committed;
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 151936);
  detail::LogitProcessing rules(o, prompt);
  for (int step = 0; step < 200; ++step) {
    committed.push_back(static_cast<int32_t>(rng() % 151936));
    std::vector<sampling::LogitRules> out;
    rules.add_rules(committed, 0, 1, &out);
    const auto& tokens = out[0].tokens;
    for (size_t i = 1; i < tokens.size(); ++i) {
      ASSERT_LT(tokens[i - 1].token, tokens[i].token) << "step " << step;
    }
    int64_t counted = 0;
    for (const auto& e : tokens) counted += e.count;
    EXPECT_EQ(counted, std::ssize(committed));
  }
}

}  // namespace
}  // namespace bs
