// Verify-length scheduling (GenerateOptions::verify_budget, engine/verify_budget.h) never changes
// greedy output: every drafter family (the trained DFlash and FlashMap drafters, the random
// DSpark drafter with its confidence head, the random DFlash2 drafter) through Scheduler batches
// whose given step-time curve makes the rule verify only a few drafts per step, and through
// generate_speculative_batch / generate_speculative with the step-time model measured on this
// machine: token for token what plain decoding gives. Requests that keep the budget off verify
// all their drafts whatever shares their steps (their statistics equal their single runs').
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "test_util.h"

namespace bs {
namespace {

const std::vector<std::vector<int32_t>>& kPrompts = test_util::kStoryPrompts;

std::string drafter_dir(const std::string& name) {
  return name.rfind("stories260K", 0) == 0 ? std::string(BS_SOURCE_DIR) + "/models/" + name
                                           : std::string(BS_TEST_DATA) + "/" + name;
}

class VerifyBudgetGreedy : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    test_util::load_stories("", &backend_, &target_, nullptr);
    auto d = load_drafter(drafter_dir(GetParam()), *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    drafter_ = std::move(*d);
    options_.max_tokens = 40;
    options_.stop_ids = {2};
    for (const auto& p : kPrompts) {
      auto plain = generate_plain(*target_, p, options_, nullptr, nullptr);
      ASSERT_TRUE(plain.ok()) << plain.status().message();
      plain_.push_back(*plain);
    }
  }

  // The prompts through one Scheduler with `step_time`; request i's verify budget is budgets[i].
  std::vector<Completion> run(const StepTimeModel& step_time,
                              const std::vector<VerifyBudget>& budgets) {
    Scheduler scheduler(*target_, drafter_.get(),
                        {.max_num_seqs = 4, .max_context = 128, .step_time = step_time});
    std::vector<Completion> done(kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      GenerateOptions o = options_;
      o.verify_budget = budgets[i];
      EXPECT_TRUE(
          scheduler.add(i, kPrompts[i], o, nullptr, [&, i](Completion c) { done[i] = c; }).ok());
    }
    while (!scheduler.idle()) EXPECT_TRUE(scheduler.step().ok());
    return done;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  GenerateOptions options_;
  std::vector<std::vector<int32_t>> plain_;
};

// t = 1 s up to 6 verify rows, then 0.5 s more per row: with 4 anchors the rule admits 2 drafts
// per step in all (theta 4, 5, 6, then 7 / 1.5 drops), whatever the survivals.
const StepTimeModel kSteep({{6, 1.0}, {7, 1.5}, {64, 30.0}}, 0);

TEST_P(VerifyBudgetGreedy, TruncatedBatchesEqualPlainDecoding) {
  const std::vector<VerifyBudget> all(kPrompts.size(), VerifyBudget::kAuto);
  const std::vector<Completion> off = run(kSteep, std::vector(kPrompts.size(), VerifyBudget::kOff));
  const std::vector<Completion> on = run(kSteep, all);
  int64_t drafted_off = 0, drafted_on = 0, steps_on = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(on[i].status.ok()) << on[i].status.message();
    EXPECT_EQ(on[i].tokens, plain_[i]) << "prompt " << i;
    EXPECT_EQ(off[i].tokens, plain_[i]) << "prompt " << i << " (off)";
    drafted_off += off[i].stats.drafted;
    drafted_on += on[i].stats.drafted;
    steps_on += on[i].stats.steps;
  }
  // The rule did truncate: at most 2 drafts per batch step, far fewer than the drafter's blocks.
  EXPECT_LT(drafted_on, drafted_off / 2);
  EXPECT_LE(drafted_on, 2 * steps_on);
  EXPECT_GT(drafted_on, 0);
}

TEST_P(VerifyBudgetGreedy, RequestsWithTheBudgetOffVerifyAllTheirDrafts) {
  const std::vector<VerifyBudget> mixed = {VerifyBudget::kAuto, VerifyBudget::kOff,
                                           VerifyBudget::kAuto, VerifyBudget::kOff};
  const std::vector<Completion> done = run(kSteep, mixed);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(done[i].status.ok()) << done[i].status.message();
    EXPECT_EQ(done[i].tokens, plain_[i]) << "prompt " << i;
    if (mixed[i] == VerifyBudget::kAuto) continue;
    GenerateStats alone;
    auto single = generate_speculative(*target_, *drafter_, kPrompts[i], options_, nullptr, &alone);
    ASSERT_TRUE(single.ok());
    EXPECT_EQ(done[i].stats.steps, alone.steps) << "prompt " << i;
    EXPECT_EQ(done[i].stats.drafted, alone.drafted) << "prompt " << i;
    EXPECT_EQ(done[i].stats.position_accepted, alone.position_accepted) << "prompt " << i;
  }
}

TEST_P(VerifyBudgetGreedy, MeasuredStepTimeEqualsPlainDecoding) {
  GenerateOptions o = options_;
  o.verify_budget = VerifyBudget::kAuto;
  std::vector<GenerateStats> stats;
  auto batch = generate_speculative_batch(*target_, *drafter_, kPrompts, o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ((*batch)[i], plain_[i]) << "prompt " << i;
    auto single = generate_speculative(*target_, *drafter_, kPrompts[i], o, nullptr, nullptr);
    ASSERT_TRUE(single.ok()) << single.status().message();
    EXPECT_EQ(*single, plain_[i]) << "prompt " << i << " (single)";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, VerifyBudgetGreedy,
                         ::testing::Values("stories260K-dflash", "stories260K-flashmap",
                                           "dspark-stories260K", "dflash2-stories260K"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(c) ? c : '_';
                           return name;
                         });

// DSpark with its confidence head and a confidence cut as well: the cut first, then the budget.
TEST(VerifyBudgetDSpark, CutAndBudgetTogetherEqualPlainDecoding) {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<CausalLM> target;
  test_util::load_stories("", &backend, &target, nullptr);
  auto drafter = load_drafter(drafter_dir("dspark-stories260K"), *target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  ASSERT_TRUE((*drafter)->has_confidence());
  GenerateOptions o;
  o.max_tokens = 40;
  o.draft_confidence_min = 0.3;
  o.verify_budget = VerifyBudget::kAuto;
  Scheduler scheduler(*target, drafter->get(),
                      {.max_num_seqs = 4,
                       .max_context = 128,
                       .step_time = StepTimeModel({{4, 1.0}, {64, 3.0}}, 0.5)});
  std::vector<std::vector<int32_t>> out(kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(scheduler
                    .add(i, kPrompts[i], o, nullptr,
                         [&, i](Completion c) {
                           EXPECT_TRUE(c.status.ok()) << c.status.message();
                           out[i] = c.tokens;
                         })
                    .ok());
  }
  while (!scheduler.idle()) ASSERT_TRUE(scheduler.step().ok());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto plain = generate_plain(*target, kPrompts[i], o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(out[i], *plain) << "prompt " << i;
  }
}

}  // namespace
}  // namespace bs
