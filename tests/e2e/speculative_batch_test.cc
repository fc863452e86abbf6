// Batched speculative decoding: generate_speculative_batch gives every prompt exactly what
// generate_speculative gives it alone (tokens, finish reason, counts, acceptance statistics),
// greedy and sampled, while the sequences stop at different steps (stop token, max_tokens, the
// context window) and verify blocks of different sizes; greedy output also equals plain
// decoding (lossless). The shipped stories260K target with its trained DFlash and FlashMap
// drafters, so that long accepted runs occur.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

const std::vector<std::vector<int32_t>>& kPrompts = test_util::kStoryPrompts;

class SpeculativeBatch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { test_util::load_stories(GetParam(), &backend_, &target_, &drafter_); }

  // Runs the batch and every prompt alone; expects equal outputs and statistics. Returns the
  // batch's statistics.
  std::vector<GenerateStats> expect_batch_equals_single(const GenerateOptions& o,
                                                        const std::string& what) {
    std::vector<GenerateStats> stats;
    auto batch = generate_speculative_batch(*target_, *drafter_, kPrompts, o, &stats);
    EXPECT_TRUE(batch.ok()) << batch.status().message();
    if (!batch.ok()) return {};
    EXPECT_EQ(batch->size(), kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const std::string where = what + ", prompt " + std::to_string(i);
      GenerateStats alone;
      auto single = generate_speculative(*target_, *drafter_, kPrompts[i], o, nullptr, &alone);
      if (!single.ok()) {
        ADD_FAILURE() << where << ": " << single.status().message();
        return {};
      }
      EXPECT_EQ((*batch)[i], *single) << where;
      EXPECT_EQ(stats[i].finish, alone.finish) << where;
      EXPECT_EQ(stats[i].generated_tokens, alone.generated_tokens) << where;
      EXPECT_EQ(stats[i].prompt_tokens, alone.prompt_tokens) << where;
      EXPECT_EQ(stats[i].steps, alone.steps) << where;
      EXPECT_EQ(stats[i].drafted, alone.drafted) << where;
      EXPECT_EQ(stats[i].accepted, alone.accepted) << where;
      EXPECT_EQ(stats[i].position_offered, alone.position_offered) << where;
      EXPECT_EQ(stats[i].position_accepted, alone.position_accepted) << where;
      if (o.sampling.greedy()) {
        auto plain = generate_plain(*target_, kPrompts[i], o, nullptr, nullptr);
        EXPECT_TRUE(plain.ok() && (*batch)[i] == *plain) << where << " (plain)";
      }
    }
    return stats;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

bool any_finish(const std::vector<GenerateStats>& stats, FinishReason r) {
  return std::any_of(stats.begin(), stats.end(),
                     [&](const GenerateStats& s) { return s.finish == r; });
}

TEST_P(SpeculativeBatch, EqualsSingleSequence) {
  for (const float temperature : {0.0f, 0.8f}) {
    const std::string t = "T=" + std::to_string(temperature);
    GenerateOptions o;
    o.sampling.temperature = temperature;
    o.sampling.seed = 17;
    o.stop_ids = {2};

    // Natural ends: EOS or max_tokens.
    o.max_tokens = 60;
    const auto long_run = expect_batch_equals_single(o, t + " long");
    int64_t accepted = 0;  // a trained drafter: long accepted runs
    for (const auto& s : long_run) accepted += s.accepted;
    EXPECT_GT(accepted, 20) << t;

    // Few tokens and fewer drafts: k shrinks to the tokens left, blocks of unequal size.
    o.max_tokens = 7;
    o.draft_tokens = 4;
    const auto few = expect_batch_equals_single(o, t + " max_tokens 7");
    EXPECT_TRUE(any_finish(few, FinishReason::kLength)) << t;

    // A window the long prompt reaches first, and a stop token met mid-way by another prompt.
    o.max_tokens = 40;
    o.draft_tokens = 0;
    o.max_context = 30;
    auto probe = generate_speculative(*target_, *drafter_, kPrompts[1], o, nullptr, nullptr);
    ASSERT_TRUE(probe.ok() && probe->size() > 5);
    o.stop_ids = {2, (*probe)[5]};
    const auto mixed = expect_batch_equals_single(o, t + " window + stop");
    EXPECT_TRUE(any_finish(mixed, FinishReason::kContext)) << t;
    EXPECT_TRUE(any_finish(mixed, FinishReason::kStop)) << t;
  }
}

TEST_P(SpeculativeBatch, BadInput) {
  GenerateOptions o;
  o.max_tokens = 4;
  EXPECT_FALSE(generate_speculative_batch(*target_, *drafter_, {}, o, nullptr).ok());

  std::vector<std::vector<int32_t>> bad = kPrompts;
  bad[2][1] = static_cast<int32_t>(target_->config().vocab_size);
  auto r = generate_speculative_batch(*target_, *drafter_, bad, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prompt 2"), std::string::npos) << r.status().message();
  bad[2] = {};
  r = generate_speculative_batch(*target_, *drafter_, bad, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prompt 2"), std::string::npos) << r.status().message();

  GenerateOptions too_many = o;
  too_many.draft_tokens = drafter_->max_drafts() + 1;
  r = generate_speculative_batch(*target_, *drafter_, kPrompts, too_many, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("draft_tokens"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("prompt 0"), std::string::npos) << r.status().message();

  GenerateOptions traced = o;
  traced.trace_path = "/dev/null";
  r = generate_speculative_batch(*target_, *drafter_, kPrompts, traced, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trace_path"), std::string::npos) << r.status().message();

  // max_tokens 0 generates nothing, like generate_speculative.
  GenerateOptions none = o;
  none.max_tokens = 0;
  std::vector<GenerateStats> stats;
  auto empty = generate_speculative_batch(*target_, *drafter_, kPrompts, none, &stats);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_TRUE((*empty)[i].empty());
    EXPECT_EQ(stats[i].generated_tokens, 0);
    EXPECT_EQ(stats[i].steps, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, SpeculativeBatch,
                         ::testing::Values("stories260K-dflash", "stories260K-flashmap"),
                         [](const auto& info) { return test_util::param_name(info.param); });

}  // namespace
}  // namespace bs
