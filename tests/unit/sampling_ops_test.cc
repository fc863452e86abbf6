// The sampling ops of the backend interface (filtered_probs, sample_from_probs, rejection_sample)
// on the CPU reference: against an independent brute-force statement of the filter rule, the host
// Sampler, hand-picked inverse-CDF cases and accept_sampled; the engine's DeviceSampling against
// the host path (same tokens from the same seed) and against the exact distributions
// (chi-square, chi_square.h); seeded plain generation drawn on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "chi_square.h"
#include "core/dtype.h"
#include "engine/device_sampling.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/speculative_accept.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

using sampling::FilterParams;
using test_util::goodness_of_fit;
using test_util::kAlpha;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The filter rule of backend/sampling.h stated by brute force over the distinct logit values
// (doubles for the masses). *ambiguous: a tie group's cumulative mass lies within 1e-9 of
// top_p * Z_k, so the kept set depends on rounding and a comparison must not insist on it.
std::vector<double> naive_probs(const std::vector<float>& x, const FilterParams& f,
                                bool* ambiguous = nullptr) {
  const size_t v = x.size();
  std::vector<double> out(v, 0.0);
  if (!(f.temperature > 0)) {
    out[std::max_element(x.begin(), x.end()) - x.begin()] = 1.0;
    return out;
  }
  std::vector<float> values = x;
  std::sort(values.begin(), values.end(), std::greater<float>());
  values.erase(std::unique(values.begin(), values.end()), values.end());  // -0 == +0
  const float m = values[0];
  std::vector<float> w(v);
  for (size_t i = 0; i < v; ++i) w[i] = std::exp((x[i] - m) / f.temperature);
  const auto sum_ge = [&](float t, bool count) {
    double s = 0;
    for (size_t i = 0; i < v; ++i) {
      if (x[i] >= t) s += count ? 1.0 : w[i];
    }
    return s;
  };
  float t = -kInf;
  if (f.top_k > 0 && static_cast<size_t>(f.top_k) < v) {
    for (float value : values) {
      if (sum_ge(value, true) >= f.top_k) {
        t = value;
        break;
      }
    }
  }
  if (f.top_p < 1.0f) {
    const double target = f.top_p * sum_ge(t, false);
    for (float value : values) {
      if (value < t) break;
      const double mass = sum_ge(value, false);
      if (ambiguous && std::abs(mass - target) <= 1e-9 * target) *ambiguous = true;
      if (mass >= target) {
        t = value;
        break;
      }
    }
  }
  // min-p after top-k / top-p: the kept entries whose weight (the maximum's is 1) is >= min_p.
  const auto kept = [&](size_t i) { return x[i] >= t && !(f.min_p > 0 && w[i] < f.min_p); };
  double z = 0;
  for (size_t i = 0; i < v; ++i) {
    if (kept(i)) z += w[i];
    if (ambiguous && f.min_p > 0 && x[i] >= t && std::abs(w[i] - f.min_p) <= 1e-6 * f.min_p) {
      *ambiguous = true;
    }
  }
  for (size_t i = 0; i < v; ++i) out[i] = kept(i) ? w[i] / z : 0.0;
  return out;
}

// Random logits of several kinds: continuous, quantized to quarters (many ties), BF16-rounded,
// with -inf entries, and constant.
std::vector<float> random_logits(std::mt19937_64& rng, size_t v, int kind) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(v);
  for (float& e : x) {
    e = normal(rng);
    if (kind == 1) e = std::round(e * 4.0f) / 4.0f;
    if (kind == 2) e = bf16_to_f32(f32_to_bf16(e));
    if (kind == 4) e = 1.5f;
  }
  if (kind == 3) {
    for (size_t i = 0; i < v; i += 3) x[i] = -kInf;
    x[v / 2] = 0.5f;  // at least one finite logit
  }
  return x;
}

Tensor upload(Backend& be, const std::vector<float>& v, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(v.size()) / rows;
  Tensor t = be.empty({rows, cols}, DType::kF32);
  be.copy_from_host(t, v.data());
  return t;
}
Tensor upload_ints(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = be.empty({static_cast<int64_t>(v.size())}, DType::kI32);
  be.copy_from_host(t, v.data());
  return t;
}

class SamplingOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend(2);
  std::mt19937_64 rng_{12345};
};

TEST_F(SamplingOps, FilteredProbsFollowTheRuleOnTiesAndExtremes) {
  const std::vector<float> temperatures = {1e-6f, 0.05f, 0.7f, 1.0f, 3.0f, 1e4f, 1e30f};
  const std::vector<float> top_ps = {1.0f, 0.999f, 0.9f, 0.5f, 0.01f};
  int cases = 0, ambiguous_cases = 0;
  for (const size_t v : {1u, 2u, 7u, 64u, 300u}) {
    const std::vector<int> top_ks = {
        0, 1, 2, 5, static_cast<int>(v) - 1, static_cast<int>(v), static_cast<int>(v) + 3};
    for (int kind = 0; kind < 5; ++kind) {
      const std::vector<float> x = random_logits(rng_, v, kind);
      const Tensor logits = upload(*be_, x, 1);
      const Tensor probs = be_->empty({1, static_cast<int64_t>(v)}, DType::kF32);
      for (float t : temperatures) {
        for (int k : top_ks) {
          for (float p : top_ps) {
            for (float min_p : {0.0f, 0.05f, 0.6f}) {
              const FilterParams f{.temperature = t, .top_k = k, .top_p = p, .min_p = min_p};
              bool ambiguous = false;
              const std::vector<double> want = naive_probs(x, f, &ambiguous);
              be_->filtered_probs(probs, logits, {&f, 1});
              const std::vector<float> got = be_->to_host_f32(probs);
              ++cases;
              if (ambiguous) {
                ++ambiguous_cases;
                continue;
              }
              double sum = 0;
              for (size_t i = 0; i < v; ++i) {
                SCOPED_TRACE(::testing::Message() << "v " << v << " kind " << kind << " T " << t
                                                  << " k " << k << " p " << p << " i " << i);
                ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0) << got[i] << " vs " << want[i];
                ASSERT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-30);
                sum += got[i];
              }
              EXPECT_NEAR(sum, 1.0, 1e-5);
            }
          }
        }
      }
    }
  }
  EXPECT_LT(ambiguous_cases, cases / 100) << ambiguous_cases << " of " << cases;
}

// min-p on hand values: weights 1, 1/2, 1/4, 1/10, 1/20 at temperature 1 (sqrt of them at 2).
TEST_F(SamplingOps, MinPKeepsTokensAtLeastThatFractionOfTheMostLikely) {
  const std::vector<float> x = {std::log(0.25f), 0.0f, std::log(0.05f), std::log(0.5f),
                                std::log(0.1f)};
  const Tensor logits = upload(*be_, x, 1);
  const Tensor probs = be_->empty({1, 5}, DType::kF32);
  auto run = [&](const FilterParams& f) {
    be_->filtered_probs(probs, logits, {&f, 1});
    return be_->to_host_f32(probs);
  };
  auto near = [](const std::vector<float>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i] == 0.0f, want[i] == 0.0) << i;
      EXPECT_NEAR(got[i], want[i], 1e-6) << i;
    }
  };
  // 0.2: keeps 1, 1/2, 1/4 (Z = 1.75).
  near(run({.temperature = 1.0f, .min_p = 0.2f}), {0.25 / 1.75, 1 / 1.75, 0, 0.5 / 1.75, 0});
  // 1: the maximum alone; 0: off.
  near(run({.temperature = 1.0f, .min_p = 1.0f}), {0, 1, 0, 0, 0});
  near(run({.temperature = 1.0f, .min_p = 0.0f}),
       {0.25 / 1.9, 1 / 1.9, 0.05 / 1.9, 0.5 / 1.9, 0.1 / 1.9});
  // Temperature 2: weights 1, 0.707, 0.5, 0.316, 0.224; 0.3 keeps four.
  const double z2 = 1 + std::sqrt(0.5) + 0.5 + std::sqrt(0.1);
  near(run({.temperature = 2.0f, .min_p = 0.3f}),
       {0.5 / z2, 1 / z2, 0, std::sqrt(0.5) / z2, std::sqrt(0.1) / z2});
  // After top-k: top-k 4 drops 1/20, min-p 0.15 then drops 1/10.
  near(run({.temperature = 1.0f, .top_k = 4, .min_p = 0.15f}),
       {0.25 / 1.75, 1 / 1.75, 0, 0.5 / 1.75, 0});
}

// Backend::apply_logit_rules on hand values: a verify block of 3 rows [anchor, d_1 = 4, d_2 = 4]
// (row r counts d_1 .. d_r as output), rules: token 1 generated twice and in the prompt, token 2
// in the prompt only, token 3 a stop token forbidden for the first 2 rows, token 0 biased;
// repetition 2, frequency 0.5, presence 0.25. From row 2 on the stop token keeps its logit; rows
// of no request (row 3) stay as they are.
TEST_F(SamplingOps, LogitRulesCountTheBlocksDraftsRowByRow) {
  const std::vector<float> x = {1.0f, 3.0f, -1.0f, 0.5f, 2.0f, 1.0f,   // row 0
                                1.0f, 3.0f, -1.0f, 0.5f, 2.0f, 1.0f,   // row 1
                                1.0f, 3.0f, -1.0f, 0.5f, 2.0f, 1.0f,   // row 2
                                1.0f, 3.0f, -1.0f, 0.5f, 2.0f, 1.0f};  // row 3 (no rules)
  const Tensor logits = upload(*be_, x, 4);
  const Tensor row_tokens = upload_ints(*be_, {7, 4, 4, 9});
  const std::vector<sampling::TokenRule> rules = {{.token = 0, .count = 0, .bias = 1.5f},
                                                  {.token = 1, .count = 2, .in_prompt = 1},
                                                  {.token = 2, .count = 0, .in_prompt = 1},
                                                  {.token = 3, .count = 0, .stop = 1}};
  const sampling::LogitRules req{.first_row = 0,
                                 .rows = 3,
                                 .repetition = 2.0f,
                                 .frequency = 0.5f,
                                 .presence = 0.25f,
                                 .stop_rows = 2,
                                 .tokens = rules};
  be_->apply_logit_rules(logits, row_tokens, {&req, 1});
  const std::vector<float> got = be_->to_host_f32(logits);
  const float inf = std::numeric_limits<float>::infinity();
  // token 0: 1 + 1.5; token 1: 3 / 2 - 0.5 * 2 - 0.25; token 2: -1 * 2; token 5: untouched.
  // token 4: row 0 untouched; row 1 count 1: 2 / 2 - 0.5 - 0.25; row 2 count 2: 1 - 1 - 0.25.
  const std::vector<float> want = {2.5f, 0.25f, -2.0f, -inf, 2.0f,   1.0f,   // row 0
                                   2.5f, 0.25f, -2.0f, -inf, 0.25f,  1.0f,   // row 1
                                   2.5f, 0.25f, -2.0f, 0.5f, -0.25f, 1.0f,   // row 2
                                   1.0f, 3.0f,  -1.0f, 0.5f, 2.0f,   1.0f};  // row 3
  EXPECT_EQ(got, want);
}

TEST_F(SamplingOps, TiesAtACutAreKeptTogether) {
  // Three logits tie at 3: top-k 2 keeps all three (HF's rule), top-k 4 adds the 2.
  const std::vector<float> x = {1, 3, 3, 2, 3};
  std::vector<float> p(x.size());
  sampling::filtered_probs(x, {.temperature = 1, .top_k = 2}, p);
  EXPECT_EQ(p, (std::vector<float>{0, 1.0f / 3, 1.0f / 3, 0, 1.0f / 3}));
  sampling::filtered_probs(x, {.temperature = 1, .top_k = 4}, p);
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_GT(p[3], 0.0f);
  // top-p 0.1: the group of 3s reaches it alone, and is kept whole.
  sampling::filtered_probs(x, {.temperature = 1, .top_p = 0.1f}, p);
  EXPECT_EQ(p, (std::vector<float>{0, 1.0f / 3, 1.0f / 3, 0, 1.0f / 3}));
  // -0 and +0 are one value.
  const std::vector<float> zeros = {0.0f, -0.0f, -1.0f};
  p.resize(3);
  sampling::filtered_probs(zeros, {.temperature = 1, .top_k = 1}, p);
  EXPECT_EQ(p[0], 0.5f);
  EXPECT_EQ(p[1], 0.5f);
  EXPECT_EQ(p[2], 0.0f);
  // Greedy: one-hot at the first maximum.
  p.resize(x.size());
  sampling::filtered_probs(x, {.temperature = 0}, p);
  EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0, 0}));
  // A subnormal temperature: the maximum's group only, no NaN.
  sampling::filtered_probs(x, {.temperature = 1e-40f}, p);
  EXPECT_EQ(p, (std::vector<float>{0, 1.0f / 3, 1.0f / 3, 0, 1.0f / 3}));
}

TEST_F(SamplingOps, FilteredProbsRowsEqualTheHostSampler) {
  const int64_t v = 500, n = 6;
  std::vector<float> x;
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> row = random_logits(rng_, v, static_cast<int>(r % 4));
    x.insert(x.end(), row.begin(), row.end());
  }
  const std::vector<SamplingParams> params = {{.temperature = 0.8f, .top_p = 0.9f},
                                              {.temperature = 1.3f, .top_k = 40},
                                              {.temperature = 0.6f, .top_k = 200, .top_p = 0.95f},
                                              {.temperature = 1.0f},
                                              {.temperature = 0.0f},
                                              {.temperature = 2.0f, .top_k = 1}};
  std::vector<FilterParams> filters;
  for (const auto& sp : params) filters.push_back(Sampler(sp).filter());
  const Tensor logits = upload(*be_, x, n);
  const Tensor probs = be_->empty({n, v}, DType::kF32);
  be_->filtered_probs(probs, logits, filters);
  const std::vector<float> got = be_->to_host_f32(probs);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> want;
    Sampler(params[r]).probs(std::span<const float>(x).subspan(r * v, v), &want);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + r * v)) << "row " << r;
  }
}

TEST_F(SamplingOps, DrawIsTheInverseCdf) {
  const std::vector<float> w = {0, 0.25f, 0, 0.5f, 0.25f};
  const auto draw = [&](float u) { return sampling::draw_index(w, u); };
  EXPECT_EQ(draw(0.0f), 1);
  EXPECT_EQ(draw(0.2499f), 1);
  EXPECT_EQ(draw(0.25f), 3);  // C_1 = 0.25 is not > 0.25
  EXPECT_EQ(draw(0.7499f), 3);
  EXPECT_EQ(draw(0.75f), 4);
  EXPECT_EQ(draw(1.0f - 0x1p-24f), 4);
  // Unnormalised weights; negative and NaN weights count as zero.
  const std::vector<float> u3 = {-1.0f, 3.0f, std::nanf(""), 6.0f};
  EXPECT_EQ(sampling::draw_index(u3, 0.3f), 1);
  EXPECT_EQ(sampling::draw_index(u3, 0.34f), 3);
  EXPECT_EQ(sampling::draw_index(std::vector<float>{0, 0, 0}, 0.5f), 0);  // degenerate

  // The op on many rows, at uniforms in the middle of a chosen index's interval.
  const int64_t v = 300, n = 40;
  std::vector<float> weights(n * v);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float& e : weights) e = unit(rng_) < 0.3f ? 0.0f : unit(rng_) * 5.0f;
  std::vector<float> uniforms(n);
  std::vector<int32_t> want(n);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = weights.data() + r * v;
    double total = 0;
    for (int64_t i = 0; i < v; ++i) total += row[i];
    int64_t j = static_cast<int64_t>(unit(rng_) * v);
    while (row[j] == 0) j = (j + 1) % v;
    double before = 0;
    for (int64_t i = 0; i < j; ++i) before += row[i];
    uniforms[r] = static_cast<float>((before + 0.5 * row[j]) / total);
    want[r] = static_cast<int32_t>(j);
  }
  const Tensor out = be_->empty({n}, DType::kI32);
  be_->sample_from_probs(out, upload(*be_, weights, n), upload(*be_, uniforms, 1).view({n}));
  std::vector<int32_t> got(n);
  be_->copy_to_host(got.data(), out);
  EXPECT_EQ(got, want);
}

// Random target / draft distributions for k drafts: p from logits, q from perturbed logits,
// drafts drawn from q.
struct Block {
  int64_t k = 0, v = 0;
  std::vector<float> q, p;
  std::vector<int32_t> drafts;
};
Block random_block(std::mt19937_64& rng, int64_t k, int64_t v) {
  Block b{.k = k, .v = v};
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const FilterParams f{.temperature = 0.9f, .top_k = static_cast<int32_t>(v / 2), .top_p = 0.95f};
  std::vector<float> row(v), probs(v);
  for (int64_t i = 0; i <= k; ++i) {
    const std::vector<float> x = random_logits(rng, v, 0);
    sampling::filtered_probs(x, f, probs);
    b.p.insert(b.p.end(), probs.begin(), probs.end());
    if (i == k) break;
    for (int64_t j = 0; j < v; ++j) row[j] = x[j] + 0.7f * noise(rng);
    sampling::filtered_probs(row, f, probs);
    b.q.insert(b.q.end(), probs.begin(), probs.end());
    b.drafts.push_back(sampling::draw_index(probs, unit(rng)));
  }
  return b;
}

TEST_F(SamplingOps, RejectionSampleEqualsAcceptSampled) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::map<int64_t, int> accepted;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t k = trial % 6, v = 97;
    const Block b = random_block(rng_, k, v);
    std::vector<float> uniforms(k + 1);
    for (float& u : uniforms) u = unit(rng_);
    const AcceptResult want = accept_sampled(b.drafts, b.q, b.p, v, uniforms);
    const Tensor out = be_->empty({k + 2}, DType::kI32);
    be_->rejection_sample(out, k ? upload_ints(*be_, b.drafts) : Tensor(),
                          k ? upload(*be_, b.q, k) : Tensor(), upload(*be_, b.p, k + 1),
                          upload(*be_, uniforms, 1).view({k + 1}));
    std::vector<int32_t> got(k + 2);
    be_->copy_to_host(got.data(), out);
    // [a, next, d_1 .. d_k]: greedy_accept's row layout.
    ASSERT_EQ(got[0], want.accepted) << "trial " << trial;
    EXPECT_EQ(got[1], want.next);
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(got[2 + i], b.drafts[i]);
    ++accepted[want.accepted];
  }
  EXPECT_GT(accepted[0], 10);  // rejections at the first draft and later ones both occur
  EXPECT_GT(accepted[1] + accepted[2] + accepted[3], 10);
}

TEST_F(SamplingOps, RejectionFallsBackToPWhenTheResidualIsZero) {
  // q = 2p (unnormalised): max(p - q, 0) is all zero, so a rejection draws from p itself.
  const std::vector<float> p = {0.0f, 0.5f, 0.5f, 0.25f, 0.25f, 0.5f};
  const std::vector<float> q = {0.0f, 1.0f, 1.0f};
  const std::vector<int32_t> drafts = {1};
  AcceptResult r = accept_sampled(drafts, q, p, 3, std::vector<float>{0.6f, 0.1f});
  EXPECT_EQ(r.accepted, 0);  // 0.6 * 1 >= 0.5
  EXPECT_EQ(r.next, 1);      // from p_0 = {0, .5, .5} at 0.1
  r = accept_sampled(drafts, q, p, 3, std::vector<float>{0.4f, 0.9f});
  EXPECT_EQ(r.accepted, 1);  // bonus from p_1 at 0.9
  EXPECT_EQ(r.next, 2);
  r = accept_sampled({}, {}, std::span<const float>(p).first(3), 3, std::vector<float>{0.7f});
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next, 2);
}

// ---- DeviceSampling (the engine's device path) on the CPU backend ----

TEST_F(SamplingOps, DeviceSamplingGivesTheHostSamplersTokens) {
  const int64_t v = 200, n = 5;
  const SamplingParams params{.temperature = 0.9f, .top_k = 50, .top_p = 0.9f, .seed = 77};
  Sampler device_sampler(params), host_sampler(params);
  DeviceSampling dev(*be_);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> x;
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> row = random_logits(rng_, v, step % 3);
      x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<int32_t> got;
    dev.sample(device_sampler, upload(*be_, x, n), &got);
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(got[r], host_sampler.sample(std::span<const float>(x).subspan(r * v, v)));
    }
  }
}

TEST_F(SamplingOps, DeviceDrawsFollowTheFilteredDistribution) {
  const int64_t v = 40, rows = 1000, calls = 100;
  const std::vector<float> x = random_logits(rng_, v, 1);
  const SamplingParams params{.temperature = 0.8f, .top_k = 25, .top_p = 0.9f, .seed = 5};
  std::vector<float> repeated;
  for (int64_t r = 0; r < rows; ++r) repeated.insert(repeated.end(), x.begin(), x.end());
  const Tensor logits = upload(*be_, repeated, rows);
  Sampler sampler(params);
  DeviceSampling dev(*be_);
  const auto counts = test_util::count_device_draws(dev, sampler, logits, calls);
  const std::map<int32_t, double> want = test_util::support(naive_probs(x, sampler.filter()));
  ASSERT_GT(want.size(), 3u);
  std::string detail;
  EXPECT_GT(goodness_of_fit(counts, want, rows * calls, &detail), kAlpha) << detail;
}

TEST_F(SamplingOps, DeviceAcceptGivesTheHostPathsTokensAndTheTargetDistribution) {
  const int64_t v = 30, k = 3;
  const SamplingParams params{.temperature = 1.0f, .top_p = 0.95f, .seed = 9};
  // Fixed target and draft logits (the drafter is a noisy copy of the target).
  std::vector<float> target, draft;
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (int64_t i = 0; i <= k; ++i) {
    const std::vector<float> x = random_logits(rng_, v, 0);
    target.insert(target.end(), x.begin(), x.end());
    if (i == k) break;
    for (float e : x) draft.push_back(e + noise(rng_));
  }
  const Tensor target_logits = upload(*be_, target, k + 1);
  const Tensor draft_logits = upload(*be_, draft, k);
  Sampler device_sampler(params), host_sampler(params);
  DeviceSampling drafts_dev(*be_), target_dev(*be_);
  std::vector<float> q, p, row;
  for (int64_t i = 0; i <= k; ++i) {
    host_sampler.probs(std::span<const float>(target).subspan(i * v, v), &row);
    p.insert(p.end(), row.begin(), row.end());
  }
  std::map<int32_t, int64_t> first;
  const int64_t n = 20000;
  std::vector<int32_t> drafts;
  for (int64_t t = 0; t < n; ++t) {
    drafts_dev.sample(device_sampler, draft_logits, &drafts);
    const AcceptResult got = target_dev.accept(device_sampler, drafts_dev, target_logits);
    // The host path from an identically seeded sampler.
    std::vector<int32_t> host_drafts;
    q.clear();
    for (int64_t i = 0; i < k; ++i) {
      host_sampler.probs(std::span<const float>(draft).subspan(i * v, v), &row);
      host_drafts.push_back(host_sampler.sample_from(row));
      q.insert(q.end(), row.begin(), row.end());
    }
    const AcceptResult want = accept_sampled(host_drafts, q, p, v, host_sampler);
    ASSERT_EQ(drafts, host_drafts) << "step " << t;
    ASSERT_EQ(got.accepted, want.accepted) << "step " << t;
    ASSERT_EQ(got.next, want.next) << "step " << t;
    ++first[got.accepted > 0 ? drafts[0] : got.next];
  }
  const std::vector<float> p0(p.begin(), p.begin() + v);
  std::string detail;
  EXPECT_GT(goodness_of_fit(first, test_util::support(p0), n, &detail), kAlpha) << detail;
}

// ---- Plain sampled generation, drawn on the device, on stories260K ----

class PlainSampled : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", *be_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
  }
  std::vector<int32_t> generate(const SamplingParams& sampling, int64_t max_tokens = 24) {
    return test_util::generate_sampled(*target_, prompt_, sampling, max_tokens);
  }
  std::unique_ptr<Backend> be_ = make_cpu_backend(2);
  std::unique_ptr<CausalLM> target_;
  const std::vector<int32_t> prompt_ = {1, 403, 407, 261};
};

TEST_F(PlainSampled, SeededGenerationIsReproducible) {
  SamplingParams s{.temperature = 1.0f, .top_p = 0.9f, .seed = 11};
  const std::vector<int32_t> a = generate(s);
  ASSERT_EQ(a.size(), 24u);
  EXPECT_EQ(generate(s), a);
  s.seed = 12;
  EXPECT_NE(generate(s), a);
}

TEST_F(PlainSampled, DeviceDrawsEqualTheHostSamplerFromTheSameSeed) {
  const SamplingParams s{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 3};
  const std::vector<int32_t> got = generate(s, 16);
  // The same generation drawn on the host from full-context logits.
  Sampler host(s);
  std::vector<int32_t> ctx = prompt_, want;
  for (size_t i = 0; i < got.size(); ++i) {
    want.push_back(host.sample(test_util::forward_logits(*target_, ctx, 1)));
    ctx.push_back(want.back());
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace bs
