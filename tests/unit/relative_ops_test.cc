// The CPU reference of the Backend ops added for DSpark / DFlash2, on hand-checkable values:
// topk's order and tie rule, scale_softcap, and dynamic_conv's taps, groups and block boundaries.
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace bs
