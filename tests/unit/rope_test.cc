// RoPE inverse-frequency tables against hand-derived values and transformers' formulas
// (modeling_rope_utils.py), recomputed here in double precision.
#include "models/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace bs {
namespace {

using io::RopeConfig;
using io::RopeType;

// theta ** (-2i / dim) in double.
double default_inv(double theta, int64_t dim, int64_t i) {
  return 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / static_cast<double>(dim));
}

void expect_rel_near(double actual, double expected, double rel, const std::string& what) {
  EXPECT_NEAR(actual, expected, rel * std::fabs(expected)) << what;
}

TEST(RopeTest, DefaultHandDerived) {
  RopeConfig r;  // theta 10000
  const RopeTable t = compute_rope(r, 8, 512);
  ASSERT_EQ(t.inv_freq.size(), 4u);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_FLOAT_EQ(t.inv_freq[1], 0.1f);
  EXPECT_FLOAT_EQ(t.inv_freq[2], 0.01f);
  EXPECT_FLOAT_EQ(t.inv_freq[3], 0.001f);
  EXPECT_EQ(t.attention_scaling, 1.0f);
}

TEST(RopeTest, DefaultMatchesFormula) {
  RopeConfig r;
  r.theta = 1e6;  // Qwen3
  const RopeTable t = compute_rope(r, 128, 40960);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  for (int64_t i = 0; i < 64; ++i) {
    expect_rel_near(t.inv_freq[i], default_inv(1e6, 128, i), 2e-7, fmt::format("i={}", i));
  }
}

TEST(RopeTest, LinearDividesByFactor) {
  RopeConfig r;
  r.type = RopeType::kLinear;
  r.factor = 4;
  const RopeTable t = compute_rope(r, 8, 512);
  ASSERT_EQ(t.inv_freq.size(), 4u);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 0.25f);
  EXPECT_FLOAT_EQ(t.inv_freq[1], 0.025f);
  EXPECT_FLOAT_EQ(t.inv_freq[3], 0.00025f);
  EXPECT_EQ(t.attention_scaling, 1.0f);
}

// Llama 3.1 (theta 5e5, factor 8, low 1, high 4, original context 8192).
RopeConfig llama31() {
  RopeConfig r;
  r.type = RopeType::kLlama3;
  r.theta = 500000;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 8192;
  return r;
}

TEST(RopeTest, Llama3BandsAndSmoothing) {
  const RopeConfig r = llama31();
  RopeConfig plain;
  plain.theta = r.theta;
  const RopeTable base = compute_rope(plain, 128, 131072);
  const RopeTable t = compute_rope(r, 128, 131072);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  EXPECT_EQ(t.attention_scaling, 1.0f);
  int high = 0, low = 0, medium = 0;
  for (size_t i = 0; i < 64; ++i) {
    const double inv = default_inv(r.theta, 128, static_cast<int64_t>(i));
    const double wavelen = 2 * std::numbers::pi / inv;
    if (wavelen < 8192.0 / 4) {  // high frequency: unchanged
      EXPECT_EQ(t.inv_freq[i], base.inv_freq[i]) << i;
      ++high;
    } else if (wavelen > 8192.0 / 1) {  // low frequency: divided by the factor
      EXPECT_EQ(t.inv_freq[i], base.inv_freq[i] / 8.0f) << i;
      ++low;
    } else {  // in between: smooth blend of the two
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      const double expected = (1 - s) * inv / 8 + s * inv;
      expect_rel_near(t.inv_freq[i], expected, 1e-6, fmt::format("medium i={}", i));
      EXPECT_LT(t.inv_freq[i], base.inv_freq[i]);
      EXPECT_GT(t.inv_freq[i], base.inv_freq[i] / 8.0f);
      ++medium;
    }
    if (i > 0) {
      EXPECT_LT(t.inv_freq[i], t.inv_freq[i - 1]) << i;
    }
  }
  // The known split for Llama 3.1's 128-dim heads.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
  EXPECT_EQ(high + low + medium, 64);
}

TEST(RopeTest, Llama3OriginalDefaultsToMaxPosition) {
  RopeConfig r = llama31();
  const RopeTable a = compute_rope(r, 128, 8192);
  r.original_max_position_embeddings = 0;  // use max_position_embeddings
  const RopeTable b = compute_rope(r, 128, 8192);
  EXPECT_EQ(a.inv_freq, b.inv_freq);
}

// Independent double-precision YaRN, written from transformers' _compute_yarn_parameters.
std::vector<double> yarn_reference(double theta, int64_t dim, double factor, int64_t orig,
                                   double beta_fast, double beta_slow, bool truncate) {
  auto corr = [&](double rot) {
    return dim * std::log(orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = corr(beta_fast), high = corr(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> out;
  for (int64_t j = 0; j < dim / 2; ++j) {
    const double extrap = default_inv(theta, dim, j);
    const double interp = extrap / factor;
    const double ramp = std::clamp((j - low) / (high - low), 0.0, 1.0);
    const double extrap_factor = 1 - ramp;
    out.push_back(interp * (1 - extrap_factor) + extrap * extrap_factor);
  }
  return out;
}

TEST(RopeTest, YarnMatchesFormula) {
  // Kimi-K3 DSpark drafter (specs/dflash.md 1.5): factor 16, original 4096, theta 1e4.
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.theta = 10000;
  r.factor = 16;
  r.original_max_position_embeddings = 4096;
  for (bool truncate : {true, false}) {
    r.truncate = truncate;
    const RopeTable t = compute_rope(r, 128, 65536);
    const std::vector<double> ref = yarn_reference(1e4, 128, 16, 4096, 32, 1, truncate);
    ASSERT_EQ(t.inv_freq.size(), ref.size());
    for (size_t j = 0; j < ref.size(); ++j) {
      expect_rel_near(t.inv_freq[j], ref[j], 1e-6, fmt::format("truncate={} j={}", truncate, j));
    }
    // High-frequency dims extrapolate (unchanged), low-frequency dims interpolate (/ factor).
    EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
    expect_rel_near(t.inv_freq[63], default_inv(1e4, 128, 63) / 16, 1e-6, "last");
    EXPECT_FLOAT_EQ(t.attention_scaling, static_cast<float>(0.1 * std::log(16.0) + 1.0));
  }
  // Truncation changes the ramp edges, so the blended middle differs.
  r.truncate = true;
  const RopeTable a = compute_rope(r, 128, 65536);
  r.truncate = false;
  const RopeTable b = compute_rope(r, 128, 65536);
  EXPECT_NE(a.inv_freq, b.inv_freq);
}

// Values printed by transformers 5.17.0 `_compute_yarn_parameters` (rotary dim 64, theta 1e7,
// original context 262144, defaults otherwise), as published with a third-party project's tests;
// 10 significant digits, so agreement to 1e-8 relative means the same fp32 values.
TEST(RopeTest, YarnMatchesTransformersPrintout) {
  struct Golden {
    double factor;
    double attention_factor;
    double inv_freq[32];
  };
  const Golden kGolden[] = {
      {1.5625,
       1.044628710262842,
       {1.000000000e+00, 6.042963862e-01, 3.651741445e-01, 2.206733972e-01, 1.333521456e-01,
        8.058421314e-02, 4.869675264e-02, 2.942727320e-02, 1.778279431e-02, 1.074607857e-02,
        6.493816618e-03, 3.924189601e-03, 2.371373819e-03, 1.433012658e-03, 8.659643354e-04,
        4.997506621e-04, 2.877672960e-04, 1.652974315e-04, 9.469212091e-05, 5.408186553e-05,
        3.078384179e-05, 1.745583177e-05, 9.855529242e-06, 5.955661436e-06, 3.598984449e-06,
        2.174853307e-06, 1.314255996e-06, 7.942002185e-07, 4.799323392e-07, 2.900213474e-07,
        1.752588616e-07, 1.059082990e-07}},
      {2.5,
       1.0916290731874154,
       {1.000000000e+00, 6.042963862e-01, 3.651741445e-01, 2.206733972e-01, 1.333521456e-01,
        8.058421314e-02, 4.869675264e-02, 2.942727320e-02, 1.778279431e-02, 1.074607857e-02,
        6.493816618e-03, 3.924189601e-03, 2.371373819e-03, 1.433012658e-03, 8.659643354e-04,
        4.840516776e-04, 2.687936067e-04, 1.480988576e-04, 8.083473222e-05, 4.361441097e-05,
        2.319330997e-05, 1.210440860e-05, 6.159706118e-06, 3.722288511e-06, 2.249365252e-06,
        1.359283260e-06, 8.214099694e-07, 4.963750939e-07, 2.999576907e-07, 1.812633457e-07,
        1.095367850e-07, 6.619268333e-08}},
      {4.0,
       1.138629436111989,
       {1.000000000e+00, 6.042963862e-01, 3.651741445e-01, 2.206733972e-01, 1.333521456e-01,
        8.058421314e-02, 4.869675264e-02, 2.942727320e-02, 1.778279431e-02, 1.074607857e-02,
        6.493816618e-03, 3.924189601e-03, 2.371373819e-03, 1.433012658e-03, 8.659643354e-04,
        4.742398160e-04, 2.569350763e-04, 1.373497507e-04, 7.217386883e-05, 3.707224823e-05,
        1.844922372e-05, 8.759770026e-06, 3.849816039e-06, 2.326430149e-06, 1.405853368e-06,
        8.495520660e-07, 5.133812238e-07, 3.102344408e-07, 1.874735602e-07, 1.132895946e-07,
        6.846049416e-08, 4.137042708e-08}},
  };
  for (const Golden& g : kGolden) {
    RopeConfig r;
    r.type = RopeType::kYarn;
    r.theta = 1e7;
    r.factor = g.factor;
    r.original_max_position_embeddings = 262144;
    const RopeTable t = compute_rope(r, 64, 262144);
    ASSERT_EQ(t.inv_freq.size(), 32u);
    for (size_t j = 0; j < 32; ++j) {
      expect_rel_near(t.inv_freq[j], g.inv_freq[j], 1e-8,
                      fmt::format("factor={} j={}", g.factor, j));
    }
    EXPECT_FLOAT_EQ(t.attention_scaling, static_cast<float>(g.attention_factor));
  }
}

TEST(RopeTest, YarnAttentionFactor) {
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.theta = 10000;
  r.factor = 40;
  r.original_max_position_embeddings = 4096;
  auto scaling = [&]() { return compute_rope(r, 64, 163840).attention_scaling; };

  EXPECT_FLOAT_EQ(scaling(), static_cast<float>(0.1 * std::log(40.0) + 1));
  // DeepSeek-V3 style: mscale == mscale_all_dim gives 1.
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  EXPECT_FLOAT_EQ(scaling(), 1.0f);
  r.mscale = 0.707;
  EXPECT_FLOAT_EQ(scaling(), static_cast<float>((0.1 * 0.707 * std::log(40.0) + 1) /
                                                (0.1 * std::log(40.0) + 1)));
  // Only one of the two given (or zero): the plain formula.
  r.mscale_all_dim = std::nullopt;
  EXPECT_FLOAT_EQ(scaling(), static_cast<float>(0.1 * std::log(40.0) + 1));
  r.mscale_all_dim = 0.0;
  EXPECT_FLOAT_EQ(scaling(), static_cast<float>(0.1 * std::log(40.0) + 1));
  // An explicit attention_factor wins.
  r.attention_factor = 0.5;
  EXPECT_FLOAT_EQ(scaling(), 0.5f);
  // factor <= 1: no scaling.
  r.attention_factor = std::nullopt;
  r.mscale = std::nullopt;
  r.factor = 1;
  EXPECT_FLOAT_EQ(scaling(), 1.0f);
}

TEST(RopeTest, YarnFactorOneIsDefault) {
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.theta = 1e6;
  r.factor = 1;
  RopeConfig plain;
  plain.theta = 1e6;
  const RopeTable y = compute_rope(r, 128, 4096);
  const RopeTable d = compute_rope(plain, 128, 4096);
  for (size_t j = 0; j < d.inv_freq.size(); ++j) EXPECT_FLOAT_EQ(y.inv_freq[j], d.inv_freq[j]);
}

TEST(RopeTest, FromStoriesConfig) {
  auto c = io::load_transformer_config(BS_SOURCE_DIR "/models/stories260K");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const RopeTable t = compute_rope(c->rope, c->head_dim, c->max_position_embeddings);
  ASSERT_EQ(t.inv_freq.size(), 4u);
  EXPECT_FLOAT_EQ(t.inv_freq[1], 0.1f);
}

}  // namespace
}  // namespace bs
