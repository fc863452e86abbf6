#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace bs {
namespace {

TEST(Sampler, GreedyTakesFirstMax) {
  Sampler s({.temperature = 0});
  const std::vector<float> logits{1, 3, 3, -1};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, ProbsApplyTemperatureTopKTopP) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 3.0f};
  std::vector<float> p;
  Sampler({.temperature = 1.0f}).probs(logits, &p);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(p[i], std::exp(logits[i]) / z, 1e-6);

  Sampler({.temperature = 1.0f, .top_k = 2}).probs(logits, &p);
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_NEAR(p[3], std::exp(3.0) / (std::exp(2.0) + std::exp(3.0)), 1e-6);

  // exp(3)/z = 0.644 < 0.7, so top-p 0.7 keeps the two largest.
  Sampler({.temperature = 1.0f, .top_p = 0.7f}).probs(logits, &p);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_GT(p[2], 0.0f);
  EXPECT_NEAR(p[2] + p[3], 1.0, 1e-6);

  Sampler({.temperature = 0.5f}).probs(logits, &p);
  double z2 = 0;
  for (float l : logits) z2 += std::exp(2 * l);
  EXPECT_NEAR(p[0], 1.0 / z2, 1e-6);
}

TEST(Sampler, SeededIsReproducibleAndMatchesDistribution) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f};
  Sampler a({.temperature = 1.0f, .seed = 7}), b({.temperature = 1.0f, .seed = 7});
  std::vector<int> counts(3, 0);
  constexpr int kN = 30000;
  for (int i = 0; i < kN; ++i) {
    const int32_t x = a.sample(logits);
    ASSERT_EQ(x, b.sample(logits));
    ++counts[x];
  }
  std::vector<float> p;
  a.probs(logits, &p);
  // Each count is within 5 standard deviations of its expectation (false alarm < 1e-6).
  for (int i = 0; i < 3; ++i) {
    const double mean = kN * p[i], sd = std::sqrt(kN * p[i] * (1 - p[i]));
    EXPECT_NEAR(counts[i], mean, 5 * sd);
  }
}

TEST(Sampler, ValidateRejectsBadValues) {
  EXPECT_FALSE(SamplingParams{.temperature = -1}.validate().ok());
  EXPECT_FALSE(SamplingParams{.top_k = -2}.validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = 0.0f}.validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = 1.5f}.validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.7f, .top_k = 5, .top_p = 0.9f}.validate().ok()));
}

}  // namespace
}  // namespace bs
