// CPU reference ops against straightforward formulas written out in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace bs {
namespace {

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend(2);
  std::mt19937 rng_{42};

  Tensor random(std::initializer_list<int64_t> shape) {
    Tensor t = be_->empty(shape);
    std::normal_distribution<float> d;
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(rng_);
    return t;
  }
  Tensor ints(const std::vector<int32_t>& v) {
    Tensor t = be_->empty({static_cast<int64_t>(v.size())}, DType::kI32);
    be_->copy_from_host(t, v.data());
    return t;
  }
};

TEST_F(CpuOps, MatmulBiasAccumulate) {
  const int64_t n = 5, k = 37, m = 300;  // m large enough to split across threads
  Tensor x = random({n, k}), w = random({m, k}), b = random({m}), y = random({n, m});
  std::vector<float> y0(y.as<float>(), y.as<float>() + n * m);
  be_->matmul(y, x, w, &b, /*accumulate=*/true);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = y0[i * m + j] + b.as<float>()[j];
      for (int64_t c = 0; c < k; ++c)
        ref += double(x.as<float>()[i * k + c]) * w.as<float>()[j * k + c];
      ASSERT_NEAR(y.as<float>()[i * m + j], ref, 1e-4);
    }
  }
}

TEST_F(CpuOps, RmsNormPerHead) {
  Tensor x = random({3, 4, 8}), w = random({8}), y = be_->empty({3, 4, 8});
  be_->rms_norm(y, x, w, 1e-6f);
  for (int64_t r = 0; r < 12; ++r) {
    double ss = 0;
    for (int c = 0; c < 8; ++c) ss += std::pow(x.as<float>()[r * 8 + c], 2);
    const double inv = 1 / std::sqrt(ss / 8 + 1e-6);
    for (int c = 0; c < 8; ++c) {
      ASSERT_NEAR(y.as<float>()[r * 8 + c], x.as<float>()[r * 8 + c] * inv * w.as<float>()[c],
                  1e-5);
    }
  }
}

TEST_F(CpuOps, RopeRotatesHalves) {
  Tensor x = random({2, 3, 8});
  std::vector<float> x0(x.as<float>(), x.as<float>() + x.numel());
  const std::vector<float> inv{1.0f, 0.1f, 0.01f, 0.001f};
  Tensor inv_t = be_->upload_weight(DType::kF32, inv.data(), {4});
  be_->rope(x, ints({7, 100}), inv_t, 1.0f);
  const int pos[2] = {7, 100};
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 3; ++h) {
      const float* a = &x0[(t * 3 + h) * 8];
      const float* b = x.as<float>() + (t * 3 + h) * 8;
      for (int i = 0; i < 4; ++i) {
        const double ang = pos[t] * double(inv[i]);
        ASSERT_NEAR(b[i], a[i] * std::cos(ang) - a[i + 4] * std::sin(ang), 1e-4);
        ASSERT_NEAR(b[i + 4], a[i + 4] * std::cos(ang) + a[i] * std::sin(ang), 1e-4);
      }
    }
  }
}

// Naive attention over dense k/v with the documented mask rule.
std::vector<float> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   AttentionMask mask, float scale) {
  const int64_t n = q.dim(0), heads = q.dim(1), hd = q.dim(2), m = k.dim(0), kvh = k.dim(1);
  std::vector<float> out(n * heads * hd, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t qpos = m - n + i;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kvh);
      std::vector<double> s(m, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < m; ++j) {
        bool vis = !(mask.causal && j > qpos);
        if (mask.window > 0) {
          vis = vis && qpos - j < mask.window && (mask.causal || j - qpos < mask.window);
        }
        if (!vis) continue;
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) {
          d += double(q.as<float>()[(i * heads + h) * hd + c]) *
               k.as<float>()[(j * kvh + g) * hd + c];
        }
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < m; ++j) z += std::isinf(s[j]) ? 0 : std::exp(s[j] - mx);
      for (int64_t j = 0; j < m; ++j) {
        if (std::isinf(s[j])) continue;
        const double p = std::exp(s[j] - mx) / z;
        for (int64_t c = 0; c < hd; ++c) {
          out[(i * heads + h) * hd + c] += float(p * v.as<float>()[(j * kvh + g) * hd + c]);
        }
      }
    }
  }
  return out;
}

TEST_F(CpuOps, PagedAttentionMatchesDenseForEveryMask) {
  const int64_t m = 45, n = 6, heads = 4, kvh = 2, hd = 16, bs = 16;
  Tensor q = random({n, heads, hd}), k = random({m, kvh, hd}), v = random({m, kvh, hd});
  // Scatter k/v into a pool through a shuffled block table.
  const int64_t num_blocks = 8;
  Tensor kp = be_->empty({num_blocks, bs, kvh, hd}), vp = be_->empty({num_blocks, bs, kvh, hd});
  std::vector<int32_t> table{5, 2, 7};
  std::vector<int32_t> slots(m);
  for (int64_t p = 0; p < m; ++p) slots[p] = table[p / bs] * bs + p % bs;
  be_->kv_write(kp, vp, k, v, ints(slots));
  for (AttentionMask mask : {AttentionMask{true, 0}, AttentionMask{false, 0},
                             AttentionMask{true, 5}, AttentionMask{false, 3}}) {
    const auto ref = naive_attention(q, k, v, mask, 0.25f);
    Tensor out = be_->empty({n, heads, hd}), out_dense = be_->empty({n, heads, hd});
    be_->paged_attention(out, q, kp, vp, ints(table), m, mask, 0.25f);
    be_->attention(out_dense, q, k, v, mask, 0.25f);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(out.as<float>()[i], ref[i], 1e-5)
          << "causal " << mask.causal << " window " << mask.window;
      ASSERT_NEAR(out_dense.as<float>()[i], ref[i], 1e-5);
    }
  }
}

TEST_F(CpuOps, ActivationsNormsAndGathers) {
  Tensor x = random({3, 10}), y = be_->empty({3, 10}), g = random({3, 10}), u = random({3, 10});
  be_->silu_mul(y, g, u);
  for (int i = 0; i < 30; ++i) {
    const float a = g.as<float>()[i];
    ASSERT_NEAR(y.as<float>()[i], a / (1 + std::exp(-a)) * u.as<float>()[i], 1e-6);
  }
  be_->gelu(y, x, /*tanh_approx=*/false);
  for (int i = 0; i < 30; ++i) {
    const float a = x.as<float>()[i];
    ASSERT_NEAR(y.as<float>()[i], 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))), 1e-6);
  }
  be_->layer_norm(y, x, 10, Tensor(), Tensor(), 1e-5f);
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 10; ++c) mean += y.as<float>()[r * 10 + c];
    for (int c = 0; c < 10; ++c) var += std::pow(y.as<float>()[r * 10 + c] - mean / 10, 2);
    ASSERT_NEAR(mean / 10, 0, 1e-5);
    ASSERT_NEAR(var / 10, 1, 1e-3);
  }
  Tensor shift = random({10}), scale = random({10});
  be_->modulate(y, x, shift, scale);
  for (int i = 0; i < 30; ++i) {
    ASSERT_NEAR(y.as<float>()[i],
                x.as<float>()[i] * (1 + scale.as<float>()[i % 10]) + shift.as<float>()[i % 10],
                1e-6);
  }
  Tensor table = random({6, 4}), emb = be_->empty({3, 4});
  be_->embedding(emb, ints({5, 0, 5}), table);
  EXPECT_EQ(emb.as<float>()[0], table.as<float>()[20]);
  EXPECT_EQ(emb.as<float>()[4], table.as<float>()[0]);
  Tensor wide = be_->empty({3, 8});
  be_->copy_columns(wide, 4, emb);
  EXPECT_EQ(wide.as<float>()[8 + 4], emb.as<float>()[4]);
  EXPECT_EQ(wide.as<float>()[8 + 0], 0.0f);
  Tensor am = be_->empty({3}, DType::kI32);
  be_->argmax(am, x);
  for (int r = 0; r < 3; ++r) {
    const float* row = x.as<float>() + r * 10;
    EXPECT_EQ(am.as<int32_t>()[r], std::max_element(row, row + 10) - row);
  }
}

TEST_F(CpuOps, UploadConvertsCheckpointDtypes) {
  const std::vector<uint16_t> bf16{f32_to_bf16(1.5f), f32_to_bf16(-2.25f)};
  Tensor t = be_->upload_weight(DType::kBF16, bf16.data(), {2});
  EXPECT_EQ(t.as<float>()[0], 1.5f);
  EXPECT_EQ(t.as<float>()[1], -2.25f);
  const std::vector<uint16_t> f16{f32_to_f16(0.333251953125f), f32_to_f16(-65504.0f)};
  t = be_->upload_weight(DType::kF16, f16.data(), {2});
  EXPECT_EQ(t.as<float>()[0], 0.333251953125f);
  EXPECT_EQ(t.as<float>()[1], -65504.0f);
  const std::vector<uint8_t> f8{f32_to_f8e4m3(448.0f), f32_to_f8e4m3(-0.015625f), 0x01};
  t = be_->upload_weight(DType::kF8E4M3, f8.data(), {3});
  EXPECT_EQ(t.as<float>()[0], 448.0f);
  EXPECT_EQ(t.as<float>()[1], -0.015625f);
  EXPECT_EQ(t.as<float>()[2], std::ldexp(1.0f, -9));  // smallest subnormal
}

// Nearest E4M3 code by exhaustive search (ties to the even code), saturating: the definition
// f32_to_f8e4m3 implements arithmetically.
uint8_t nearest_e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fmin(std::fabs(f), 448.0f);
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int c = 0; c < 0x7f; ++c) {
    const float err = std::fabs(f8e4m3_to_f32(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return sign | best;
}

TEST(Fp8, RoundingIsNearestEvenAndSaturates) {
  std::vector<float> values = {0.0f,  -0.0f,   448.0f,  460.0f,   464.0f,     1e6f,
                               -1e6f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f, 3 * 0x1p-11f};
  // Every code, the midpoints between neighbours (ties) and points a quarter step around them.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = f8e4m3_to_f32(static_cast<uint8_t>(c)),
                hi = f8e4m3_to_f32(static_cast<uint8_t>(c + 1));
    for (const float v : {lo, (lo + hi) / 2, lo + (hi - lo) / 4, lo + 3 * (hi - lo) / 4}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> e(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) values.push_back(std::exp2(e(rng)) * (i % 2 ? 1.0f : -1.0f));
  for (const float v : values) {
    ASSERT_EQ(f32_to_f8e4m3(v), nearest_e4m3(v)) << "value " << v;
  }
}

TEST_F(CpuOps, Fp8RowQuantizationAndMatmul) {
  const int64_t n = 3, k = 40, m = 70;
  Tensor w = random({m, k}), x = random({n, k}), y = random({n, m});
  for (int64_t c = 0; c < k; ++c) w.as<float>()[5 * k + c] = 0.0f;  // an all-zero row
  const Fp8Weight q = be_->quantize_fp8_rows(w);
  ASSERT_EQ(q.q.dtype(), DType::kF8E4M3);
  const auto* codes = static_cast<const uint8_t*>(q.q.data());
  for (int64_t j = 0; j < m; ++j) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(w.as<float>()[j * k + c]));
    const float scale = amax > 0 ? amax / 448.0f : 1.0f;
    ASSERT_EQ(q.scale.as<float>()[j], scale) << "row " << j;
    for (int64_t c = 0; c < k; ++c) {
      ASSERT_EQ(codes[j * k + c], f32_to_f8e4m3(w.as<float>()[j * k + c] / scale));
    }
  }
  const std::vector<float> y0(y.as<float>(), y.as<float>() + n * m);
  be_->matmul_fp8(y, x, q, /*accumulate=*/true);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = 0;
      for (int64_t c = 0; c < k; ++c) {
        ref += static_cast<double>(x.as<float>()[i * k + c]) * f8e4m3_to_f32(codes[j * k + c]);
      }
      ref = y0[i * m + j] + ref * q.scale.as<float>()[j];
      EXPECT_NEAR(y.as<float>()[i * m + j], ref, 1e-4 * (1 + std::fabs(ref)));
    }
  }
}

TEST_F(CpuOps, AttentionPrologueEqualsSeparateOps) {
  // The fused prologue against rms_norm per head + rope + kv_write on the split projection.
  const int64_t n = 3, heads = 4, kvh = 2, hd = 8, bs = 4, width = (heads + 2 * kvh) * hd;
  Tensor qkv = random({n, width}), qn = random({hd}), kn = random({hd});
  std::vector<float> freq(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) freq[i] = std::pow(100.0f, -2.0f * i / hd);
  Tensor inv_freq = be_->upload_weight(DType::kF32, freq.data(), {hd / 2});
  const Tensor pos = ints({7, 8, 9}), slots = ints({5, 0, 11});
  for (const bool with_norm : {true, false}) {
    Tensor q = be_->empty({n, heads, hd});
    Tensor kp = be_->empty({3, bs, kvh, hd}), vp = be_->empty({3, bs, kvh, hd});
    be_->attention_prologue(q, qkv, with_norm ? qn : Tensor(), with_norm ? kn : Tensor(), 1e-6f,
                            pos, inv_freq, 0.9f, kp, vp, slots);
    Tensor rq = be_->empty({n, heads, hd}), rk = be_->empty({n, kvh, hd}),
           rv = be_->empty({n, kvh, hd});
    be_->slice_columns(rq.view({n, heads * hd}), qkv, 0);
    be_->slice_columns(rk.view({n, kvh * hd}), qkv, heads * hd);
    be_->slice_columns(rv.view({n, kvh * hd}), qkv, (heads + kvh) * hd);
    if (with_norm) {
      be_->rms_norm(rq, rq, qn, 1e-6f);
      be_->rms_norm(rk, rk, kn, 1e-6f);
    }
    be_->rope(rq, pos, inv_freq, 0.9f);
    be_->rope(rk, pos, inv_freq, 0.9f);
    Tensor rkp = be_->empty({3, bs, kvh, hd}), rvp = be_->empty({3, bs, kvh, hd});
    be_->kv_write(rkp, rvp, rk, rv, slots);
    EXPECT_EQ(be_->to_host_f32(q), be_->to_host_f32(rq)) << "norm " << with_norm;
    EXPECT_EQ(be_->to_host_f32(kp), be_->to_host_f32(rkp)) << "norm " << with_norm;
    EXPECT_EQ(be_->to_host_f32(vp), be_->to_host_f32(rvp)) << "norm " << with_norm;
  }
}

// Backend::begin_read / end_read: two reads pending at once, each giving the bytes its tensor
// held when it began (later writes do not change them), ended in order.
TEST_F(CpuOps, AsyncReadBackGivesTheBytesAtItsBegin) {
  Tensor ids = ints({1, 2, 3, 4});
  const int64_t first = be_->begin_read(ids.rows(1, 3));
  const std::vector<int32_t> later = {9, 8, 7, 6};
  be_->copy_from_host(ids, later.data());
  const int64_t second = be_->begin_read(ids);
  std::vector<int32_t> a(3), b(4);
  be_->end_read(first, a.data());
  be_->end_read(second, b.data());
  EXPECT_EQ(a, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(b, later);
  EXPECT_EQ(second, first + 1);

  // A fault recorded before the read is thrown by end_read (as on an asynchronous device).
  Tensor kp = be_->empty({1, 4, 1, 2}), vp = be_->empty({1, 4, 1, 2});
  be_->kv_write(kp, vp, random({1, 1, 2}), random({1, 1, 2}), ints({4}));
  int64_t faulted = 0;
  ASSERT_NO_THROW(faulted = be_->begin_read(ids));
  EXPECT_THROW(be_->end_read(faulted, b.data()), BackendFault);
  const int64_t clean = be_->begin_read(ids);
  EXPECT_NO_THROW(be_->end_read(clean, b.data()));
}

// A KV slot outside the pool is an engine bug: the op writes the other rows, skips that one, and
// the next read-back throws a BackendFault (kInternal through catch_allocation_failure) naming
// the op, the slot and the capacity, then clears it; the process goes on.
TEST_F(CpuOps, OutOfPoolSlotIsReportedAtTheNextReadBack) {
  const int64_t kvh = 2, hd = 8, bs = 4, capacity = 2 * bs;
  Tensor k = random({3, kvh, hd}), v = random({3, kvh, hd});
  Tensor kp = be_->empty({2, bs, kvh, hd}), vp = be_->empty({2, bs, kvh, hd});
  be_->kv_write(kp, vp, k, v, ints({1, 8, 3}));
  be_->kv_write(kp, vp, k.rows(0, 1), v.rows(0, 1), ints({-1}));  // a second fault: not kept
  const Status s = catch_allocation_failure([&] {
    be_->to_host_f32(kp);
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("kv_write: KV slot 8 is outside the KV pool of 8 slots"),
            std::string::npos)
      << s.message();
  const int64_t row = kvh * hd;
  for (const auto& [i, slot] : {std::pair<int64_t, int64_t>{0, 1}, {2, 3}}) {
    for (int64_t c = 0; c < row; ++c) {
      ASSERT_EQ(kp.as<float>()[slot * row + c], k.as<float>()[i * row + c]) << "row " << i;
      ASSERT_EQ(vp.as<float>()[slot * row + c], v.as<float>()[i * row + c]) << "row " << i;
    }
  }
  EXPECT_NO_THROW(be_->to_host_f32(kp));  // reported once

  // The prologue: the query rows are all computed, the keys of the bad row go nowhere.
  const int64_t n = 3, heads = 4, width = (heads + 2 * kvh) * hd;
  Tensor qkv = random({n, width});
  std::vector<float> freq(hd / 2, 0.5f);
  Tensor inv_freq = be_->upload_weight(DType::kF32, freq.data(), {hd / 2});
  const Tensor pos = ints({4, 5, 6});
  Tensor q = be_->empty({n, heads, hd}), q_ref = be_->empty({n, heads, hd});
  be_->attention_prologue(q_ref, qkv, Tensor(), Tensor(), 1e-6f, pos, inv_freq, 1.0f, kp, vp,
                          ints({0, 1, 2}));
  const std::vector<float> pool_before = be_->to_host_f32(kp);
  be_->attention_prologue(q, qkv, Tensor(), Tensor(), 1e-6f, pos, inv_freq, 1.0f, kp, vp,
                          ints({0, capacity + 91, 2}));
  std::vector<float> q_host(static_cast<size_t>(q.numel()));
  try {
    be_->copy_to_host(q_host.data(), q);
    ADD_FAILURE() << "no BackendFault";
  } catch (const BackendFault& e) {
    EXPECT_EQ(e.to_status().code(), StatusCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("attention_prologue: KV slot 99 is outside the KV pool of "
                                         "8 slots"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(q_host, be_->to_host_f32(q_ref));
  EXPECT_EQ(be_->to_host_f32(kp), pool_before);  // rows 0 and 2 rewritten alike, row 1 dropped
}

TEST_F(CpuOps, SwigluOnFusedGateUp) {
  const int64_t n = 3, i_dim = 10;
  Tensor gu = random({n, 2 * i_dim}), y = be_->empty({n, i_dim});
  be_->swiglu(y, gu);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < i_dim; ++c) {
      const double g = gu.as<float>()[r * 2 * i_dim + c],
                   u = gu.as<float>()[r * 2 * i_dim + i_dim + c];
      ASSERT_NEAR(y.as<float>()[r * i_dim + c], g / (1 + std::exp(-g)) * u, 1e-5);
    }
  }
}

TEST_F(CpuOps, PagedAttentionReadsTheLengthFromATensor) {
  const int64_t m = 20, n = 2, heads = 2, kvh = 1, hd = 8, bs = 4;
  Tensor q = random({n, heads, hd}), k = random({m, kvh, hd}), v = random({m, kvh, hd});
  Tensor kp = be_->empty({8, bs, kvh, hd}), vp = be_->empty({8, bs, kvh, hd});
  std::vector<int32_t> table{3, 1, 4, 0, 7, 2, 6, 5}, slots(m);
  for (int64_t p = 0; p < m; ++p) slots[p] = table[p / bs] * bs + p % bs;
  be_->kv_write(kp, vp, k, v, ints(slots));
  Tensor a = be_->empty({n, heads, hd}), b = be_->empty({n, heads, hd});
  be_->paged_attention(a, q, kp, vp, ints(table), 13, {}, 0.3f);
  const Tensor len = ints({13});
  be_->paged_attention(b, q, kp, vp, ints(table), KvLength(32, &len), {}, 0.3f);
  EXPECT_EQ(be_->to_host_f32(a), be_->to_host_f32(b));
}

TEST_F(CpuOps, PagedAttentionBatchEqualsPerSequenceCalls) {
  // S sequences with their own lengths and scrambled block tables into one shared pool: every
  // row of the batched call equals the single-sequence call bit for bit.
  const int64_t heads = 4, kvh = 2, hd = 16, bs = 4, capacity = 8, max_kv_len = capacity * bs;
  const std::vector<int32_t> lengths{5, 32, 1, 17, 9};
  for (const int64_t num_seqs : {3, 5}) {
    for (const int64_t n : {1, 4}) {
      const int64_t blocks = num_seqs * capacity;
      Tensor kp = random({blocks, bs, kvh, hd}), vp = random({blocks, bs, kvh, hd});
      std::vector<int32_t> table_rows(blocks), lens(num_seqs);
      std::iota(table_rows.begin(), table_rows.end(), 0);
      std::shuffle(table_rows.begin(), table_rows.end(), rng_);
      for (int64_t s = 0; s < num_seqs; ++s)
        lens[s] = std::max(lengths[s], static_cast<int32_t>(n));
      Tensor tables = be_->empty({num_seqs, capacity}, DType::kI32);  // [S, capacity]
      be_->copy_from_host(tables, table_rows.data());
      const Tensor kv_lens = ints(lens);  // [S]
      Tensor q = random({num_seqs * n, heads, hd}), out = be_->empty({num_seqs * n, heads, hd});
      for (AttentionMask mask : {AttentionMask{true, 0}, AttentionMask{true, 3}}) {
        be_->paged_attention_batch(out, q, kp, vp, tables, kv_lens, max_kv_len, mask, 0.3f);
        for (int64_t s = 0; s < num_seqs; ++s) {
          Tensor single = be_->empty({n, heads, hd});
          be_->paged_attention(single, q.rows(s * n, n), kp, vp, tables.rows(s, 1).view({capacity}),
                               lens[s], mask, 0.3f);
          EXPECT_EQ(be_->to_host_f32(out.rows(s * n, n)), be_->to_host_f32(single))
              << "S " << num_seqs << " n " << n << " sequence " << s << " window " << mask.window;
        }
      }
    }
  }
}

}  // namespace
}  // namespace bs
