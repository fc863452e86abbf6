// Greedy invariance for the DFlash relatives (DSpark, DFlash2): speculative decoding gives
// exactly generate_plain's tokens, finish reason and stream, one sequence at a time
// (generate_speculative) and batched through the Scheduler's step (generate_speculative_batch),
// with the random test drafters of tools/goldens/make_dspark_goldens.py / make_dflash2_goldens.py
// on stories260K and tiny-qwen3; DSpark also with confidence cuts (--draft-confidence-min), whose
// shrunken blocks the batched step packs back together.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kData = BS_TEST_DATA;
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

struct Case {
  std::string drafter, target;
  int32_t vocab;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.drafter; }
};

class Relatives : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    if (!std::filesystem::exists(c.target + "/config.json")) GTEST_SKIP() << "no " << c.target;
    backend_ = make_cpu_backend(1);
    auto t = load_target(c.target, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    auto d = load_drafter(kData + "/" + c.drafter, *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    drafter_ = std::move(*d);
    std::mt19937 rng(11);
    std::vector<int32_t> random_prompt = {1};
    for (int i = 0; i < 20; ++i) {
      random_prompt.push_back(static_cast<int32_t>(3 + rng() % (c.vocab - 3)));
    }
    prompts_ = {{1}, {1, 40, 41, 26, 37, 43}, random_prompt};
  }

  std::vector<int32_t> plain(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                             GenerateStats* st) {
    auto r = generate_plain(*target_, prompt, o, nullptr, st);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::vector<int32_t>();
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(Relatives, GreedySpeculativeEqualsPlain) {
  std::vector<double> cuts = {0.0};
  if (drafter_->has_confidence()) cuts = {0.0, 0.3, 0.6};
  for (const auto& prompt : prompts_) {
    GenerateOptions o;
    o.max_tokens = 50;
    o.stop_ids = {2};
    GenerateStats pst;
    const std::vector<int32_t> want = plain(prompt, o, &pst);
    for (int64_t dt : {int64_t{0}, int64_t{2}}) {
      for (double cut : cuts) {
        o.draft_tokens = dt;
        o.draft_confidence_min = cut;
        GenerateStats st;
        std::vector<int32_t> streamed;
        auto got = generate_speculative(
            *target_, *drafter_, prompt, o,
            [&](int32_t t) {
              streamed.push_back(t);
              return true;
            },
            &st);
        ASSERT_TRUE(got.ok()) << got.status().message();
        const std::string what = fmt::format("{} prompt {} draft_tokens {} cut {}",
                                             GetParam().drafter, prompt.size(), dt, cut);
        EXPECT_EQ(*got, want) << what;
        EXPECT_EQ(streamed, want) << what;
        EXPECT_EQ(static_cast<int>(st.finish), static_cast<int>(pst.finish)) << what;
        EXPECT_LE(st.accepted, st.drafted) << what;
        const int64_t budget = dt ? dt : drafter_->max_drafts();
        if (cut == 0.0) {
          // No cut: every step verifies the full budget but the last few (max_tokens bounds k).
          EXPECT_GE(st.drafted, (st.steps - budget - 1) * budget) << what;
        }
      }
    }
  }
}

TEST_P(Relatives, BatchedGreedySpeculativeEqualsPlain) {
  std::vector<double> cuts = {0.0};
  if (drafter_->has_confidence()) cuts = {0.0, 0.5};
  for (double cut : cuts) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_ids = {2};
    o.draft_confidence_min = cut;
    std::vector<GenerateStats> stats;
    auto got = generate_speculative_batch(*target_, *drafter_, prompts_, o, &stats);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), prompts_.size());
    int64_t drafted = 0, steps = 0;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      GenerateStats pst;
      EXPECT_EQ((*got)[i], plain(prompts_[i], o, &pst))
          << GetParam().drafter << " prompt " << i << " cut " << cut;
      drafted += stats[i].drafted;
      steps += stats[i].steps;
    }
    if (cut > 0) {
      // The cut verified fewer drafts than the full budget on some steps.
      EXPECT_LT(drafted, steps * drafter_->max_drafts()) << GetParam().drafter;
    }
  }
}

// Sampled decoding runs the drafter's own draws (the Markov chain / selector walk) in both paths.
TEST_P(Relatives, SampledRunsInBothPaths) {
  GenerateOptions o;
  o.max_tokens = 30;
  o.sampling = {.temperature = 0.8f, .top_k = 20, .seed = 5};
  GenerateStats st;
  auto one = generate_speculative(*target_, *drafter_, prompts_[1], o, nullptr, &st);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->size(), 30u);
  if (drafter_->has_confidence()) o.draft_confidence_min = 0.4;
  std::vector<GenerateStats> stats;
  auto batch = generate_speculative_batch(*target_, *drafter_, prompts_, o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  for (const auto& out : *batch) EXPECT_EQ(out.size(), 30u);
}

TEST(RelativesOptions, ConfidenceCutNeedsAConfidenceHead) {
  auto backend = make_cpu_backend(1);
  auto target = load_target(kStories, *backend);
  ASSERT_TRUE(target.ok());
  auto d = load_drafter(kData + "/dflash2-stories260K", **target, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  GenerateOptions o;
  o.max_tokens = 4;
  o.draft_confidence_min = 0.5;
  auto r = generate_speculative(**target, **d, std::vector<int32_t>{1}, o, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("confidence head"), std::string::npos)
      << r.status().message();
  o.draft_confidence_min = 1.5;
  auto d2 = load_drafter(kData + "/dspark-stories260K", **target, {});
  ASSERT_TRUE(d2.ok()) << d2.status().message();
  r = generate_speculative(**target, **d2, std::vector<int32_t>{1}, o, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("draft_confidence_min"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Drafters, Relatives,
                         ::testing::Values(Case{"dspark-stories260K", kStories, 512},
                                           Case{"dspark-tiny-qwen3", kData + "/tiny-qwen3", 320},
                                           Case{"dflash2-stories260K", kStories, 512},
                                           Case{"dflash2-tiny-qwen3", kData + "/tiny-qwen3", 320}),
                         [](const auto& info) {
                           std::string n = info.param.drafter;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace bs
