// The CPU reference of the Backend ops added for DSpark / DFlash2, on hand-checkable values:
// topk's order and tie rule, scale_softcap, dynamic_conv's taps, groups and block boundaries, the
// Markov row and chain, and the chain's norm bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace bs {
namespace {

class RelativeOps : public ::testing::Test {
 protected:
  Tensor f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    Tensor t = be_->empty(shape, DType::kF32);
    be_->copy_from_host(t, v.data());
    return t;
  }
  std::unique_ptr<Backend> be_ = make_cpu_backend(1);
};

TEST_F(RelativeOps, TopkDescendingTiesToLowerIndex) {
  const Tensor x = f32({2, 6}, {1, 5, 3, 5, -INFINITY, 2,  //
                                0, 0, 0, 0, 0, 7});
  Tensor vals = be_->empty({2, 4}, DType::kF32), ids = be_->empty({2, 4}, DType::kI32);
  be_->topk(vals, ids, x);
  std::vector<int32_t> i(8);
  be_->copy_to_host(i.data(), ids);
  EXPECT_EQ(i, (std::vector<int32_t>{1, 3, 2, 5, 5, 0, 1, 2}));
  EXPECT_EQ(be_->to_host_f32(vals), (std::vector<float>{5, 5, 3, 2, 7, 0, 0, 0}));
}

TEST_F(RelativeOps, ScaleSoftcap) {
  const Tensor x = f32({3}, {1.0f, -40.0f, 0.0f});
  Tensor y = be_->empty({3}, DType::kF32);
  be_->scale_softcap(y, x, 0.5f, 0.0f);
  EXPECT_EQ(be_->to_host_f32(y), (std::vector<float>{0.5f, -20.0f, 0.0f}));
  be_->scale_softcap(y, x, 0.5f, 10.0f);
  const std::vector<float> got = be_->to_host_f32(y);
  EXPECT_FLOAT_EQ(got[0], 10.0f * std::tanh(0.05f));
  EXPECT_FLOAT_EQ(got[1], 10.0f * std::tanh(-2.0f));
}

TEST_F(RelativeOps, DynamicConvTapsGroupsAndBlocks) {
  // 2 blocks of 2 rows, H = 4 in groups of 2 (G = 2), K = 2 taps.
  const Tensor x = f32({4, 4}, {1, 2, 3, 4,     //
                                5, 6, 7, 8,     //
                                9, 10, 11, 12,  //
                                13, 14, 15, 16});
  // dyn[i, which, t, g]: which 0 all zero; which 1: row i, tap t, group g = 0.1 * (i + 1) for
  // t = 0 and 1 for t = 1, group 1 gets +1.
  std::vector<float> d(4 * 2 * 2 * 2, 0.0f);
  for (int i = 0; i < 4; ++i) {
    for (int t = 0; t < 2; ++t) {
      for (int g = 0; g < 2; ++g) {
        d[((i * 2 + 1) * 2 + t) * 2 + g] =
            (t == 0 ? 0.1f * (i + 1) : 1.0f) + (g == 1 ? 1.0f : 0.0f);
      }
    }
  }
  const Tensor dyn = f32({4, 8}, d);
  const Tensor base = f32({2, 4}, {1, 1, 1, 1,  //
                                   0.5f, 0.5f, 0.5f, 0.5f});
  Tensor y = be_->empty({4, 4}, DType::kF32);
  // which 0: dynamic part zero -> y[i] = x[i] + 0.5 x[i - 1] within each block.
  be_->dynamic_conv(y, x, dyn, 0, base, 2, 2, false);
  EXPECT_EQ(be_->to_host_f32(y), (std::vector<float>{1, 2, 3, 4,         //
                                                     5.5f, 7, 8.5f, 10,  //
                                                     9, 10, 11, 12,      //
                                                     17.5f, 19, 20.5f, 22}));
  // which 1, accumulate: row 1 (second row of block 0), channel 2 (group 1):
  //   (1 + 0.2 + 1) * 7 + (0.5 + 1 + 1) * 3 = 15.4 + 7.5 = 22.9, added to the 8.5 already there.
  be_->dynamic_conv(y, x, dyn, 1, base, 2, 2, true);
  const std::vector<float> got = be_->to_host_f32(y);
  EXPECT_FLOAT_EQ(got[1 * 4 + 2], 8.5f + 22.9f);
  // Row 2 starts block 1: no tap reaches row 1. Channel 0 (group 0): (1 + 0.3) * 9.
  EXPECT_FLOAT_EQ(got[2 * 4 + 0], 9.0f + 1.3f * 9.0f);
}

TEST_F(RelativeOps, MarkovRowOnHandValues) {
  // V = 3, r = 2.
  const Tensor w1 = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor w2 = f32({3, 2}, {1, 2, 3, -1, 0, 0.5f});
  const Tensor u = f32({1, 3}, {0.5f, 0, 2});
  Tensor z = be_->empty({1, 3}, DType::kF32), prev = be_->empty({1}, DType::kI32);
  Tensor arg = be_->empty({1}, DType::kI32);
  int32_t p = 1, a = -1;  // e = [0, 1]: w2 · e = [2, -1, 0.5]
  be_->copy_from_host(prev, &p);
  be_->markov_row(z, arg, u, prev, w1, w2);
  be_->copy_to_host(&a, arg);
  EXPECT_EQ(be_->to_host_f32(z), (std::vector<float>{2.5f, -1, 2.5f}));
  EXPECT_EQ(a, 0);  // tie of 0 and 2: the first index
  p = 0;            // e = [1, 0]: [1, 3, 0]
  be_->copy_from_host(prev, &p);
  be_->markov_row(Tensor(), arg, u, prev, w1, w2);
  be_->copy_to_host(&a, arg);
  EXPECT_EQ(a, 1);
}

// markov_chain (DSpark's greedy chain) on the values above: prev_0 = the anchor, each row's
// argmax feeding the next row (the rows worked by hand).
TEST_F(RelativeOps, MarkovChainOnHandValues) {
  const Tensor w1 = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor w2 = f32({3, 2}, {1, 2, 3, -1, 0, 0.5f});
  // Row 0, prev 1 (e = [0, 1], w2 · e = [2, -1, 0.5]): z = [2.5, -1, 2.5] -> 0 (tie, first).
  // Row 1, prev 0 (e = [1, 0]: [1, 3, 0]): z = [1, 3, 3.5] -> 2.
  // Row 2, prev 2 (e = [1, 1]: [3, 2, 0.5]): z = [3, 2, 0.5] -> 0.
  const Tensor u = f32({3, 3}, {0.5f, 0, 2,  //
                                0, 0, 3.5f,  //
                                0, 0, 0});
  const std::vector<float> nv = markov_norm_bounds(be_->to_host_f32(w2), 3, 2);
  const Tensor norms = f32({3}, nv);
  Tensor anchor = be_->empty({1}, DType::kI32), drafts = be_->empty({3}, DType::kI32);
  const int32_t a = 1;
  be_->copy_from_host(anchor, &a);
  for (const bool with_norms : {false, true}) {
    be_->markov_chain(drafts, anchor, u, w1, w2, with_norms ? norms : Tensor());
    std::vector<int32_t> d(3, -1);
    be_->copy_to_host(d.data(), drafts);
    EXPECT_EQ(d, (std::vector<int32_t>{0, 2, 0})) << "norms " << with_norms;
  }
}

// markov_norm_bounds: never below the exact norm (long double here), at most 3 float ulps above,
// on random rows, rows of tiny and huge values and an all-zero row.
TEST(MarkovNormBounds, BoundTheExactNormsTightly) {
  const int64_t v = 500, r = 37;
  std::vector<float> w(static_cast<size_t>(v * r));
  uint64_t s = 12345;
  for (size_t i = 0; i < w.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(static_cast<int64_t>(s >> 40) - (1ll << 23)) * 0x1p-23f;
    const int64_t row = static_cast<int64_t>(i) / r;
    w[i] = row == 0 ? 0.0f : row % 3 == 1 ? x * 1e-20f : row % 3 == 2 ? x * 1e20f : x;
  }
  const std::vector<float> n = markov_norm_bounds(w, v, r);
  ASSERT_EQ(n.size(), static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) {
    long double ss = 0;
    for (int64_t c = 0; c < r; ++c) ss += static_cast<long double>(w[i * r + c]) * w[i * r + c];
    const long double exact = std::sqrt(ss);
    EXPECT_GE(static_cast<long double>(n[i]), exact) << "row " << i;
    float up = static_cast<float>(exact);
    for (int step = 0; step < 3; ++step) up = std::nextafter(up, INFINITY);
    EXPECT_LE(n[i], up) << "row " << i;
  }
}

TEST_F(RelativeOps, CandidateWalkOnHandValues) {
  // V = 4, r = 1, k = 2 rows of t = 2 candidates.
  const Tensor pred = f32({4, 1}, {1, 2, 0, -1}), succ = f32({4, 1}, {1, 1, 2, 3});
  const Tensor scale = f32({2, 1}, {1, 0.5f});
  const Tensor vals = f32({2, 2}, {1, 0, 0, 0.5f});
  Tensor ids = be_->empty({2, 2}, DType::kI32), anchor = be_->empty({1}, DType::kI32);
  const std::vector<int32_t> idv = {2, 3, 0, 1};
  const int32_t a = 1;
  be_->copy_from_host(ids, idv.data());
  be_->copy_from_host(anchor, &a);
  Tensor drafts = be_->empty({2}, DType::kI32), rows = be_->empty({2, 4}, DType::kF32);
  std::vector<int32_t> d(2);
  // Row 0: prev 1, a = 2: s = [1 + 2 * 2, 0 + 2 * 3] = [5, 6] -> 3. Row 1: prev 3, a = -1, scale
  // 0.5: s = [0 - 0.5, 0.5 - 0.5] = [-0.5, 0] -> 1.
  be_->candidate_walk(drafts, rows, Tensor(), anchor, vals, ids, pred, succ, scale,
                      {.temperature = 0.0f}, Tensor());
  be_->copy_to_host(d.data(), drafts);
  EXPECT_EQ(d, (std::vector<int32_t>{3, 1}));
  const float ninf = -INFINITY;
  EXPECT_EQ(be_->to_host_f32(rows), (std::vector<float>{ninf, ninf, 5, 6, -0.5f, 0, ninf, ninf}));
  // Sampled at T = 1: row 0's q = softmax over ids 2, 3 of [5, 6]; the CDF runs in id order, so
  // u = 0.1 draws id 2 and u = 0.5 id 3. Row 1 (prev 2, a = 0): s = [0, 0.5].
  for (const float u0 : {0.1f, 0.5f}) {
    const Tensor us = f32({2}, {u0, 0.9f});
    Tensor q = be_->empty({2, 4}, DType::kF32);
    be_->candidate_walk(drafts, Tensor(), q, anchor, vals, ids, pred, succ, scale,
                        {.temperature = 1.0f}, us);
    be_->copy_to_host(d.data(), drafts);
    const std::vector<float> qv = be_->to_host_f32(q);
    const float q3 = 1.0f / (1.0f + std::exp(-1.0f));
    EXPECT_NEAR(qv[2], 1 - q3, 1e-6);
    EXPECT_NEAR(qv[3], q3, 1e-6);
    EXPECT_EQ(qv[0], 0.0f);
    EXPECT_EQ(d[0], u0 < 0.5f ? 2 : 3);
    if (d[0] == 2) {
      EXPECT_EQ(d[1], 1);  // u = 0.9 against [0.38, 0.62] in id order: id 1
      EXPECT_NEAR(qv[4 + 1], 1.0f / (1.0f + std::exp(-0.5f)), 1e-6);
    }
  }
  // Without a rank part the scores are vals; exact ties go to the lower id, not the lower slot.
  const Tensor tied = f32({1, 2}, {3, 3});
  const std::vector<int32_t> tid = {2, 1};
  Tensor ids1 = be_->empty({1, 2}, DType::kI32);
  be_->copy_from_host(ids1, tid.data());
  be_->candidate_walk(drafts.rows(0, 1), Tensor(), Tensor(), anchor, tied, ids1, Tensor(), Tensor(),
                      Tensor(), {.temperature = 0.0f}, Tensor());
  be_->copy_to_host(d.data(), drafts);
  EXPECT_EQ(d[0], 1);
}

}  // namespace
}  // namespace bs
