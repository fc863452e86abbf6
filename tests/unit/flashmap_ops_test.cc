// The backend ops added for the FlashMap drafter, on the CPU reference against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace bs {
namespace {

class FlashMapOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend(2);
  std::mt19937 rng_{7};

  std::vector<float> random(size_t n) {
    std::normal_distribution<float> d;
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  Tensor make(std::initializer_list<int64_t> shape, const std::vector<float>& data) {
    Tensor t = be_->empty(shape, DType::kF32);
    EXPECT_EQ(static_cast<size_t>(t.numel()), data.size());
    be_->copy_from_host(t, data.data());
    return t;
  }
  Tensor ids(const std::vector<int32_t>& v) {
    Tensor t = be_->empty({static_cast<int64_t>(v.size())}, DType::kI32);
    be_->copy_from_host(t, v.data());
    return t;
  }
};

TEST_F(FlashMapOps, GemmAllTransposes) {
  const int64_t n = 5, k = 7, m = 3;
  const std::vector<float> a = random(n * k), b = random(k * m);  // a [n,k], b [k,m]
  std::vector<float> at(k * n), bt(m * k), want(n * m, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t l = 0; l < k; ++l) at[l * n + i] = a[i * k + l];
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < m; ++j) bt[j * k + l] = b[l * m + j];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t l = 0; l < k; ++l) want[i * m + j] += a[i * k + l] * b[l * m + j];
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      Tensor ta_t = ta ? make({k, n}, at) : make({n, k}, a);
      Tensor tb_t = tb ? make({m, k}, bt) : make({k, m}, b);
      Tensor y = be_->empty({n, m}, DType::kF32);
      be_->gemm(y, ta_t, tb_t, ta, tb);
      const std::vector<float> got = be_->to_host_f32(y);
      for (int64_t i = 0; i < n * m; ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << ta << tb << i;
    }
  }
}

TEST_F(FlashMapOps, SliceAndScatterColumns) {
  const std::vector<float> src = random(3 * 10);
  Tensor s = make({3, 10}, src);
  Tensor d = be_->empty({3, 4}, DType::kF32);
  be_->slice_columns(d, s, 5);
  const std::vector<float> got = be_->to_host_f32(d);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], src[i * 10 + 5 + j]);

  Tensor wide = be_->empty({3, 12}, DType::kF32);
  be_->scatter_columns(wide, d, ids({9, 2, 11, 0}), -std::numeric_limits<float>::infinity());
  const std::vector<float> w = be_->to_host_f32(wide);
  const int cols[4] = {9, 2, 11, 0};
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 12; ++j) {
      float want = -std::numeric_limits<float>::infinity();
      for (int c = 0; c < 4; ++c)
        if (cols[c] == j) want = got[i * 4 + c];
      EXPECT_EQ(w[i * 12 + j], want);
    }
  }
}

TEST_F(FlashMapOps, GatedAddAxpbySoftmax) {
  const std::vector<float> y0 = random(4 * 6), x = random(4 * 6), g = random(6);
  Tensor y = make({4, 6}, y0);
  be_->gated_add(y, make({4, 6}, x), make({6}, g));
  std::vector<float> got = be_->to_host_f32(y);
  for (int64_t i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(got[i], y0[i] + g[i % 6] * x[i]);

  Tensor xa = make({4, 6}, x);
  be_->axpby(xa, 0.25f, xa, -1.5f, make({4, 6}, y0));
  got = be_->to_host_f32(xa);
  for (int64_t i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(got[i], 0.25f * x[i] - 1.5f * y0[i]);

  Tensor sm = be_->empty({4, 6}, DType::kF32);
  be_->softmax(sm, make({4, 6}, x), 3.0f);
  got = be_->to_host_f32(sm);
  for (int64_t r = 0; r < 4; ++r) {
    double z = 0;
    for (int64_t i = 0; i < 6; ++i) z += std::exp(3.0 * x[r * 6 + i]);
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(got[r * 6 + i], std::exp(3.0 * x[r * 6 + i]) / z, 1e-6);
    }
  }
  // Scale 0: uniform.
  be_->softmax(sm, make({4, 6}, x), 0.0f);
  got = be_->to_host_f32(sm);
  for (float v : got) EXPECT_FLOAT_EQ(v, 1.0f / 6.0f);
}

TEST_F(FlashMapOps, NoiseCombine) {
  const int64_t n = 3, d = 5, e = 4;
  const std::vector<float> base = random(d), x = random(n * d), z = random(n * e);
  std::vector<float> w = random(e);
  for (float& v : w) v = std::abs(v);
  Tensor y = be_->empty({n, d}, DType::kF32);
  be_->noise_combine(y, make({d}, base), make({n, d}, x), make({n, e}, z), make({e}, w), 0.7f,
                     1e-5f);
  const std::vector<float> got = be_->to_host_f32(y);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < e; ++i) ss += w[i] * z[r * e + i] * z[r * e + i];
    const double s = 0.7 / std::sqrt(ss + 1e-5);
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(got[r * d + i], base[i] + s * x[r * d + i], 1e-5);
  }
}

// The generator exactly as backend.h documents it.
float documented_normal(uint64_t seed, uint32_t stream, int32_t pos, int64_t c) {
  auto mix = [](uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  const uint64_t h =
      mix(mix(mix(mix(seed) ^ stream) ^ static_cast<uint64_t>(pos)) ^ static_cast<uint64_t>(c / 2));
  const double u1 = static_cast<double>((h >> 40) + 1) / 16777216.0;
  const double u2 = static_cast<double>((h >> 16) & 0xFFFFFF) / 16777216.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * 3.14159265358979323846 * u2;
  return static_cast<float>(c % 2 == 0 ? r * std::cos(a) : r * std::sin(a));
}

TEST_F(FlashMapOps, SeededNormalIsKeyedAndStandard) {
  const int64_t n = 4, d = 7;
  Tensor pos = ids({12, 13, 14, 3});
  Tensor a = be_->empty({n, d}, DType::kF32), b = be_->empty({n, d}, DType::kF32);
  be_->seeded_normal(a, pos, 42, 0, 1.0f);
  be_->seeded_normal(b, pos, 42, 0, 1.0f);
  const std::vector<float> va = be_->to_host_f32(a), vb = be_->to_host_f32(b);
  EXPECT_EQ(va, vb);  // same key, same values
  const int32_t p[4] = {12, 13, 14, 3};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(va[r * d + c], documented_normal(42, 0, p[r], c));
  // A row depends on its position only, not on its place in the batch.
  Tensor one = be_->empty({1, d}, DType::kF32);
  be_->seeded_normal(one, ids({14}), 42, 0, 1.0f);
  const std::vector<float> vo = be_->to_host_f32(one);
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(vo[c], va[2 * d + c]);
  // Seed, stream and scale matter.
  be_->seeded_normal(b, pos, 43, 0, 1.0f);
  EXPECT_NE(be_->to_host_f32(b), va);
  be_->seeded_normal(b, pos, 42, 1, 1.0f);
  EXPECT_NE(be_->to_host_f32(b), va);
  be_->seeded_normal(b, pos, 42, 0, 0.5f);
  const std::vector<float> half = be_->to_host_f32(b);
  for (size_t i = 0; i < half.size(); ++i) EXPECT_FLOAT_EQ(half[i], 0.5f * va[i]);
  be_->seeded_normal(b, pos, 42, 0, 0.0f);
  for (float v : be_->to_host_f32(b)) EXPECT_EQ(v, 0.0f);

  // Moments over many draws.
  const int64_t rows = 512, cols = 256;
  std::vector<int32_t> many(rows);
  for (int64_t i = 0; i < rows; ++i) many[i] = static_cast<int32_t>(i);
  Tensor big = be_->empty({rows, cols}, DType::kF32);
  be_->seeded_normal(big, ids(many), 7, 0, 1.0f);
  double sum = 0, sq = 0, quart = 0;
  for (float v : be_->to_host_f32(big)) {
    sum += v;
    sq += static_cast<double>(v) * v;
    quart += static_cast<double>(v) * v * v * v;
  }
  const double count = static_cast<double>(rows * cols);
  EXPECT_NEAR(sum / count, 0.0, 0.01);
  EXPECT_NEAR(sq / count, 1.0, 0.02);
  EXPECT_NEAR(quart / count, 3.0, 0.1);
}

}  // namespace
}  // namespace bs
