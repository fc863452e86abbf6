// The verify-length rule (engine/verify_budget.h, DSpark Algorithm 1) on synthetic prefix
// survivals and step-time curves; the expected lengths are worked out by hand from theta =
// tau / t(B_v) in the comments.
#include "engine/verify_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace bs {
namespace {

std::vector<int64_t> admit(const std::vector<std::vector<float>>& a, const StepTimeModel& t,
                           const std::vector<bool>& fixed = {}) {
  std::vector<VerifyCandidates> seqs;
  for (size_t r = 0; r < a.size(); ++r) {
    seqs.push_back({.drafts = static_cast<int64_t>(a[r].size()),
                    .survival = a[r],
                    .fixed = r < fixed.size() && fixed[r]});
  }
  return admit_drafts(seqs, t);
}

TEST(StepTimeModel, InterpolatesExtrapolatesAndIgnoresDips) {
  const StepTimeModel t({{4, 2.0}, {1, 1.0}, {8, 1.5}, {16, 3.0}}, 0.5);
  EXPECT_DOUBLE_EQ(t.verify_seconds(1), 1.0);
  EXPECT_DOUBLE_EQ(t.verify_seconds(0), 1.0);  // flat below the first point
  EXPECT_DOUBLE_EQ(t.verify_seconds(2), 1.0 + 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(t.verify_seconds(8), 2.0);   // the dip to 1.5 is raised to 2.0
  EXPECT_DOUBLE_EQ(t.verify_seconds(12), 2.5);  // between (8, 2) and (16, 3)
  EXPECT_DOUBLE_EQ(t.verify_seconds(32), 5.0);  // along the last segment
  EXPECT_DOUBLE_EQ(t.seconds(32), 5.5);
  const StepTimeModel one({{4, 2.0}}, 0);
  EXPECT_DOUBLE_EQ(one.verify_seconds(2), 2.0);
  EXPECT_DOUBLE_EQ(one.verify_seconds(8), 4.0);
}

TEST(VerifyBudget, HandWorkedBatch) {
  // t = 1 + 0.1 * rows. Two sequences: theta starts at 2 / 1.2 = 1.667; admitting in the order
  // a = 0.9 (2.9 / 1.3 = 2.231), 0.8 (3.7 / 1.4 = 2.643), 0.5 (4.2 / 1.5 = 2.8), 0.3 (4.5 / 1.6 =
  // 2.8125), then 0.1 would give 4.6 / 1.7 = 2.706: stop.
  const StepTimeModel t({{1, 0.1}, {100, 10.0}}, 1.0);
  EXPECT_EQ(admit({{0.9f, 0.5f, 0.1f}, {0.8f, 0.3f}}, t), (std::vector<int64_t>{2, 2}));
}

TEST(VerifyBudget, FlatCurveAdmitsEveryUsefulDraft) {
  // Memory-bound verify: any draft with a > 0 raises tau at no cost; a = 0 does not.
  const StepTimeModel t({{1, 1.0}, {64, 1.0}}, 0.2);
  EXPECT_EQ(admit({{0.5f, 0.2f, 0.0f}, {0.9f}, {}}, t), (std::vector<int64_t>{2, 1, 0}));
}

TEST(VerifyBudget, LinearCurveWithoutFixedCostAdmitsNothing) {
  // t = rows: theta = tau / rows starts at 1, and a draft raises it only if a > 1.
  const StepTimeModel t({{1, 1.0}, {2, 2.0}}, 0);
  EXPECT_EQ(admit({{1.0f, 0.99f}, {0.7f}}, t), (std::vector<int64_t>{0, 0}));
}

TEST(VerifyBudget, NoConfidenceHeadDegeneratesToEvenLengths) {
  // a = 1 everywhere (empty survival): ties go to the earlier draft, then the earlier sequence,
  // so the budget spreads evenly. t = 1 for up to 6 rows, then + 1 per row: with 3 anchors, 3
  // drafts fit free (theta 6 / 1); a 7th row gives 7 / 2: stop.
  const StepTimeModel t({{6, 1.0}, {7, 2.0}}, 0);
  std::vector<VerifyCandidates> seqs(3, VerifyCandidates{.drafts = 4});
  EXPECT_EQ(admit_drafts(seqs, t), (std::vector<int64_t>{1, 1, 1}));
  // With a large fixed cost every draft pays: all admitted.
  const StepTimeModel heavy({{1, 0.01}, {2, 0.02}}, 10.0);
  EXPECT_EQ(admit_drafts(seqs, heavy), (std::vector<int64_t>{4, 4, 4}));
}

TEST(VerifyBudget, FixedSequencesKeepAllTheirDrafts) {
  // Sequence 0 takes no part (all 3 verified, its rows and a counted); sequence 1 gets what the
  // flat part of the curve leaves: rows 2 + 3 = 5 fixed, one more free, then each row costs 1.
  const StepTimeModel t({{6, 1.0}, {7, 2.0}}, 0);
  EXPECT_EQ(admit({{0.1f, 0.1f, 0.1f}, {0.9f, 0.8f}}, t, {true, false}),
            (std::vector<int64_t>{3, 1}));
}

TEST(VerifyBudget, SurvivalIsMadeNonIncreasing) {
  // a_2 = 0.9 > a_1 = 0.2 is read as 0.2: the second draft cannot be admitted before the first.
  const StepTimeModel t({{1, 1.0}, {2, 1.0}, {3, 3.0}}, 0);
  // Rows 1 + 1 = 2 are free; the second draft would cost 2 more seconds.
  EXPECT_EQ(admit({{0.2f, 0.9f}}, t), (std::vector<int64_t>{1}));
  // A NaN survival counts as 0 (never worth a row), and so does everything after it.
  const StepTimeModel flat({{1, 1.0}, {64, 1.0}}, 0);
  EXPECT_EQ(admit({{0.5f, std::nanf(""), 0.9f}}, flat), (std::vector<int64_t>{1}));
}

// The stop at the first drop of theta, not the best prefix of the order: t jumps from 1 to 1.5
// at 4 rows and stays flat up to 10. One sequence with high survivals: the rule admits 2 drafts
// (theta 1.95, 2.85, then 3.7 / 1.5 = 2.47 drops), although verifying all 7 would give 6.6 / 1.5
// = 4.4. Looking past the drop would make the length depend on a_4.. (drafts 3..), which the
// rule must not (see the next test).
TEST(VerifyBudget, StopsAtTheFirstDropNotAtTheBestPrefix) {
  const StepTimeModel t({{3, 1.0}, {4, 1.5}, {10, 1.5}}, 0);
  const std::vector<std::vector<float>> a = {{0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f, 0.65f}};
  EXPECT_EQ(admit(a, t), (std::vector<int64_t>{2}));
  std::vector<VerifyCandidates> seqs = {{.drafts = 7, .survival = a[0]}};
  const std::vector<int64_t> all = {7}, two = {2};
  EXPECT_GT(modelled_tokens_per_second(seqs, all, t), modelled_tokens_per_second(seqs, two, t));
}

// Non-anticipation, the property that makes the rule lossless: the lengths chosen do not depend on
// any a_{r,j} with j > l_r + 1 (those are functions of drafts l_r + 1.., which are not verified):
// replacing them by any other non-increasing values changes nothing. Random survivals and random
// non-decreasing step-time curves.
TEST(VerifyBudget, LengthsDoNotDependOnUnverifiedDrafts) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int64_t truncated = 0;
  for (int trial = 0; trial < 10000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<std::vector<float>> a(n);
    for (auto& row : a) {
      float s = 1.0f;
      const int k = static_cast<int>(rng() % 8);
      for (int j = 0; j < k; ++j) row.push_back(s *= 0.5f + 0.5f * u(rng));
    }
    std::vector<std::pair<int64_t, double>> points;
    double sec = 0.1 + u(rng);
    for (int64_t rows = 1; rows <= 64; rows *= 2) {
      points.emplace_back(rows, sec);
      sec += u(rng) * static_cast<double>(rows) * 0.1;
    }
    const StepTimeModel t(points, u(rng) * 0.5);
    const std::vector<int64_t> len = admit(a, t);
    std::vector<std::vector<float>> b = a;
    for (int r = 0; r < n; ++r) {
      ASSERT_LE(len[r], static_cast<int64_t>(a[r].size()));
      truncated += len[r] < static_cast<int64_t>(a[r].size());
      // Keep a_1 .. a_{l+1}; the rest: new random values below a_{l+1}.
      for (size_t j = static_cast<size_t>(len[r]) + 1; j < b[r].size(); ++j) {
        b[r][j] = b[r][j - 1] * u(rng);
      }
    }
    ASSERT_EQ(admit(b, t), len) << "trial " << trial;
  }
  EXPECT_GT(truncated, 5000) << "the curves should truncate many blocks";
}

}  // namespace
}  // namespace bs
