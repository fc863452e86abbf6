// Every backend op on the CUDA backend against the CPU reference backend, on random data across
// shapes. Inputs are rounded to bf16 first so both backends see the same values; tolerances are
// those of bf16 storage (outputs rounded to bf16, fp32 accumulation). Skipped without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "chi_square.h"
#include "core/dtype.h"
#include "engine/device_sampling.h"
#include "engine/sampler.h"
#include "engine/speculative_accept.h"
#include "test_util.h"
#ifdef BLOCKSPEC_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bs {
namespace {

using Shape = std::vector<int64_t>;

Tensor make(Backend& be, const Shape& s, DType t) {
  switch (s.size()) {
    case 1:
      return be.empty({s[0]}, t);
    case 2:
      return be.empty({s[0], s[1]}, t);
    case 3:
      return be.empty({s[0], s[1], s[2]}, t);
    default:
      return be.empty({s[0], s[1], s[2], s[3]}, t);
  }
}
Tensor weight(Backend& be, const Shape& s, const std::vector<float>& v) {
  switch (s.size()) {
    case 1:
      return be.upload_weight(DType::kF32, v.data(), {s[0]});
    case 2:
      return be.upload_weight(DType::kF32, v.data(), {s[0], s[1]});
    default:
      return be.upload_weight(DType::kF32, v.data(), {s[0], s[1], s[2]});
  }
}

// ‖a − b‖ / ‖b‖ over the finite entries; infinite entries must match exactly; NaN fails.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = make_backend("cuda");
    if (!be.ok()) GTEST_SKIP() << "CUDA backend unavailable: " << be.status().message();
    gpu_ = std::move(*be);
    cpu_ = make_cpu_backend(2);
  }

  // Random values already rounded to bf16.
  std::vector<float> rnd(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng_)));
    return v;
  }
  // An activation tensor holding `v` on the GPU (bf16 unless `t` says otherwise).
  Tensor gpu_act(const Shape& s, const std::vector<float>& v, DType t = DType::kBF16) {
    Tensor x = make(*gpu_, s, t);
    if (t == DType::kBF16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      gpu_->copy_from_host(x, h.data());
    } else {
      gpu_->copy_from_host(x, v.data());
    }
    return x;
  }
  Tensor cpu_act(const Shape& s, const std::vector<float>& v) {
    Tensor x = make(*cpu_, s, DType::kF32);
    cpu_->copy_from_host(x, v.data());
    return x;
  }
  // candidate_walk with t candidates per row on both backends (CandidateWalkMatchesCpu).
  void check_candidate_walk(int64_t t);
  // topk of x [n, V] on both backends: the same ids and values.
  void expect_topk_equal(const Tensor& gx, const Tensor& cx, int64_t n, int64_t k) {
    Tensor gval = make(*gpu_, {n, k}, DType::kF32), cval = make(*cpu_, {n, k}, DType::kF32);
    Tensor gid = make(*gpu_, {n, k}, DType::kI32), cid = make(*cpu_, {n, k}, DType::kI32);
    gpu_->topk(gval, gid, gx);
    cpu_->topk(cval, cid, cx);
    std::vector<int32_t> gi(n * k), ci(n * k);
    gpu_->copy_to_host(gi.data(), gid);
    cpu_->copy_to_host(ci.data(), cid);
    EXPECT_EQ(gi, ci) << "topk k=" << k;
    EXPECT_EQ(gpu_->to_host_f32(gval), cpu_->to_host_f32(cval)) << "topk k=" << k;
  }
  Tensor gpu_ints(const std::vector<int32_t>& v) {
    Tensor t = gpu_->empty({static_cast<int64_t>(v.size())}, DType::kI32);
    gpu_->copy_from_host(t, v.data());
    return t;
  }
  Tensor cpu_ints(const std::vector<int32_t>& v) {
    Tensor t = cpu_->empty({static_cast<int64_t>(v.size())}, DType::kI32);
    cpu_->copy_from_host(t, v.data());
    return t;
  }
  // Row r of an n-row product mm(y[n, m], x[n, k]) (random x) must equal the same row of the
  // product over the first `rows` rows, for every count in `counts`, bit for bit.
  void expect_rows_independent(int64_t n, int64_t k, int64_t m,
                               std::initializer_list<int64_t> counts,
                               const std::function<void(const Tensor&, const Tensor&)>& mm,
                               const std::string& what) {
    Tensor gx = gpu_act({n, k}, rnd(n * k));
    Tensor all = make(*gpu_, {n, m}, DType::kBF16);
    mm(all, gx);
    const auto ref = gpu_->to_host_f32(all);
    for (const int64_t rows : counts) {
      Tensor part = make(*gpu_, {rows, m}, DType::kBF16);
      mm(part, gx.rows(0, rows));
      const auto got = gpu_->to_host_f32(part);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.begin())) << what << " rows=" << rows;
    }
  }
  // Paged BF16 pools of `blocks` blocks of 16 holding random keys (values = keys) for positions
  // [0, kv_len), laid out through the returned block table (shuffled when asked).
  struct PagedKv {
    Tensor k_pool, v_pool, table;
  };
  PagedKv random_paged_kv(int64_t blocks, int64_t kv_len, int64_t kv_heads, int64_t hd,
                          bool shuffle) {
    const int64_t bs = 16;
    std::vector<int32_t> table(blocks), slots(kv_len);
    std::iota(table.begin(), table.end(), 0);
    if (shuffle) std::shuffle(table.begin(), table.end(), rng_);
    for (int64_t p = 0; p < kv_len; ++p) slots[p] = table[p / bs] * bs + p % bs;
    PagedKv kv{make(*gpu_, {blocks, bs, kv_heads, hd}, DType::kBF16),
               make(*gpu_, {blocks, bs, kv_heads, hd}, DType::kBF16), gpu_ints(table)};
    const Tensor k = gpu_act({kv_len, kv_heads, hd}, rnd(kv_len * kv_heads * hd));
    gpu_->kv_write(kv.k_pool, kv.v_pool, k, k, gpu_ints(slots));
    return kv;
  }
  void expect_close(const Tensor& g, const Tensor& c, double tol, const std::string& what) {
    const auto a = gpu_->to_host_f32(g);
    const auto b = cpu_->to_host_f32(c);
    const double e = rel_err(a, b);
    EXPECT_LT(e, tol) << what;
  }

  // FusedPrologueAttentionEqualsPrologueThenAttention's checks, under the split kernel set now.
  void expect_fused_prologue_equals_unfused();

  // The split-KV tests' pools: BF16 K and V of num_seqs * capacity blocks of 16 (seeded values in
  // [-2, 2), seed advanced by 2) and a shuffled block table, on the GPU as [num_seqs, capacity].
  struct SplitPools {
    Tensor k, v, tables;
    std::vector<int32_t> table;  // host copy
  };
  SplitPools split_pools(int64_t kv_heads, int64_t hd, int64_t num_seqs, int64_t capacity,
                         uint32_t& seed);
  // BF16 query vectors [rows, heads, hd] of seeded values in [-2, 2) (seed advanced by 1).
  Tensor split_queries(int64_t rows, int64_t heads, int64_t hd, uint32_t& seed);

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{1234};
};

constexpr double kBf16Tol = 1e-2;

// memory_info reports the GPU's memory: a 1 GiB tensor takes 1 GiB of the free memory while it
// lives; a small tensor released into the allocator's cache still counts as free.
TEST_F(CudaOps, MemoryInfoFollowsAllocations) {
  const MemoryInfo before = gpu_->memory_info();
  EXPECT_GT(before.total, 0);
  EXPECT_GT(before.free, 0);
  EXPECT_LE(before.free, before.total);
  constexpr int64_t kGiB = int64_t{1} << 30;
  {
    Tensor big = gpu_->empty({kGiB / 2}, DType::kBF16);
    const MemoryInfo during = gpu_->memory_info();
    EXPECT_EQ(during.total, before.total);
    // Other processes may allocate meanwhile; the tensor's own GiB must show.
    EXPECT_LE(during.free, before.free - kGiB + (64 << 20));
    EXPECT_GE(during.free, before.free - kGiB - (64 << 20));
  }
  const MemoryInfo after_big = gpu_->memory_info();
  EXPECT_GE(after_big.free, before.free - (64 << 20));     // returned to CUDA
  { Tensor small = gpu_->empty({1 << 20}, DType::kF32); }  // 4 MiB, kept in the cache
  EXPECT_GE(gpu_->memory_info().free, after_big.free - (2 << 20));
}

TEST_F(CudaOps, MatmulShapesBiasAccumulate) {
  struct Case {
    int64_t n, k, m;
  };
  const std::vector<Case> cases = {
      {1, 64, 172},  {1, 512, 384},   {2, 256, 100}, {3, 128, 64},     {4, 96, 80},
      {5, 64, 172},  {16, 512, 1024}, {37, 172, 64}, {1, 4096, 1024},  {16, 4096, 512},
      {1, 172, 64},  {9, 172, 33},    {8, 40, 17},   {15, 12288, 128}, {16, 100, 4100},
      {17, 256, 64}, {12, 4104, 24}};
#ifdef BLOCKSPEC_HAS_CUDA
  for (const auto mode : {cuda::GemvMode::kAuto, cuda::GemvMode::kMma, cuda::GemvMode::kSimt,
                          cuda::GemvMode::kCublasLt, cuda::GemvMode::kStream}) {
    cuda::set_gemv_mode(*gpu_, mode);
#else
  {
#endif
    for (const auto& c : cases) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_bias = variant & 1, accumulate = variant & 2;
        const auto xv = rnd(c.n * c.k), wv = rnd(c.m * c.k, 0.1f), bv = rnd(c.m),
                   yv = rnd(c.n * c.m);
        Tensor gx = gpu_act({c.n, c.k}, xv), cx = cpu_act({c.n, c.k}, xv);
        Tensor gw = weight(*gpu_, {c.m, c.k}, wv), cw = weight(*cpu_, {c.m, c.k}, wv);
        Tensor gb = weight(*gpu_, {c.m}, bv), cb = weight(*cpu_, {c.m}, bv);
        Tensor gy = gpu_act({c.n, c.m}, yv), cy = cpu_act({c.n, c.m}, yv);
        gpu_->matmul(gy, gx, gw, with_bias ? &gb : nullptr, accumulate);
        cpu_->matmul(cy, cx, cw, with_bias ? &cb : nullptr, accumulate);
        expect_close(gy, cy, kBf16Tol,
                     "matmul n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                         " m=" + std::to_string(c.m) + " bias=" + std::to_string(with_bias) +
                         " acc=" + std::to_string(accumulate));
        // F32 output (logits kept in fp32 by a caller).
        Tensor gy32 = gpu_act({c.n, c.m}, yv, DType::kF32);
        Tensor cy32 = cpu_act({c.n, c.m}, yv);
        gpu_->matmul(gy32, gx, gw, with_bias ? &gb : nullptr, accumulate);
        cpu_->matmul(cy32, cx, cw, with_bias ? &cb : nullptr, accumulate);
        expect_close(gy32, cy32, 2e-3, "matmul f32 out n=" + std::to_string(c.n));
      }
    }
  }
}

TEST_F(CudaOps, FewRowMatmulRowsAreIndependentOfRowCount) {
  // Row r of an n-row product must be bit-identical to the same row computed alone: that is
  // what makes greedy speculative decoding reproduce plain decoding on the GPU. Holds for the
  // default mode (pinned cuBLASLt algorithm) and the skinny MMA kernel.
#ifdef BLOCKSPEC_HAS_CUDA
  for (const auto mode : {cuda::GemvMode::kAuto, cuda::GemvMode::kMma, cuda::GemvMode::kStream}) {
    cuda::set_gemv_mode(*gpu_, mode);
#else
  {
#endif
    for (const int64_t k : {64, 172, 4096}) {
      const int64_t m = 300;
      Tensor gw = weight(*gpu_, {m, k}, rnd(m * k, 0.1f));
      expect_rows_independent(
          16, k, m, {1, 3, 8, 9, 16},
          [&](const Tensor& y, const Tensor& x) { gpu_->matmul(y, x, gw); },
          "k=" + std::to_string(k));
    }
  }
#ifdef BLOCKSPEC_HAS_CUDA
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
#endif
}

#ifdef BLOCKSPEC_HAS_CUDA
constexpr int64_t kAnySize = int64_t{1} << 30;  // MiB: every matrix takes the stream GEMM
struct StreamCase {                             // an n-row product with an [m, k] matrix
  int64_t n, m, k;
};

// The stream GEMM (GemvMode::kStream, every tuning variant): for n = 1..16, row r of the n-row
// product equals the product of row r alone bit for bit (F32 output, so no rounding hides a
// difference), on shapes with m not a multiple of the 16-row tile, k not a multiple of the
// 32-wide chunk, k split over the warps unevenly, and the Qwen3-8B projections scaled down. The
// test can fail: two variants split k differently, and their bits differ.
TEST_F(CudaOps, StreamGemmRowsEqualSingleRowProductsBitForBit) {
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kStream);
  struct Case {
    int64_t m, k;
  };
  const std::vector<Case> cases = {{300, 64},    {77, 4104}, {1536, 1024},    {1024, 1024},
                                   {1024, 3072}, {33, 200},  {6144 / 4, 4096}};
  for (int variant = 0; variant < cuda::stream_variant_count(); ++variant) {
    cuda::set_stream_options(*gpu_, variant, kAnySize);
    for (const auto& c : cases) {
      const std::string what = fmt::format("variant {} m={} k={}", variant, c.m, c.k);
      Tensor gw = weight(*gpu_, {c.m, c.k}, rnd(c.m * c.k, 0.1f));
      Tensor gx = gpu_act({16, c.k}, rnd(16 * c.k));
      std::vector<float> single;  // [16, m]: each row alone
      for (int64_t r = 0; r < 16; ++r) {
        Tensor y = make(*gpu_, {1, c.m}, DType::kF32);
        gpu_->matmul(y, gx.rows(r, 1), gw);
        const auto h = gpu_->to_host_f32(y);
        single.insert(single.end(), h.begin(), h.end());
      }
      for (int64_t n = 1; n <= 16; ++n) {
        Tensor y = make(*gpu_, {n, c.m}, DType::kF32);
        gpu_->matmul(y, gx.rows(0, n), gw);
        const auto got = gpu_->to_host_f32(y);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), single.begin())) << what << " n=" << n;
      }
    }
  }
  // Sensitivity: another k split (variant 2: 8 warps instead of 4) changes some bits.
  const int64_t m = 256, k = 4096;
  Tensor gw = weight(*gpu_, {m, k}, rnd(m * k, 0.1f));
  Tensor gx = gpu_act({1, k}, rnd(k));
  Tensor y0 = make(*gpu_, {1, m}, DType::kF32), y2 = make(*gpu_, {1, m}, DType::kF32);
  cuda::set_stream_options(*gpu_, 0, kAnySize);
  gpu_->matmul(y0, gx, gw);
  cuda::set_stream_options(*gpu_, 2, kAnySize);
  gpu_->matmul(y2, gx, gw);
  EXPECT_NE(gpu_->to_host_f32(y0), gpu_->to_host_f32(y2)) << "the bit test would not see a change";
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}

// The bulk-copy variants 4, 5 and 7 take the same k pieces in the same order per warp as cp.async
// variant 1 (4 warps, warp w on the 32-wide chunks w, w + 4, ...), and sum the warps the same way,
// so all four give the same bits; variant 6 (8 consumer warps) gives variant 0's (8 warps): a
// check of the bulk kernels' stage bookkeeping (a stage read before its copy landed, a row or
// chunk off by one) far finer than a tolerance. The cases take every layout: x resident at 1-8
// rows (set_stream_resident_rows 1) and 9-16 rows, and x a chunk a stage at 1-8 rows (the
// default) and where the rows do not fit (12 rows of k = 12288: 32 features a stage). The split
// variants 8 and 9 (x resident) give v1's bits where k is one span (k <= 2048, <= 1024); where
// they split k, their sums meet in another order, so some bits differ from v1's (the split ran),
// and they are within fp32 rounding of v1 (no span lost or counted twice).
TEST_F(CudaOps, StreamBulkVariantsEqualCpAsyncVariantBitForBit) {
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kStream);
  for (const StreamCase c :
       {StreamCase{1, 300, 64}, StreamCase{3, 77, 4104}, StreamCase{9, 1000, 1032},
        StreamCase{16, 129, 3072}, StreamCase{16, 16, 8}, StreamCase{1, 4096, 4096},
        StreamCase{16, 6144, 4096}, StreamCase{8, 4096, 12288}, StreamCase{16, 1000, 4104},
        StreamCase{12, 4096, 12288}}) {
    Tensor gw = weight(*gpu_, {c.m, c.k}, rnd(c.m * c.k, 0.1f));
    Tensor gx = gpu_act({c.n, c.k}, rnd(c.n * c.k));
    Tensor gb = weight(*gpu_, {c.m}, rnd(c.m));
    const auto yv = rnd(c.n * c.m);
    const auto product = [&](int variant) {
      cuda::set_stream_options(*gpu_, variant, kAnySize);
      Tensor gy = gpu_act({c.n, c.m}, yv, DType::kF32);
      gpu_->matmul(gy, gx, gw, &gb, /*accumulate=*/true);
      return gpu_->to_host_f32(gy);
    };
    const auto v1 = product(1), v0 = product(0);
    for (const int resident_rows : {0, 1}) {  // the default (9) and always: both layouts
      cuda::set_stream_resident_rows(*gpu_, resident_rows);
      for (const auto& [variant, want] :
           {std::pair{4, &v1}, std::pair{5, &v1}, std::pair{6, &v0}, std::pair{7, &v1}}) {
        EXPECT_TRUE(product(variant) == *want)
            << "variant " << variant << " n=" << c.n << " m=" << c.m << " k=" << c.k
            << " resident from " << resident_rows << " rows";
      }
    }
    cuda::set_stream_resident_rows(*gpu_, 0);
    for (const int variant : {8, 9}) {
      const auto vs = product(variant);
      const std::string what = fmt::format("variant {} n={} m={} k={}", variant, c.n, c.m, c.k);
      if (cuda::stream_split_count(*gpu_, c.m, c.k) == 1) {
        EXPECT_TRUE(vs == v1) << what;
        continue;
      }
      double worst = 0;
      for (size_t o = 0; o < v1.size(); ++o) {
        worst = std::max(worst, double(std::fabs(vs[o] - v1[o])) / (std::fabs(v1[o]) + 1.0));
      }
      EXPECT_LT(worst, 1e-4) << what;
      if (c.n * c.m >= 4096) {
        EXPECT_NE(vs, v1) << what << ": the split did not run";
      }
    }
  }
  // The splits the benchmarks assume: Qwen3-8B's k = 4096 in 2 spans (its LM head too), 12288 in
  // 6 (variant 8); 4 and 12 (variant 9).
  cuda::set_stream_options(*gpu_, 8, kAnySize);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 6144, 4096), 2);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 151936, 4096), 2);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 4096, 12288), 6);
  cuda::set_stream_options(*gpu_, 9, kAnySize);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 6144, 4096), 4);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 151936, 4096), 4);
  EXPECT_EQ(cuda::stream_split_count(*gpu_, 4096, 12288), 12);
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}

// The fused stream GEMMs (bulk variants 4-9): Backend::norm_matmul and swiglu_matmul in
// GemvMode::kStream. Against fp64 host references of the ops' definitions (bias, accumulate, F32
// and BF16 outputs, odd m and k); the SwiGLU form equals swiglu then the plain stream GEMM of the
// same variant bit for bit (the same operand bits, the same k split); and in both forms row r of
// an n-row call equals the row alone bit for bit (speculative verify == plain decode), also where
// n decides the layout (k = 12288: x resident up to 5-6 rows, a chunk a stage beyond; SwiGLU
// fused, then apart); variants 8 and 9 split k = 3072, 4096, 4104 and 12288 (9 also 1032; the
// RMSNorm's sums of squares then meet across spans too).
TEST_F(CudaOps, StreamFusedNormAndSwigluMatchReferencesAndKeepRowsInvariant) {
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kStream);
  for (const int variant : {4, 5, 6, 7, 8, 9}) {
    cuda::set_stream_options(*gpu_, variant, kAnySize);
    for (const StreamCase c :
         {StreamCase{1, 300, 64}, StreamCase{3, 77, 4104}, StreamCase{9, 1000, 1032},
          StreamCase{16, 129, 3072}, StreamCase{16, 16, 8}, StreamCase{16, 512, 4096},
          StreamCase{16, 40, 12288}}) {
      const std::string what = fmt::format("variant {} n={} m={} k={}", variant, c.n, c.m, c.k);
      const auto xv = rnd(c.n * c.k), gv = rnd(c.k, 0.5f), wv = rnd(c.m * c.k, 0.1f);
      const auto guv = rnd(c.n * 2 * c.k), bv = rnd(c.m), yv = rnd(c.n * c.m);
      Tensor gx = gpu_act({c.n, c.k}, xv), ggu = gpu_act({c.n, 2 * c.k}, guv);
      Tensor gw = weight(*gpu_, {c.m, c.k}, wv), gg = weight(*gpu_, {c.k}, gv);
      Tensor gb = weight(*gpu_, {c.m}, bv);
      Tensor scratch = make(*gpu_, {c.n, c.k}, DType::kBF16);
      const float eps = 1e-6f;
      // fp64 operands: the normalized rows, and silu(gate) * up.
      std::vector<double> xn(c.n * c.k), act(c.n * c.k);
      for (int64_t r = 0; r < c.n; ++r) {
        double sq = 0;
        for (int64_t i = 0; i < c.k; ++i) sq += double(xv[r * c.k + i]) * xv[r * c.k + i];
        const double inv = 1.0 / std::sqrt(sq / c.k + eps);
        for (int64_t i = 0; i < c.k; ++i) {
          xn[r * c.k + i] = xv[r * c.k + i] * inv * gv[i];
          const double g = guv[r * 2 * c.k + i], u = guv[r * 2 * c.k + c.k + i];
          act[r * c.k + i] = g / (1.0 + std::exp(-g)) * u;
        }
      }
      for (int flags = 0; flags < 4; ++flags) {
        const bool with_bias = flags & 1, accumulate = flags & 2;
        for (const DType t : {DType::kF32, DType::kBF16}) {
          for (const bool swiglu : {false, true}) {
            const std::vector<double>& op = swiglu ? act : xn;
            Tensor gy = gpu_act({c.n, c.m}, yv, t);
            if (swiglu) {
              gpu_->swiglu_matmul(gy, scratch, ggu, gw, with_bias ? &gb : nullptr, accumulate);
            } else {
              gpu_->norm_matmul(gy, scratch, gx, gg, eps, gw, with_bias ? &gb : nullptr,
                                accumulate);
            }
            const auto got = gpu_->to_host_f32(gy);
            double worst = 0;
            for (int64_t r = 0; r < c.n; ++r) {
              for (int64_t j = 0; j < c.m; ++j) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < c.k; ++i) {
                  ref += op[r * c.k + i] * wv[j * c.k + i];
                  mag += std::fabs(op[r * c.k + i] * wv[j * c.k + i]);
                }
                if (with_bias) ref += bv[j];
                const float y0 =
                    t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(yv[r * c.m + j])) : yv[r * c.m + j];
                if (accumulate) ref += y0;
                const double scale = mag + std::fabs(ref) + 1.0;
                worst = std::max(worst, std::fabs(got[r * c.m + j] - ref) / scale);
              }
            }
            // The BF16 operand (2^-9 relative per element) dominates; a BF16 output adds 2^-9.
            EXPECT_LT(worst, t == DType::kBF16 ? 6e-3 : 4e-3)
                << what << (swiglu ? " swiglu" : " norm") << " bias=" << with_bias
                << " acc=" << accumulate << " bf16=" << (t == DType::kBF16);
          }
        }
      }
      // SwiGLU fused == swiglu then the plain stream GEMM, bit for bit.
      Tensor fused = make(*gpu_, {c.n, c.m}, DType::kF32),
             apart = make(*gpu_, {c.n, c.m}, DType::kF32);
      gpu_->swiglu_matmul(fused, scratch, ggu, gw, &gb);
      cuda::set_stream_fusion(*gpu_, false);
      gpu_->swiglu_matmul(apart, scratch, ggu, gw, &gb);
      cuda::set_stream_fusion(*gpu_, true);
      EXPECT_EQ(gpu_->to_host_f32(fused), gpu_->to_host_f32(apart)) << what;
      // Rows: each row alone, then every n, in both forms.
      for (const bool swiglu : {false, true}) {
        const auto call = [&](const Tensor& y, int64_t r0, int64_t rows) {
          if (swiglu) {
            gpu_->swiglu_matmul(y, scratch.rows(0, rows), ggu.rows(r0, rows), gw);
          } else {
            gpu_->norm_matmul(y, scratch.rows(0, rows), gx.rows(r0, rows), gg, eps, gw);
          }
        };
        std::vector<float> single;
        for (int64_t r = 0; r < c.n; ++r) {
          Tensor y = make(*gpu_, {1, c.m}, DType::kF32);
          call(y, r, 1);
          const auto h = gpu_->to_host_f32(y);
          single.insert(single.end(), h.begin(), h.end());
        }
        for (int64_t n = 1; n <= c.n; ++n) {
          Tensor y = make(*gpu_, {n, c.m}, DType::kF32);
          call(y, 0, n);
          const auto got = gpu_->to_host_f32(y);
          EXPECT_TRUE(std::equal(got.begin(), got.end(), single.begin()))
              << what << (swiglu ? " swiglu" : " norm") << " rows=" << n;
        }
      }
    }
  }
  // Sensitivity: the fused norm is a different computation from the ops apart (the normalized
  // row is not rounded before the product), so some bits differ: the fused path really ran.
  {
    const int64_t n = 4, m = 256, k = 4096;
    Tensor gx = gpu_act({n, k}, rnd(n * k)), gg = weight(*gpu_, {k}, rnd(k, 0.5f));
    Tensor gw = weight(*gpu_, {m, k}, rnd(m * k, 0.1f));
    Tensor scratch = make(*gpu_, {n, k}, DType::kBF16);
    Tensor fused = make(*gpu_, {n, m}, DType::kF32), apart = make(*gpu_, {n, m}, DType::kF32);
    cuda::set_stream_options(*gpu_, 4, kAnySize);
    gpu_->norm_matmul(fused, scratch, gx, gg, 1e-6f, gw);
    cuda::set_stream_fusion(*gpu_, false);
    gpu_->norm_matmul(apart, scratch, gx, gg, 1e-6f, gw);
    cuda::set_stream_fusion(*gpu_, true);
    EXPECT_NE(gpu_->to_host_f32(fused), gpu_->to_host_f32(apart));
  }
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}

// The stream GEMM (every tuning variant) against an fp64 host reference: bias, accumulate, BF16
// and F32 outputs, 1..16 rows, odd m and k; then inside a captured graph (two replays give the
// eager bits).
TEST_F(CudaOps, StreamGemmMatchesFp64ReferenceAndReplaysInGraphs) {
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kStream);
  for (const StreamCase c :
       {StreamCase{1, 300, 64}, StreamCase{3, 77, 4104}, StreamCase{9, 1000, 1032},
        StreamCase{16, 129, 3072}, StreamCase{16, 16, 8}}) {
    const auto xv = rnd(c.n * c.k), wv = rnd(c.m * c.k, 0.1f), bv = rnd(c.m), yv = rnd(c.n * c.m);
    Tensor gx = gpu_act({c.n, c.k}, xv), gw = weight(*gpu_, {c.m, c.k}, wv);
    Tensor gb = weight(*gpu_, {c.m}, bv);
    std::vector<double> dot(c.n * c.m), mag(c.n * c.m);  // x . w and sum |x w| per output
    for (int64_t r = 0; r < c.n; ++r) {
      for (int64_t j = 0; j < c.m; ++j) {
        for (int64_t i = 0; i < c.k; ++i) {
          dot[r * c.m + j] += double(xv[r * c.k + i]) * wv[j * c.k + i];
          mag[r * c.m + j] += std::fabs(double(xv[r * c.k + i]) * wv[j * c.k + i]);
        }
      }
    }
    for (int variant = 0; variant < cuda::stream_variant_count(); ++variant) {
      cuda::set_stream_options(*gpu_, variant, kAnySize);
      for (int flags = 0; flags < 4; ++flags) {
        const bool with_bias = flags & 1, accumulate = flags & 2;
        for (const DType t : {DType::kF32, DType::kBF16}) {
          Tensor gy = gpu_act({c.n, c.m}, yv, t);
          gpu_->matmul(gy, gx, gw, with_bias ? &gb : nullptr, accumulate);
          const auto got = gpu_->to_host_f32(gy);
          double worst = 0;
          for (int64_t o = 0; o < c.n * c.m; ++o) {
            double ref = dot[o];
            if (with_bias) ref += bv[o % c.m];
            // The accumulated y was rounded to the output type on upload.
            const float y0 = t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(yv[o])) : yv[o];
            if (accumulate) ref += y0;
            const double scale = mag[o] + std::fabs(ref) + 1.0;
            worst = std::max(worst, std::fabs(got[o] - ref) / scale);
          }
          // fp32 accumulation: ~1e-6 of the magnitude; a BF16 output adds 2^-9 of the value.
          EXPECT_LT(worst, t == DType::kBF16 ? 4e-3 : 1e-5)
              << "variant " << variant << " n=" << c.n << " m=" << c.m << " k=" << c.k
              << " bias=" << with_bias << " acc=" << accumulate << " bf16=" << (t == DType::kBF16);
        }
      }
    }
  }
  // Captured (each variant): eager once, then capture, then replays; every run gives the same bits
  // (variant 8 splits k = 4104 in 3: its counters left zero by every replay).
  const int64_t n = 5, m = 333, k = 4104;
  Tensor gw = weight(*gpu_, {m, k}, rnd(m * k, 0.1f));
  Tensor gx = gpu_act({n, k}, rnd(n * k));
  Tensor y = make(*gpu_, {n, m}, DType::kF32);
  for (int variant = 0; variant < cuda::stream_variant_count(); ++variant) {
    cuda::set_stream_options(*gpu_, variant, kAnySize);
    std::vector<std::vector<float>> runs;
    for (int round = 0; round < 4; ++round) {
      gpu_->run_captured("test:stream-gemm", [&] { gpu_->matmul(y, gx, gw); });
      runs.push_back(gpu_->to_host_f32(y));
    }
    for (int round = 1; round < 4; ++round) {
      EXPECT_EQ(runs[round], runs[0]) << "variant " << variant << " round " << round;
    }
  }
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}

// Informational: the stream GEMM (each variant) vs the pinned cuBLASLt algorithm at the Qwen3-8B
// projections, 1 and 16 rows, each product launched 40 times back to back over rotating weight
// copies (no L2 reuse), and one layer's four products in sequence (what PDL can overlap).
TEST_F(CudaOps, StreamGemmTimesAtQwen3Shapes) {
  const char* env = std::getenv("BLOCKSPEC_STREAM_TIMES");
  if (env == nullptr || std::strcmp(env, "1") != 0) GTEST_SKIP() << "BLOCKSPEC_STREAM_TIMES=1";
  struct Mat {
    const char* name;
    int64_t m, k;
  };
  const std::vector<Mat> mats = {{"qkv_proj", 6144, 4096},
                                 {"o_proj", 4096, 4096},
                                 {"gate_up_proj", 24576, 4096},
                                 {"down_proj", 4096, 12288},
                                 {"lm_head", 151936, 4096}};
  const int64_t pool_elems = 151936 * 4096 + 4096 * 16;
  Tensor pool = make(*gpu_, {pool_elems}, DType::kBF16);  // zeros: the timing ignores values
  Tensor x = make(*gpu_, {16, 12288}, DType::kBF16);
  Tensor yb = make(*gpu_, {16 * 151936}, DType::kBF16);
  cuda::EventTimer timer(*gpu_);
  const auto median_us = [&](const std::function<void(int)>& op, int reps) {
    std::vector<double> t;
    for (int trial = 0; trial < 7; ++trial) {
      for (int i = 0; i < 3; ++i) op(i);
      timer.start();
      for (int i = 0; i < reps; ++i) op(i);
      t.push_back(timer.stop_ms() * 1e3 / reps);
    }
    std::nth_element(t.begin(), t.begin() + 3, t.end());
    return t[3];
  };
  struct Mode {
    std::string name;
    cuda::GemvMode mode;
    int variant;
  };
  std::vector<Mode> modes = {{"cuBLASLt", cuda::GemvMode::kAuto, 0}};
  for (int v = 0; v < cuda::stream_variant_count(); ++v) {
    modes.push_back({fmt::format("stream v{}", v), cuda::GemvMode::kStream, v});
  }
  for (const int64_t n : {1, 16}) {
    for (const auto& md : modes) {
      cuda::set_gemv_mode(*gpu_, md.mode);
      cuda::set_stream_options(*gpu_, md.variant, kAnySize);
      std::string line;
      double layer = 0, head = 0;
      for (const auto& mt : mats) {
        const int64_t elems = mt.m * mt.k, slices = std::max<int64_t>(1, pool_elems / elems);
        const Tensor xv = x.view({-1}).rows(0, n * mt.k).view({n, mt.k});
        const Tensor yv = yb.rows(0, n * mt.m).view({n, mt.m});
        const double us = median_us(
            [&](int i) {
              gpu_->matmul(yv, xv, pool.rows((i % slices) * elems, elems).view({mt.m, mt.k}));
            },
            mt.m > 24576 ? 10 : 40);
        line += fmt::format(" {} {:.1f} us ({:.0f} GB/s);", mt.name, us,
                            static_cast<double>(elems) * 2 / (us * 1e-6) / 1e9);
        (mt.m > 24576 ? head : layer) += us;
      }
      // One layer's products in sequence (qkv, o, gate_up, down), weights rotating.
      const double seq = median_us(
          [&](int i) {
            for (int e = 0; e < 4; ++e) {
              const auto& mt = mats[e];
              const int64_t elems = mt.m * mt.k, slices = pool_elems / elems;
              const Tensor w = pool.rows(((i * 4 + e) % slices) * elems, elems).view({mt.m, mt.k});
              gpu_->matmul(yb.rows(0, n * mt.m).view({n, mt.m}),
                           x.view({-1}).rows(0, n * mt.k).view({n, mt.k}), w);
            }
          },
          20);
      std::printf("[ %lld rows, %s:%s layer %.1f us (in sequence %.1f us), per token %.3f ms ]\n",
                  static_cast<long long>(n), md.name.c_str(), line.c_str(), layer, seq,
                  (36 * layer + head) / 1e3);
    }
  }
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}
#endif

// With the 16-row algorithm pinned for up to 512 rows, row r of a 512-row product equals the
// row computed alone (what batched speculative decoding needs to equal batched plain decoding
// beyond 16 rows per step); likewise the few-row kernels of kMma and kStream (the stream GEMM's
// cp.async default and bulk variant 4, plain and with its fused RMSNorm / SwiGLU), which take
// such products 16 rows at a time.
TEST_F(CudaOps, PinnedAlgorithmRowsAreIndependentOfRowCountUpTo512) {
#ifdef BLOCKSPEC_HAS_CUDA
  cuda::set_pinned_rows(*gpu_, 512);
  for (const int64_t k : {4096, 12288}) {
    const int64_t m = 1024;
    Tensor gw = weight(*gpu_, {m, k}, rnd(m * k, 0.05f));
    Tensor norm_w = weight(*gpu_, {k}, rnd(k, 0.5f));
    Tensor scratch = make(*gpu_, {512, k}, DType::kBF16);
    Tensor gate_up = gpu_act({512, 2 * k}, rnd(512 * 2 * k));
    struct Mode {
      const char* name;
      cuda::GemvMode mode;
      int variant;
    };
    for (const Mode md :
         {Mode{"auto", cuda::GemvMode::kAuto, 0}, Mode{"mma", cuda::GemvMode::kMma, 0},
          Mode{"stream v0", cuda::GemvMode::kStream, 0},
          Mode{"stream v4", cuda::GemvMode::kStream, 4},
          Mode{"stream v8", cuda::GemvMode::kStream, 8}}) {
      cuda::set_gemv_mode(*gpu_, md.mode);
      cuda::set_stream_options(*gpu_, md.variant, kAnySize);
      const std::string what = fmt::format("{} k={}", md.name, k);
      expect_rows_independent(
          512, k, m, {1, 16, 17, 64, 128, 200, 511},
          [&](const Tensor& y, const Tensor& x) { gpu_->matmul(y, x, gw); }, what);
      if (md.variant >= 4) {
        expect_rows_independent(
            512, k, m, {1, 17, 200},
            [&](const Tensor& y, const Tensor& x) {
              gpu_->norm_matmul(y, scratch.rows(0, x.dim(0)), x, norm_w, 1e-6f, gw);
            },
            what + " norm_matmul");
        // SwiGLU: the rows of gate_up, 1 and then n at a time, against the single rows.
        std::vector<float> single;
        for (int64_t r = 0; r < 200; ++r) {
          Tensor y = make(*gpu_, {1, m}, DType::kF32);
          gpu_->swiglu_matmul(y, scratch.rows(0, 1), gate_up.rows(r, 1), gw);
          const auto h = gpu_->to_host_f32(y);
          single.insert(single.end(), h.begin(), h.end());
        }
        for (const int64_t n : {17, 200}) {
          Tensor y = make(*gpu_, {n, m}, DType::kF32);
          gpu_->swiglu_matmul(y, scratch.rows(0, n), gate_up.rows(0, n), gw);
          const auto got = gpu_->to_host_f32(y);
          EXPECT_TRUE(std::equal(got.begin(), got.end(), single.begin()))
              << what << " swiglu_matmul n=" << n;
        }
      }
    }
  }
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
  cuda::set_pinned_rows(*gpu_, 16);
#endif
}

TEST_F(CudaOps, Fp8WeightsMatchCpuAndRowsAreIndependentOfRowCount) {
  struct Case {
    int64_t m, k;
  };
  // k = 4096 / 48 / 64 take the FP8 tensor-core kernel (k % 16 == 0); k = 172 the dequantizing
  // fallback.
  for (const Case& c : std::vector<Case>{{300, 4096}, {70, 64}, {33, 172}, {16, 48}}) {
    const std::string what = "m=" + std::to_string(c.m) + " k=" + std::to_string(c.k);
    auto wv = rnd(c.m * c.k, 0.05f);
    std::fill(wv.begin() + 3 * c.k, wv.begin() + 4 * c.k, 0.0f);  // an all-zero row
    Tensor gw = weight(*gpu_, {c.m, c.k}, wv), cw = weight(*cpu_, {c.m, c.k}, wv);
    const Fp8Weight gq = gpu_->quantize_fp8_rows(gw), cq = cpu_->quantize_fp8_rows(cw);
    // The same codes and scales on both backends.
    std::vector<uint8_t> gcodes(static_cast<size_t>(c.m * c.k));
    gpu_->copy_to_host(gcodes.data(), gq.q);
    const auto* ccodes = static_cast<const uint8_t*>(cq.q.data());
    EXPECT_TRUE(std::equal(gcodes.begin(), gcodes.end(), ccodes)) << what;
    EXPECT_EQ(gpu_->to_host_f32(gq.scale), cpu_->to_host_f32(cq.scale)) << what;

    for (const int64_t n : {1, 5, 16, 17, 40}) {
      for (const bool accumulate : {false, true}) {
        const auto xv = rnd(n * c.k), yv = rnd(n * c.m);
        Tensor gx = gpu_act({n, c.k}, xv), cx = cpu_act({n, c.k}, xv);
        Tensor gy = gpu_act({n, c.m}, yv), cy = cpu_act({n, c.m}, yv);
        gpu_->matmul_fp8(gy, gx, gq, accumulate);
        cpu_->matmul_fp8(cy, cx, cq, accumulate);
        expect_close(gy, cy, kBf16Tol, "matmul_fp8 " + what + " n=" + std::to_string(n));
        Tensor gy32 = gpu_act({n, c.m}, yv, DType::kF32), cy32 = cpu_act({n, c.m}, yv);
        gpu_->matmul_fp8(gy32, gx, gq, accumulate);
        cpu_->matmul_fp8(cy32, cx, cq, accumulate);
        expect_close(gy32, cy32, 2e-3, "matmul_fp8 f32 out " + what + " n=" + std::to_string(n));
      }
    }
    // Row r of an n-row product equals the row computed with any other row count.
    expect_rows_independent(
        40, c.k, c.m, {1, 3, 8, 9, 16, 17, 33},
        [&](const Tensor& y, const Tensor& x) { gpu_->matmul_fp8(y, x, gq); }, what);
  }
}

#ifdef BLOCKSPEC_HAS_CUDA
// The FP8 product's kernels (Backend::matmul_fp8 for BF16 x: v1, the default, and v2,
// BLOCKSPEC_FP8_KERNEL=v2) against an independent fp64 reference, row-count invariance bit for
// bit, and graph replay. Shapes: the draft step's o_proj (v2 splits k 8 ways), odd m with k
// split unevenly, a long k (12288), the smallest k (16) and k not a multiple of 64.
struct Fp8Shape {
  int64_t m, k;
};
const std::vector<Fp8Shape> kFp8Shapes = {{4096, 4096}, {1003, 4096}, {300, 12288},
                                          {70, 16},     {37, 48},     {45, 4112}};
const std::vector<std::pair<cuda::Fp8Kernel, std::string>> kFp8Kernels = {
    {cuda::Fp8Kernel::kV2, "v2"}, {cuda::Fp8Kernel::kBulk, "bulk"}, {cuda::Fp8Kernel::kV1, "v1"}};

// The reference of an FP8 product: y[r, j] = scale[j] * sum_c f16(x[r, c]) * e4m3(q[j, c]) in
// fp64 (x rounded to FP16 and saturated at +-65504, as the kernels take it), and the same sum
// of |terms| (which bounds the FP32 accumulation error).
struct Fp8Reference {
  std::vector<double> y, abs;
};
Fp8Reference fp8_reference(const std::vector<uint8_t>& codes, const std::vector<float>& scale,
                           const std::vector<float>& x, int64_t n, int64_t m, int64_t k) {
  std::vector<double> xh(x.size()), value(256);
  for (size_t i = 0; i < x.size(); ++i) {
    xh[i] = f16_to_f32(f32_to_f16(std::clamp(x[i], -65504.0f, 65504.0f)));
  }
  for (int b = 0; b < 256; ++b) value[b] = f8e4m3_to_f32(static_cast<uint8_t>(b));
  Fp8Reference ref{std::vector<double>(n * m), std::vector<double>(n * m)};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0, abs = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = xh[r * k + c] * value[codes[j * k + c]];
        sum += p;
        abs += std::fabs(p);
      }
      ref.y[r * m + j] = scale[j] * sum;
      ref.abs[r * m + j] = scale[j] * abs;
    }
  }
  return ref;
}

TEST_F(CudaOps, Fp8KernelsMatchFp64Reference) {
  for (const Fp8Shape& c : kFp8Shapes) {
    auto wv = rnd(c.m * c.k, 0.05f);
    std::fill(wv.begin() + 3 * c.k, wv.begin() + 4 * c.k, 0.0f);  // an all-zero row
    const Fp8Weight w = gpu_->quantize_fp8_rows(weight(*gpu_, {c.m, c.k}, wv));
    std::vector<uint8_t> codes(static_cast<size_t>(c.m * c.k));
    gpu_->copy_to_host(codes.data(), w.q);
    const auto scale = gpu_->to_host_f32(w.scale);
    for (const int64_t n : {1, 5, 16}) {
      auto xv = rnd(n * c.k);
      xv[std::min<int64_t>(5, c.k - 1)] = bf16_to_f32(f32_to_bf16(1e5f));  // FP16: 65504
      const Fp8Reference ref = fp8_reference(codes, scale, xv, n, c.m, c.k);
      const auto yv = rnd(n * c.m);
      Tensor gx = gpu_act({n, c.k}, xv);
      for (const auto& [kernel, name] : kFp8Kernels) {
        cuda::set_fp8_kernel(*gpu_, kernel);
        for (const DType out : {DType::kF32, DType::kBF16}) {
          for (const bool accumulate : {false, true}) {
            const std::string what = name + " m=" + std::to_string(c.m) +
                                     " k=" + std::to_string(c.k) + " n=" + std::to_string(n) +
                                     (out == DType::kF32 ? " f32" : " bf16") +
                                     (accumulate ? " accumulate" : "");
            Tensor gy = gpu_act({n, c.m}, yv, out);
            gpu_->matmul_fp8(gy, gx, w, accumulate);
            const auto got = gpu_->to_host_f32(gy);
            // FP32 accumulation: products exact, each of the k / 16 MMA steps and each split
            // addition within 17 units of 2^-23 of the sum of |terms| (truncating alignment),
            // one rounding for the scale; BF16 output adds half a BF16 unit.
            const double steps = static_cast<double>(c.k) / 16 + 64 + 2;
            std::vector<double> num(n), den(n);
            int bad = 0;
            for (int64_t i = 0; i < n * c.m; ++i) {
              const double prev = accumulate ? static_cast<double>(yv[i]) : 0.0;
              const double want = prev + ref.y[i];
              const double out_tol =
                  out == DType::kF32 ? std::ldexp(4.0, -24) : std::ldexp(1.0, -8);
              const double tol = 17 * steps * std::ldexp(ref.abs[i], -23) +
                                 out_tol * (std::fabs(want) + std::fabs(prev)) + 1e-30;
              if (!(std::fabs(got[i] - want) <= tol) && ++bad <= 3) {
                ADD_FAILURE() << what << " i=" << i << " got " << got[i] << " want " << want
                              << " tol " << tol;
              }
              num[i / c.m] += (got[i] - want) * (got[i] - want);
              den[i / c.m] += want * want;
            }
            EXPECT_EQ(bad, 0) << what;
            // Row-wise norms: rounding alone stays far below these (a missing 16-k piece of
            // 12288 would be ~4 %).
            for (int64_t r = 0; r < n; ++r) {
              EXPECT_LE(std::sqrt(num[r] / den[r]), out == DType::kF32 ? 3e-4 : 4e-3)
                  << what << " row " << r;
            }
          }
        }
      }
    }
  }
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
}

// Row r of an n-row product is the same bits for every n (1..17 and 40: more than 16 rows are
// several launches), F32 output so that no rounding to BF16 hides a different summation order,
// with and without accumulation.
TEST_F(CudaOps, Fp8KernelsRowsAreBitIdenticalForEveryRowCount) {
  const int64_t rows = 40;
  for (const Fp8Shape& c : kFp8Shapes) {
    const Fp8Weight w = gpu_->quantize_fp8_rows(weight(*gpu_, {c.m, c.k}, rnd(c.m * c.k, 0.05f)));
    Tensor gx = gpu_act({rows, c.k}, rnd(rows * c.k));
    const auto yv = rnd(rows * c.m);
    for (const auto& [kernel, name] : kFp8Kernels) {
      cuda::set_fp8_kernel(*gpu_, kernel);
      for (const bool accumulate : {false, true}) {
        Tensor all = gpu_act({rows, c.m}, yv, DType::kF32);
        gpu_->matmul_fp8(all, gx, w, accumulate);
        const auto ref = gpu_->to_host_f32(all);
        std::vector<int64_t> counts(17);
        std::iota(counts.begin(), counts.end(), 1);
        counts.push_back(33);
        for (const int64_t n : counts) {
          Tensor part =
              gpu_act({n, c.m}, std::vector<float>(yv.begin(), yv.begin() + n * c.m), DType::kF32);
          gpu_->matmul_fp8(part, gx.rows(0, n), w, accumulate);
          const auto got = gpu_->to_host_f32(part);
          EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
              << name << " m=" << c.m << " k=" << c.k << " rows=" << n
              << (accumulate ? " accumulate" : "");
        }
      }
    }
  }
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
}

// The bulk kernel splits k over its 8 consumer warps exactly as v1 splits it over its 8 warps and
// sums them and scales the same way: the same bits as v1 for every shape, row count (x a chunk a
// stage up to 8 rows, x resident for 9-16 rows with k <= 4096, several launches past 16), output
// type and accumulation; a stage read before its copy landed or a chunk off by one shows here.
TEST_F(CudaOps, Fp8BulkKernelGivesV1Bits) {
  for (const Fp8Shape& c : kFp8Shapes) {
    const Fp8Weight w = gpu_->quantize_fp8_rows(weight(*gpu_, {c.m, c.k}, rnd(c.m * c.k, 0.05f)));
    for (const int64_t n : {1, 5, 9, 16, 40}) {
      Tensor gx = gpu_act({n, c.k}, rnd(n * c.k));
      const auto yv = rnd(n * c.m);
      for (const DType out : {DType::kF32, DType::kBF16}) {
        for (const bool accumulate : {false, true}) {
          std::vector<float> v1;
          for (const cuda::Fp8Kernel kernel : {cuda::Fp8Kernel::kV1, cuda::Fp8Kernel::kBulk}) {
            cuda::set_fp8_kernel(*gpu_, kernel);
            Tensor y = gpu_act({n, c.m}, yv, out);
            gpu_->matmul_fp8(y, gx, w, accumulate);
            const auto got = gpu_->to_host_f32(y);
            if (kernel == cuda::Fp8Kernel::kV1) {
              v1 = got;
              continue;
            }
            EXPECT_EQ(std::memcmp(got.data(), v1.data(), got.size() * sizeof(float)), 0)
                << "m=" << c.m << " k=" << c.k << " n=" << n
                << (out == DType::kBF16 ? " bf16" : " f32") << (accumulate ? " accumulate" : "");
          }
        }
      }
    }
  }
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
}

// The bulk FP8 kernel's fused forms (norm_matmul_fp8 / swiglu_matmul_fp8 with kBulk): against
// fp64 references of the ops' definitions on the quantized weights (x operand rounded to FP16 as
// the kernels take it, after BF16 for the SwiGLU operand), SwiGLU fused == the ops apart bit for
// bit, and row r of an n-row call equals the row alone (1..16 rows and 40: several launches).
TEST_F(CudaOps, Fp8BulkFusedFormsMatchReferencesAndKeepRowsInvariant) {
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kBulk);
  for (const Fp8Shape& c : kFp8Shapes) {
    const std::string shape = fmt::format("m={} k={}", c.m, c.k);
    const Fp8Weight w = gpu_->quantize_fp8_rows(weight(*gpu_, {c.m, c.k}, rnd(c.m * c.k, 0.05f)));
    std::vector<uint8_t> codes(static_cast<size_t>(c.m * c.k));
    gpu_->copy_to_host(codes.data(), w.q);
    const auto scale = gpu_->to_host_f32(w.scale);
    const int64_t rows = 40;
    const auto xv = rnd(rows * c.k), gv = rnd(c.k, 0.5f), guv = rnd(rows * 2 * c.k);
    Tensor gx = gpu_act({rows, c.k}, xv), gg = weight(*gpu_, {c.k}, gv);
    Tensor ggu = gpu_act({rows, 2 * c.k}, guv);
    Tensor scratch = make(*gpu_, {rows, c.k}, DType::kBF16);
    const float eps = 1e-6f;
    for (const bool swiglu : {false, true}) {
      const std::string what = shape + (swiglu ? " swiglu" : " norm");
      const auto call = [&](const Tensor& y, int64_t r0, int64_t n, bool accumulate) {
        if (swiglu) {
          gpu_->swiglu_matmul_fp8(y, scratch.rows(0, n), ggu.rows(r0, n), w, accumulate);
        } else {
          gpu_->norm_matmul_fp8(y, scratch.rows(0, n), gx.rows(r0, n), gg, eps, w, accumulate);
        }
      };
      // fp64 reference for the first 5 rows: the operand as the fused kernel forms it.
      const int64_t n = 5;
      std::vector<float> op(n * c.k);
      std::vector<double> inv(n, 1.0);
      for (int64_t r = 0; r < n; ++r) {
        double sq = 0;
        for (int64_t i = 0; i < c.k; ++i) sq += double(xv[r * c.k + i]) * xv[r * c.k + i];
        if (!swiglu) inv[r] = 1.0 / std::sqrt(sq / c.k + eps);
        for (int64_t i = 0; i < c.k; ++i) {
          const float g = guv[r * 2 * c.k + i], u = guv[r * 2 * c.k + c.k + i];
          op[r * c.k + i] = swiglu ? bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g)) * u))
                                   : bf16_to_f32(f32_to_bf16(xv[r * c.k + i] * gv[i]));
        }
      }
      const Fp8Reference ref = fp8_reference(codes, scale, op, n, c.m, c.k);
      Tensor y = make(*gpu_, {n, c.m}, DType::kF32);
      call(y, 0, n, false);
      const auto got = gpu_->to_host_f32(y);
      double worst = 0;
      for (int64_t o = 0; o < n * c.m; ++o) {
        const double want = ref.y[o] * inv[o / c.m];
        // The operand's own BF16 rounding is in the reference; FP32 sums, the FP16 rounding of
        // the operand (2^-11) and the product's terms bound the rest.
        worst = std::max(worst, std::fabs(got[o] - want) / (ref.abs[o] * inv[o / c.m] + 1e-3));
      }
      EXPECT_LT(worst, 2e-3) << what;
      if (swiglu) {  // fused == swiglu then the bulk product, bit for bit
        Tensor apart = make(*gpu_, {n, c.m}, DType::kF32);
        cuda::set_stream_fusion(*gpu_, false);
        call(apart, 0, n, false);
        cuda::set_stream_fusion(*gpu_, true);
        EXPECT_EQ(gpu_->to_host_f32(apart), got) << what;
      }
      // Rows: every count against the 40-row call, F32 output, with accumulation.
      const auto yv = rnd(rows * c.m);
      Tensor all = gpu_act({rows, c.m}, yv, DType::kF32);
      call(all, 0, rows, true);
      const auto want_rows = gpu_->to_host_f32(all);
      for (const int64_t count : {1, 2, 8, 9, 16, 17, 33}) {
        Tensor part = gpu_act(
            {count, c.m}, std::vector<float>(yv.begin(), yv.begin() + count * c.m), DType::kF32);
        call(part, 0, count, true);
        const auto got_rows = gpu_->to_host_f32(part);
        EXPECT_EQ(std::memcmp(got_rows.data(), want_rows.data(), got_rows.size() * 4), 0)
            << what << " rows=" << count;
      }
    }
  }
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
}

// Inside run_captured (eager, captured, then replayed): the same bits every time, also after a
// product of another shape ran in between (v2's split counters are left at zero by every launch).
TEST_F(CudaOps, Fp8KernelsReplayCapturedGraphsWithTheSameBits) {
  const int64_t n = 16, m = 1003, k = 4096;
  const Fp8Weight w = gpu_->quantize_fp8_rows(weight(*gpu_, {m, k}, rnd(m * k, 0.05f)));
  const Fp8Weight other = gpu_->quantize_fp8_rows(weight(*gpu_, {70, 4096}, rnd(70 * 4096, 0.05f)));
  Tensor gx = gpu_act({n, k}, rnd(n * k));
  for (const auto& [kernel, name] : kFp8Kernels) {
    cuda::set_fp8_kernel(*gpu_, kernel);
    Tensor y = make(*gpu_, {n, m}, DType::kBF16), y32 = make(*gpu_, {n, m}, DType::kF32);
    Tensor yo = make(*gpu_, {n, 70}, DType::kF32);
    std::vector<float> first, first32;
    for (int round = 0; round < 4; ++round) {
      gpu_->run_captured("test:fp8-" + name, [&] {
        gpu_->matmul_fp8(y, gx, w);
        gpu_->matmul_fp8(y32, gx, w);
      });
      gpu_->matmul_fp8(yo, gx, other);
      const auto got = gpu_->to_host_f32(y), got32 = gpu_->to_host_f32(y32);
      if (round == 0) {
        first = got;
        first32 = got32;
        continue;
      }
      EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0)
          << name << " round " << round;
      EXPECT_EQ(std::memcmp(got32.data(), first32.data(), got32.size() * sizeof(float)), 0)
          << name << " f32, round " << round;
    }
  }
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
}
#endif

TEST_F(CudaOps, AttentionRowsAreIndependentOfRowCount) {
  const int64_t heads = 8, kv_heads = 2, hd = 128, kv_len = 200, n = 16;
  const PagedKv kv = random_paged_kv(kv_len / 16 + 2, kv_len, kv_heads, hd, /*shuffle=*/false);
  Tensor q = gpu_act({n, heads, hd}, rnd(n * heads * hd));
  const float scale = 0.088f;
  // 16 verify rows at positions kv_len-16 .. kv_len-1 vs row 0 alone (decode at kv_len-15).
  Tensor o16 = make(*gpu_, {n, heads, hd}, DType::kBF16),
         o1 = make(*gpu_, {1, heads, hd}, DType::kBF16);
  gpu_->paged_attention(o16, q, kv.k_pool, kv.v_pool, kv.table, kv_len, {}, scale);
  gpu_->paged_attention(o1, q.rows(0, 1), kv.k_pool, kv.v_pool, kv.table, kv_len - n + 1, {},
                        scale);
  const auto a = gpu_->to_host_f32(o16), b = gpu_->to_host_f32(o1);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
}

TEST_F(CudaOps, MatmulInPlaceAccumulateOnRowView) {
  // The decoder's residual update: x += attn . Wo^T on a row view of a larger scratch buffer.
  const int64_t rows = 20, n = 3, k = 64, m = 48;
  const auto xv = rnd(rows * m), av = rnd(rows * k), wv = rnd(m * k, 0.1f);
  Tensor gx = gpu_act({rows, m}, xv), cx = cpu_act({rows, m}, xv);
  Tensor ga = gpu_act({rows, k}, av), ca = cpu_act({rows, k}, av);
  Tensor gw = weight(*gpu_, {m, k}, wv), cw = weight(*cpu_, {m, k}, wv);
  gpu_->matmul(gx.rows(5, n), ga.rows(2, n), gw, nullptr, true);
  cpu_->matmul(cx.rows(5, n), ca.rows(2, n), cw, nullptr, true);
  expect_close(gx, cx, kBf16Tol, "row-view accumulate");
}

TEST_F(CudaOps, GemmTransposes) {
  for (const DType t : {DType::kBF16, DType::kF32}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      const int64_t n = 7, k = 33, m = 21;
      const Shape sa = ta ? Shape{k, n} : Shape{n, k};
      const Shape sb = tb ? Shape{m, k} : Shape{k, m};
      const auto av = rnd(n * k), bv = rnd(k * m);
      Tensor ga = gpu_act(sa, av, t), ca = cpu_act(sa, av);
      Tensor gb = gpu_act(sb, bv, t), cb = cpu_act(sb, bv);
      Tensor gy = make(*gpu_, {n, m}, t), cy = make(*cpu_, {n, m}, DType::kF32);
      gpu_->gemm(gy, ga, gb, ta, tb);
      cpu_->gemm(cy, ca, cb, ta, tb);
      expect_close(gy, cy, t == DType::kF32 ? 1e-5 : kBf16Tol,
                   "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                       " dtype=" + std::string(dtype_name(t)));
    }
  }
}

TEST_F(CudaOps, Elementwise) {
  const int64_t rows = 6, d = 300;
  const auto av = rnd(rows * d), bv = rnd(rows * d), gv = rnd(d), yv = rnd(rows * d);
  Tensor ga = gpu_act({rows, d}, av), ca = cpu_act({rows, d}, av);
  Tensor gb = gpu_act({rows, d}, bv), cb = cpu_act({rows, d}, bv);
  auto check = [&](const std::string& what, auto&& gpu_op, auto&& cpu_op) {
    Tensor gy = gpu_act({rows, d}, yv), cy = cpu_act({rows, d}, yv);
    gpu_op(gy);
    cpu_op(cy);
    expect_close(gy, cy, kBf16Tol, what);
  };
  check(
      "add", [&](const Tensor& y) { gpu_->add(y, ga, gb); },
      [&](const Tensor& y) { cpu_->add(y, ca, cb); });
  check(
      "mul", [&](const Tensor& y) { gpu_->mul(y, ga, gb); },
      [&](const Tensor& y) { cpu_->mul(y, ca, cb); });
  check(
      "silu_mul", [&](const Tensor& y) { gpu_->silu_mul(y, ga, gb); },
      [&](const Tensor& y) { cpu_->silu_mul(y, ca, cb); });
  check(
      "silu", [&](const Tensor& y) { gpu_->silu(y, ga); },
      [&](const Tensor& y) { cpu_->silu(y, ca); });
  check(
      "gelu_tanh", [&](const Tensor& y) { gpu_->gelu(y, ga, true); },
      [&](const Tensor& y) { cpu_->gelu(y, ca, true); });
  check(
      "gelu_erf", [&](const Tensor& y) { gpu_->gelu(y, ga, false); },
      [&](const Tensor& y) { cpu_->gelu(y, ca, false); });
  check(
      "axpby", [&](const Tensor& y) { gpu_->axpby(y, 0.7f, ga, -1.3f, gb); },
      [&](const Tensor& y) { cpu_->axpby(y, 0.7f, ca, -1.3f, cb); });
  Tensor gg = weight(*gpu_, {d}, gv), cg = weight(*cpu_, {d}, gv);
  check(
      "gated_add", [&](const Tensor& y) { gpu_->gated_add(y, ga, gg); },
      [&](const Tensor& y) { cpu_->gated_add(y, ca, cg); });
  // In place: y = silu(y) * b (the decoder's silu_mul(gate, gate, up)).
  check(
      "silu_mul in place", [&](const Tensor& y) { gpu_->silu_mul(y, y, gb); },
      [&](const Tensor& y) { cpu_->silu_mul(y, y, cb); });
  // modulate with shared [d] and per-row [rows, d] shift/scale.
  const auto sv = rnd(d, 0.3f), tv = rnd(d, 0.3f);
  Tensor gs = gpu_act({d}, sv), cs = cpu_act({d}, sv), gt = gpu_act({d}, tv), ct = cpu_act({d}, tv);
  check(
      "modulate shared", [&](const Tensor& y) { gpu_->modulate(y, ga, gs, gt); },
      [&](const Tensor& y) { cpu_->modulate(y, ca, cs, ct); });
  check(
      "modulate per row", [&](const Tensor& y) { gpu_->modulate(y, ga, gb, ga); },
      [&](const Tensor& y) { cpu_->modulate(y, ca, cb, ca); });
}

TEST_F(CudaOps, Norms) {
  for (const int64_t d : {8, 64, 128, 300, 4096}) {
    const int64_t rows = 5;
    const auto xv = rnd(rows * d, 2.0f), wv = rnd(d), bv = rnd(d);
    Tensor gx = gpu_act({rows, d}, xv), cx = cpu_act({rows, d}, xv);
    Tensor gw = weight(*gpu_, {d}, wv), cw = weight(*cpu_, {d}, wv);
    Tensor gb = weight(*gpu_, {d}, bv), cb = weight(*cpu_, {d}, bv);
    Tensor gy = make(*gpu_, {rows, d}, DType::kBF16), cy = make(*cpu_, {rows, d}, DType::kF32);
    gpu_->rms_norm(gy, gx, gw, 1e-6f);
    cpu_->rms_norm(cy, cx, cw, 1e-6f);
    expect_close(gy, cy, kBf16Tol, "rms_norm d=" + std::to_string(d));
    gpu_->layer_norm(gy, gx, d, gw, gb, 1e-5f);
    cpu_->layer_norm(cy, cx, d, cw, cb, 1e-5f);
    expect_close(gy, cy, kBf16Tol, "layer_norm d=" + std::to_string(d));
    gpu_->layer_norm(gy, gx, d, Tensor(), Tensor(), 1e-5f);
    cpu_->layer_norm(cy, cx, d, Tensor(), Tensor(), 1e-5f);
    expect_close(gy, cy, kBf16Tol, "layer_norm no affine d=" + std::to_string(d));
    // In place, per head (rows of a wider tensor), as q/k norm does.
    gpu_->rms_norm(gx, gx, gw, 1e-6f);
    cpu_->rms_norm(cx, cx, cw, 1e-6f);
    expect_close(gx, cx, kBf16Tol, "rms_norm in place d=" + std::to_string(d));
  }
}

TEST_F(CudaOps, RopeMatchesAtLargePositions) {
  for (const int64_t hd : {8, 64, 128}) {
    const int64_t n = 5, heads = 3, half = hd / 2;
    std::vector<float> freq(half);
    for (int64_t i = 0; i < half; ++i) {
      freq[i] = static_cast<float>(std::pow(1e6, -2.0 * i / hd));
    }
    const std::vector<int32_t> pos = {0, 1, 17, 4095, 40000};
    const auto xv = rnd(n * heads * hd);
    Tensor gx = gpu_act({n, heads, hd}, xv), cx = cpu_act({n, heads, hd}, xv);
    Tensor gf = weight(*gpu_, {half}, freq), cf = weight(*cpu_, {half}, freq);
    gpu_->rope(gx, gpu_ints(pos), gf, 1.0f);
    cpu_->rope(cx, cpu_ints(pos), cf, 1.0f);
    expect_close(gx, cx, kBf16Tol, "rope hd=" + std::to_string(hd));
    gpu_->rope(gx, gpu_ints(pos), gf, 0.8f);
    cpu_->rope(cx, cpu_ints(pos), cf, 0.8f);
    expect_close(gx, cx, kBf16Tol, "rope scaled hd=" + std::to_string(hd));
  }
}

TEST_F(CudaOps, EmbeddingIsExact) {
  const int64_t vocab = 1000, d = 96;
  const auto tv = rnd(vocab * d);
  Tensor gt = weight(*gpu_, {vocab, d}, tv), ct = weight(*cpu_, {vocab, d}, tv);
  const std::vector<int32_t> ids = {0, 999, 5, 5, 512};
  Tensor gy = make(*gpu_, {5, d}, DType::kBF16), cy = make(*cpu_, {5, d}, DType::kF32);
  gpu_->embedding(gy, gpu_ints(ids), gt);
  cpu_->embedding(cy, cpu_ints(ids), ct);
  EXPECT_EQ(gpu_->to_host_f32(gy), cpu_->to_host_f32(cy));
}

TEST_F(CudaOps, UploadWeightFromEveryDtype) {
  const int64_t n = 257;
  const auto v = rnd(n * 2, 3.0f);
  std::vector<uint16_t> bf(v.size()), hf(v.size());
  std::vector<uint8_t> f8(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    bf[i] = f32_to_bf16(v[i]);
    hf[i] = f32_to_f16(v[i]);
    f8[i] = f32_to_f8e4m3(v[i]);
  }
  struct Src {
    DType t;
    const void* p;
  };
  for (const Src s : {Src{DType::kF32, v.data()}, Src{DType::kBF16, bf.data()},
                      Src{DType::kF16, hf.data()}, Src{DType::kF8E4M3, f8.data()}}) {
    Tensor g2 = gpu_->upload_weight(s.t, s.p, {2, n});
    Tensor c2 = cpu_->upload_weight(s.t, s.p, {2, n});
    EXPECT_EQ(g2.dtype(), DType::kBF16);
    expect_close(g2, c2, 4e-3, "upload 2-D from " + std::string(dtype_name(s.t)));
    Tensor g1 = gpu_->upload_weight(s.t, s.p, {2 * n});
    Tensor c1 = cpu_->upload_weight(s.t, s.p, {2 * n});
    EXPECT_EQ(g1.dtype(), DType::kF32);
    EXPECT_EQ(gpu_->to_host_f32(g1), cpu_->to_host_f32(c1))
        << "upload 1-D from " << dtype_name(s.t);
  }
}

struct AttnCase {
  int64_t heads, kv_heads, hd, kv_len, n;
  bool causal;
  int64_t window;
};

TEST_F(CudaOps, PagedAttentionAllShapes) {
  const std::vector<AttnCase> cases = {
      {8, 4, 8, 1, 1, true, 0},       {8, 4, 8, 37, 1, true, 0},
      {8, 4, 8, 37, 37, true, 0},     {32, 8, 128, 300, 1, true, 0},
      {32, 8, 128, 300, 16, true, 0}, {32, 8, 128, 300, 16, false, 0},
      {4, 2, 16, 100, 8, false, 0},   {4, 2, 64, 100, 8, true, 24},
      {4, 2, 64, 100, 8, false, 24},  {6, 2, 8, 45, 5, true, 0},
      {32, 8, 128, 1500, 1, true, 0}, {2, 2, 256, 50, 3, true, 0},
      {4, 1, 96, 70, 70, true, 0}};
  for (const auto& c : cases) {
    const int64_t bs = 16, blocks = (c.kv_len + bs - 1) / bs + 3;
    // A shuffled block table, so that logical order differs from physical.
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng_);
    std::vector<int32_t> slots(c.kv_len);
    for (int64_t p = 0; p < c.kv_len; ++p) {
      slots[p] = static_cast<int32_t>(table[p / bs] * bs + p % bs);
    }
    const int64_t row = c.kv_heads * c.hd;
    const auto kv = rnd(c.kv_len * row), vv = rnd(c.kv_len * row), qv = rnd(c.n * c.heads * c.hd);
    Tensor gkp = make(*gpu_, {blocks, bs, c.kv_heads, c.hd}, DType::kBF16);
    Tensor gvp = make(*gpu_, {blocks, bs, c.kv_heads, c.hd}, DType::kBF16);
    Tensor ckp = make(*cpu_, {blocks, bs, c.kv_heads, c.hd}, DType::kF32);
    Tensor cvp = make(*cpu_, {blocks, bs, c.kv_heads, c.hd}, DType::kF32);
    Tensor gk = gpu_act({c.kv_len, c.kv_heads, c.hd}, kv),
           ck = cpu_act({c.kv_len, c.kv_heads, c.hd}, kv);
    Tensor gv = gpu_act({c.kv_len, c.kv_heads, c.hd}, vv),
           cv = cpu_act({c.kv_len, c.kv_heads, c.hd}, vv);
    gpu_->kv_write(gkp, gvp, gk, gv, gpu_ints(slots));
    cpu_->kv_write(ckp, cvp, ck, cv, cpu_ints(slots));
    EXPECT_EQ(gpu_->to_host_f32(gkp), cpu_->to_host_f32(ckp));
    EXPECT_EQ(gpu_->to_host_f32(gvp), cpu_->to_host_f32(cvp));
    Tensor gq = gpu_act({c.n, c.heads, c.hd}, qv), cq = cpu_act({c.n, c.heads, c.hd}, qv);
    Tensor go = make(*gpu_, {c.n, c.heads, c.hd}, DType::kBF16);
    Tensor co = make(*cpu_, {c.n, c.heads, c.hd}, DType::kF32);
    const AttentionMask mask{.causal = c.causal, .window = c.window};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    gpu_->paged_attention(go, gq, gkp, gvp, gpu_ints(table), c.kv_len, mask, scale);
    cpu_->paged_attention(co, cq, ckp, cvp, cpu_ints(table), c.kv_len, mask, scale);
    const std::string what = "paged heads=" + std::to_string(c.heads) + "/" +
                             std::to_string(c.kv_heads) + " hd=" + std::to_string(c.hd) +
                             " kv_len=" + std::to_string(c.kv_len) + " n=" + std::to_string(c.n) +
                             " causal=" + std::to_string(c.causal) +
                             " window=" + std::to_string(c.window);
    expect_close(go, co, kBf16Tol, what);
    // Dense attention over the same keys.
    Tensor gd = make(*gpu_, {c.n, c.heads, c.hd}, DType::kBF16);
    Tensor cd = make(*cpu_, {c.n, c.heads, c.hd}, DType::kF32);
    gpu_->attention(gd, gq, gk, gv, mask, scale);
    cpu_->attention(cd, cq, ck, cv, mask, scale);
    expect_close(gd, cd, kBf16Tol, "dense " + what);
  }
}

// Prompt rows (more than 16 per sequence, causal, head dim 64 / 128) take the tensor-core flash
// prefill kernel: random head counts, GQA ratios, chunk offsets (queries at [start, start + n)
// over the cache [0, start + n)), sliding windows and shuffled block tables against the CPU.
TEST_F(CudaOps, FlashPrefillMatchesCpuAcrossShapes) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  for (int it = 0; it < 24; ++it) {
    const int64_t hd = it % 2 ? 128 : 64;
    const int64_t kv_heads = int64_t{1} << (pick(rng_) % 4), group = int64_t{1} << (pick(rng_) % 4);
    const int64_t heads = kv_heads * group;
    const int64_t n = 17 + pick(rng_) % 240;
    const int64_t start = it < 4 ? 0 : pick(rng_) % 700;  // the chunk's offset in the cache
    const int64_t kv_len = start + n;
    const int64_t window = it % 5 == 4 ? 20 + pick(rng_) % 180 : 0;
    const int64_t bs = 16, blocks = (kv_len + bs - 1) / bs + 2;
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng_);
    std::vector<int32_t> slots(kv_len);
    for (int64_t p = 0; p < kv_len; ++p) slots[p] = table[p / bs] * bs + p % bs;
    const int64_t row = kv_heads * hd;
    const auto kv = rnd(kv_len * row), vv = rnd(kv_len * row), qv = rnd(n * heads * hd);
    const Shape pool{blocks, bs, kv_heads, hd};
    Tensor gkp = make(*gpu_, pool, DType::kBF16), gvp = make(*gpu_, pool, DType::kBF16);
    Tensor ckp = make(*cpu_, pool, DType::kF32), cvp = make(*cpu_, pool, DType::kF32);
    gpu_->kv_write(gkp, gvp, gpu_act({kv_len, kv_heads, hd}, kv),
                   gpu_act({kv_len, kv_heads, hd}, vv), gpu_ints(slots));
    cpu_->kv_write(ckp, cvp, cpu_act({kv_len, kv_heads, hd}, kv),
                   cpu_act({kv_len, kv_heads, hd}, vv), cpu_ints(slots));
    Tensor gq = gpu_act({n, heads, hd}, qv), cq = cpu_act({n, heads, hd}, qv);
    Tensor go = make(*gpu_, {n, heads, hd}, DType::kBF16);
    Tensor co = make(*cpu_, {n, heads, hd}, DType::kF32);
    const AttentionMask mask{.causal = true, .window = window};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const Tensor gtable = gpu_ints(table);
    gpu_->paged_attention(go, gq, gkp, gvp, gtable, kv_len, mask, scale);
    cpu_->paged_attention(co, cq, ckp, cvp, cpu_ints(table), kv_len, mask, scale);
    const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                             " hd " + std::to_string(hd) + " start " + std::to_string(start) +
                             " n " + std::to_string(n) + " window " + std::to_string(window);
    expect_close(go, co, kBf16Tol, what);
    // A device length under a larger launch bound gives the same bits.
    Tensor gd = make(*gpu_, {n, heads, hd}, DType::kBF16);
    const Tensor len = gpu_ints({static_cast<int32_t>(kv_len)});
    gpu_->paged_attention(gd, gq, gkp, gvp, gtable, KvLength(blocks * bs, &len), mask, scale);
    EXPECT_EQ(gpu_->to_host_f32(gd), gpu_->to_host_f32(go)) << "device length, " << what;
    // Row invariance: the first 17+ rows as a call of their own (a shorter chunk ending earlier)
    // equal the same rows of the whole call.
    const int64_t part = 17 + pick(rng_) % (n - 16);
    Tensor gp = make(*gpu_, {part, heads, hd}, DType::kBF16);
    gpu_->paged_attention(gp, gq.rows(0, part), gkp, gvp, gtable, kv_len - n + part, mask, scale);
    const auto whole = gpu_->to_host_f32(go), first = gpu_->to_host_f32(gp);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), whole.begin()))
        << "rows 0.." << part << " alone, " << what;
  }
}

// A batch of prompt chunks (paged_attention_batch with more than 16 rows per sequence, device
// lengths) equals each sequence's own call bit for bit.
TEST_F(CudaOps, FlashPrefillBatchRowsEqualSingleSequenceCalls) {
  const int64_t heads = 32, kv_heads = 8, hd = 128, capacity = 40, n = 48;
  const std::vector<int32_t> lens{48, 130, 577};
  const int64_t num_seqs = static_cast<int64_t>(lens.size()), blocks = num_seqs * capacity;
  const PagedKv kv = random_paged_kv(blocks, blocks * 16, kv_heads, hd, /*shuffle=*/true);
  const Tensor tables = kv.table.view({num_seqs, capacity});
  Tensor q = gpu_act({num_seqs * n, heads, hd}, rnd(num_seqs * n * heads * hd));
  Tensor out = make(*gpu_, {num_seqs * n, heads, hd}, DType::kBF16);
  gpu_->paged_attention_batch(out, q, kv.k_pool, kv.v_pool, tables, gpu_ints(lens), capacity * 16,
                              {}, 0.088f);
  const auto batched = gpu_->to_host_f32(out);
  for (int64_t s = 0; s < num_seqs; ++s) {
    Tensor single = make(*gpu_, {n, heads, hd}, DType::kBF16);
    gpu_->paged_attention(single, q.rows(s * n, n), kv.k_pool, kv.v_pool,
                          tables.rows(s, 1).view({capacity}), lens[s], {}, 0.088f);
    const auto want = gpu_->to_host_f32(single);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), batched.begin() + s * n * heads * hd))
        << "sequence " << s << " kv_len " << lens[s];
  }
}

TEST_F(CudaOps, ArgmaxFirstIndexOnTies) {
  // Long rows take the two-pass (chunked) kernel: ties across chunks, a maximum in the last,
  // partial chunk, all-equal and all -inf rows.
  for (const int64_t v : {7, 1000, 16385, 151936}) {
    const int64_t rows = 5;
    auto xv = rnd(rows * v);
    // Row 1: a tie for the maximum at two places; row 2: all equal; row 3: the maximum is the
    // last element; row 4: all -inf.
    xv[v + v / 3] = 100.0f;
    xv[v + v / 2] = 100.0f;
    std::fill(xv.begin() + 2 * v, xv.begin() + 3 * v, -2.0f);
    xv[4 * v - 1] = 50.0f;
    std::fill(xv.begin() + 4 * v, xv.end(), -INFINITY);
    Tensor gx = gpu_act({rows, v}, xv), cx = cpu_act({rows, v}, xv);
    Tensor go = gpu_->empty({rows}, DType::kI32), co = cpu_->empty({rows}, DType::kI32);
    gpu_->argmax(go, gx);
    cpu_->argmax(co, cx);
    std::vector<int32_t> a(rows), b(rows);
    gpu_->copy_to_host(a.data(), go);
    cpu_->copy_to_host(b.data(), co);
    EXPECT_EQ(a, b) << "v=" << v;
  }
}

TEST_F(CudaOps, GreedyAcceptMatchesCpu) {
  // Batches of verify blocks with 0..40 drafts (more than a warp), accepted up to a random first
  // mismatch or entirely, into outputs wider than needed (trailing zeros) and filled with junk.
  for (int iter = 0; iter < 50; ++iter) {
    const int64_t seqs = 1 + iter % 17;
    std::vector<int32_t> offsets = {0}, tokens, target;
    int64_t width = 2;
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t k = static_cast<int64_t>(rng_() % 41);
      const int64_t mismatch = static_cast<int64_t>(rng_() % static_cast<uint32_t>(k + 1));
      tokens.push_back(static_cast<int32_t>(rng_() % 1000));  // the anchor
      const size_t first = target.size();
      for (int64_t i = 0; i <= k; ++i) target.push_back(static_cast<int32_t>(rng_() % 1000));
      for (int64_t i = 0; i < k; ++i) {
        const int32_t t = target[first + static_cast<size_t>(i)];
        tokens.push_back(
            i < mismatch ? t : (i == mismatch ? t + 1 : static_cast<int32_t>(rng_() % 1000)));
      }
      offsets.push_back(static_cast<int32_t>(tokens.size()));
      width = std::max(width, k + 2);
    }
    width += iter % 3;
    const std::vector<int32_t> junk(static_cast<size_t>(seqs * width), -5);
    Tensor go = gpu_->empty({seqs, width}, DType::kI32),
           co = cpu_->empty({seqs, width}, DType::kI32);
    gpu_->copy_from_host(go, junk.data());
    cpu_->copy_from_host(co, junk.data());
    gpu_->greedy_accept(go, gpu_ints(tokens), gpu_ints(target), gpu_ints(offsets));
    cpu_->greedy_accept(co, cpu_ints(tokens), cpu_ints(target), cpu_ints(offsets));
    std::vector<int32_t> a(junk.size()), b(junk.size());
    gpu_->copy_to_host(a.data(), go);
    cpu_->copy_to_host(b.data(), co);
    EXPECT_EQ(a, b) << "iteration " << iter;
  }
}

TEST_F(CudaOps, SoftmaxAndNoiseCombine) {
  const int64_t rows = 4, v = 5000;
  const auto xv = rnd(rows * v, 3.0f);
  Tensor gx = gpu_act({rows, v}, xv), cx = cpu_act({rows, v}, xv);
  Tensor gy = make(*gpu_, {rows, v}, DType::kF32), cy = make(*cpu_, {rows, v}, DType::kF32);
  gpu_->softmax(gy, gx, 0.7f);
  cpu_->softmax(cy, cx, 0.7f);
  expect_close(gy, cy, 1e-4, "softmax f32 out");
  Tensor gyb = make(*gpu_, {rows, v}, DType::kBF16);
  gpu_->softmax(gyb, gx, 0.7f);
  expect_close(gyb, cy, kBf16Tol, "softmax bf16 out");

  const int64_t d = 64, e = 48;
  const auto bv = rnd(d), xv2 = rnd(rows * d), zv = rnd(rows * e), wv = rnd(e);
  std::vector<float> wpos(wv.size());
  for (size_t i = 0; i < wv.size(); ++i) wpos[i] = std::abs(wv[i]);
  Tensor gb = weight(*gpu_, {d}, bv), cb = weight(*cpu_, {d}, bv);
  Tensor gx2 = gpu_act({rows, d}, xv2), cx2 = cpu_act({rows, d}, xv2);
  Tensor gz = gpu_act({rows, e}, zv), cz = cpu_act({rows, e}, zv);
  Tensor gw = weight(*gpu_, {e}, wpos), cw = weight(*cpu_, {e}, wpos);
  Tensor go = make(*gpu_, {rows, d}, DType::kBF16), co = make(*cpu_, {rows, d}, DType::kF32);
  gpu_->noise_combine(go, gb, gx2, gz, gw, 0.9f, 1e-6f);
  cpu_->noise_combine(co, cb, cx2, cz, cw, 0.9f, 1e-6f);
  expect_close(go, co, kBf16Tol, "noise_combine");
}

TEST_F(CudaOps, SeededNormalMatchesCpu) {
  const std::vector<int32_t> pos = {0, 3, 100, 100000};
  for (const int64_t d : {1, 7, 64}) {
    const int64_t n = static_cast<int64_t>(pos.size());
    Tensor go = make(*gpu_, {n, d}, DType::kF32), co = make(*cpu_, {n, d}, DType::kF32);
    gpu_->seeded_normal(go, gpu_ints(pos), 42, 3, 0.5f);
    cpu_->seeded_normal(co, cpu_ints(pos), 42, 3, 0.5f);
    expect_close(go, co, 1e-6, "seeded_normal d=" + std::to_string(d));
  }
}

TEST_F(CudaOps, ColumnsCopiesAndScatter) {
  const int64_t n = 5, d = 24, big = 96;
  const auto sv = rnd(n * d), bv = rnd(n * big);
  Tensor gs = gpu_act({n, d}, sv), cs = cpu_act({n, d}, sv);
  Tensor gb = gpu_act({n, big}, bv), cb = cpu_act({n, big}, bv);
  gpu_->copy_columns(gb, 48, gs);
  cpu_->copy_columns(cb, 48, cs);
  EXPECT_EQ(gpu_->to_host_f32(gb), cpu_->to_host_f32(cb));
  Tensor gd = make(*gpu_, {n, d}, DType::kBF16), cd = make(*cpu_, {n, d}, DType::kF32);
  gpu_->slice_columns(gd, gb, 40);
  cpu_->slice_columns(cd, cb, 40);
  EXPECT_EQ(gpu_->to_host_f32(gd), cpu_->to_host_f32(cd));
  // Mixed dtypes take the kernel path.
  Tensor gd32 = make(*gpu_, {n, d}, DType::kF32);
  gpu_->slice_columns(gd32, gb, 40);
  EXPECT_EQ(gpu_->to_host_f32(gd32), cpu_->to_host_f32(cd));

  const int64_t v = 300;
  std::vector<int32_t> ids(d);
  for (int64_t j = 0; j < d; ++j) ids[j] = static_cast<int32_t>((j * 37 + 11) % v);
  Tensor gv = make(*gpu_, {n, v}, DType::kF32), cv = make(*cpu_, {n, v}, DType::kF32);
  gpu_->scatter_columns(gv, gs, gpu_ints(ids), -INFINITY);
  cpu_->scatter_columns(cv, cs, cpu_ints(ids), -INFINITY);
  EXPECT_EQ(gpu_->to_host_f32(gv), cpu_->to_host_f32(cv));

  Tensor gc = make(*gpu_, {n, d}, DType::kBF16);
  gpu_->copy(gc, gs);
  EXPECT_EQ(gpu_->to_host_f32(gc), gpu_->to_host_f32(gs));
  gpu_->fill_zero(gc);
  for (float x : gpu_->to_host_f32(gc)) ASSERT_EQ(x, 0.0f);
}

TEST_F(CudaOps, EmptyIsZeroAndPoolReuseIsSafe) {
  for (int round = 0; round < 3; ++round) {
    Tensor t = gpu_->empty({1000});
    gpu_->copy_from_host(t, std::vector<uint16_t>(1000, f32_to_bf16(5.0f)).data());
  }
  Tensor t = gpu_->empty({1000});
  for (float x : gpu_->to_host_f32(t)) ASSERT_EQ(x, 0.0f);
  // Many small host copies wrap the pinned ring; each must land intact.
  Tensor big = gpu_->empty({1 << 16}, DType::kI32);
  std::vector<int32_t> h(1 << 16);
  for (int round = 0; round < 200; ++round) {
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<int32_t>(i * 7 + round);
    gpu_->copy_from_host(big, h.data());
  }
  std::vector<int32_t> back(h.size());
  gpu_->copy_to_host(back.data(), big);
  EXPECT_EQ(back, h);
}

TEST_F(CudaOps, AttentionRowsIgnoreTheLaunchBoundAndADeviceLength) {
  // The captured decoder reads kv_len from a device tensor and launches for the whole table:
  // rows must equal the host-length call bit for bit, for decode (1 row) and verify (16 rows).
  const int64_t heads = 32, kv_heads = 8, hd = 128, blocks = 40;  // launch bound 640 keys
  for (const int64_t kv_len : {1, 63, 64, 65, 300}) {
    for (const int64_t n : {int64_t{1}, int64_t{16}}) {
      if (n > kv_len) continue;
      const PagedKv kv = random_paged_kv(blocks, kv_len, kv_heads, hd, /*shuffle=*/true);
      Tensor q = gpu_act({n, heads, hd}, rnd(n * heads * hd));
      Tensor a = make(*gpu_, {n, heads, hd}, DType::kBF16),
             b = make(*gpu_, {n, heads, hd}, DType::kBF16);
      const Tensor len = gpu_ints({static_cast<int32_t>(kv_len)});
      gpu_->paged_attention(a, q, kv.k_pool, kv.v_pool, kv.table, kv_len, {}, 0.088f);
      gpu_->paged_attention(b, q, kv.k_pool, kv.v_pool, kv.table, KvLength(blocks * 16, &len), {},
                            0.088f);
      EXPECT_EQ(gpu_->to_host_f32(a), gpu_->to_host_f32(b)) << "kv_len " << kv_len << " n " << n;
    }
  }
}

TEST_F(CudaOps, PagedAttentionBatchRowsEqualSingleSequenceCalls) {
  // Batched decode / verify: S sequences in one launch, each with its own block-table row and
  // device length (below the launch bound, not multiples of 64, one of 1), must give every row
  // the single-sequence call's bits.
  const int64_t heads = 32, kv_heads = 8, hd = 128, capacity = 20;  // launch bound 320 keys
  const std::vector<int32_t> lengths{1, 63, 300, 65, 64};
  for (const int64_t num_seqs : {3, 5}) {
    for (const int64_t n : {1, 4, 16}) {
      const int64_t blocks = num_seqs * capacity;
      const PagedKv kv = random_paged_kv(blocks, blocks * 16, kv_heads, hd, /*shuffle=*/true);
      const Tensor tables = kv.table.view({num_seqs, capacity});  // [S, capacity]
      std::vector<int32_t> lens(num_seqs);
      for (int64_t s = 0; s < num_seqs; ++s)
        lens[s] = std::max(lengths[s], static_cast<int32_t>(n));
      const Tensor kv_lens = gpu_ints(lens);  // [S]
      Tensor q = gpu_act({num_seqs * n, heads, hd}, rnd(num_seqs * n * heads * hd));
      Tensor out = make(*gpu_, {num_seqs * n, heads, hd}, DType::kBF16);
      gpu_->paged_attention_batch(out, q, kv.k_pool, kv.v_pool, tables, kv_lens, capacity * 16, {},
                                  0.088f);
      const auto batched = gpu_->to_host_f32(out);
      for (int64_t s = 0; s < num_seqs; ++s) {
        Tensor single = make(*gpu_, {n, heads, hd}, DType::kBF16);
        gpu_->paged_attention(single, q.rows(s * n, n), kv.k_pool, kv.v_pool,
                              tables.rows(s, 1).view({capacity}), lens[s], {}, 0.088f);
        const auto want = gpu_->to_host_f32(single);
        const auto begin = batched.begin() + s * n * heads * hd;
        EXPECT_TRUE(std::equal(want.begin(), want.end(), begin))
            << "S " << num_seqs << " n " << n << " sequence " << s << " kv_len " << lens[s];
      }
    }
  }
}

// The split-KV combine pass with device lengths below the launch bound and split counts that are
// not multiples of 4 (its 4-wide loop's tail), including launches of 1, 2 and 3 splits (a combine
// allocation smaller than one 4-wide group): every sequence against the CPU reference. Run under
// compute-sanitizer memcheck (tools/device/run_compute_sanitizer.sh) it also checks the combine's
// shared arrays: before they were padded to groups of 4, a launch of one split read 12 bytes of an
// 8-byte allocation (PagedAttentionAllShapes, first case).
TEST_F(CudaOps, PagedAttentionBatchShortDeviceLengthsMatchCpu) {
  struct Case {
    int64_t launch_bound;          // a.kv_len (keys)
    std::vector<int32_t> lengths;  // kv_len_dev, each <= launch_bound
  };
  const std::vector<Case> cases = {
      {64, {1, 37, 64}},                      // 1 split
      {100, {1, 64, 65, 99}},                 // 2 splits
      {190, {3, 70, 129, 190}},               // 3 splits
      {336, {1, 5, 65, 130, 200, 257, 333}},  // 6 splits, rows of 1 to 6
      {650, {64, 300, 449, 641}},             // 11 splits
  };
  const int64_t heads = 8, kv_heads = 2, bs = 16;
  for (const int64_t hd : {int64_t{64}, int64_t{128}}) {
    for (const auto& c : cases) {
      for (const int64_t n : {int64_t{1}, int64_t{3}}) {
        const auto num_seqs = static_cast<int64_t>(c.lengths.size());
        const int64_t capacity = (c.launch_bound + bs - 1) / bs, blocks = num_seqs * capacity;
        std::vector<int32_t> table(blocks), slots(blocks * bs), lens(c.lengths);
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng_);
        for (int64_t p = 0; p < blocks * bs; ++p) slots[p] = table[p / bs] * bs + p % bs;
        for (auto& l : lens) l = std::max(l, static_cast<int32_t>(n));
        const int64_t row = kv_heads * hd;
        const auto kv = rnd(blocks * bs * row), vv = rnd(blocks * bs * row);
        const auto qv = rnd(num_seqs * n * heads * hd);
        const Shape pool{blocks, bs, kv_heads, hd};
        Tensor gkp = make(*gpu_, pool, DType::kBF16), gvp = make(*gpu_, pool, DType::kBF16);
        Tensor ckp = make(*cpu_, pool, DType::kF32), cvp = make(*cpu_, pool, DType::kF32);
        const Shape keys{blocks * bs, kv_heads, hd};
        gpu_->kv_write(gkp, gvp, gpu_act(keys, kv), gpu_act(keys, vv), gpu_ints(slots));
        cpu_->kv_write(ckp, cvp, cpu_act(keys, kv), cpu_act(keys, vv), cpu_ints(slots));
        const Shape qs{num_seqs * n, heads, hd};
        Tensor gq = gpu_act(qs, qv), cq = cpu_act(qs, qv);
        Tensor go = make(*gpu_, qs, DType::kBF16), co = make(*cpu_, qs, DType::kF32);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const AttentionMask mask{.causal = true, .window = 0};
        gpu_->paged_attention_batch(go, gq, gkp, gvp, gpu_ints(table).view({num_seqs, capacity}),
                                    gpu_ints(lens), c.launch_bound, mask, scale);
        cpu_->paged_attention_batch(co, cq, ckp, cvp, cpu_ints(table).view({num_seqs, capacity}),
                                    cpu_ints(lens), c.launch_bound, mask, scale);
        const auto got = gpu_->to_host_f32(go), want = cpu_->to_host_f32(co);
        const int64_t per_seq = n * heads * hd;
        for (int64_t s = 0; s < num_seqs; ++s) {
          const std::vector<float> g(got.begin() + s * per_seq, got.begin() + (s + 1) * per_seq);
          const std::vector<float> w(want.begin() + s * per_seq, want.begin() + (s + 1) * per_seq);
          EXPECT_LT(rel_err(g, w), kBf16Tol)
              << "hd " << hd << " launch bound " << c.launch_bound << " n " << n << " sequence "
              << s << " kv_len " << lens[s];
        }
      }
    }
  }
}

TEST_F(CudaOps, AttentionPrologueMatchesCpu) {
  // Head dims 64 / 128 / 256 take the warp-per-vector kernel, others the thread-per-pair one.
  for (const auto& [hd, with_norm] : std::vector<std::pair<int64_t, bool>>{
           {128, true}, {128, false}, {64, true}, {256, true}, {96, true}}) {
    const int64_t n = 5, heads = 8, kvh = 2, bs = 16, blocks = 3;
    const int64_t width = (heads + 2 * kvh) * hd;
    const auto xv = rnd(n * width), qnv = rnd(hd), knv = rnd(hd);
    std::vector<float> freq(hd / 2);
    for (int64_t i = 0; i < hd / 2; ++i) freq[i] = std::pow(1e6f, -2.0f * i / hd);
    const std::vector<int32_t> pos{0, 1, 500, 4000, 32000}, slots{0, 17, 33, 47, 5};
    Tensor gq = make(*gpu_, {n, heads, hd}, DType::kBF16),
           cq = make(*cpu_, {n, heads, hd}, DType::kF32);
    Tensor gkp = make(*gpu_, {blocks, bs, kvh, hd}, DType::kBF16),
           gvp = make(*gpu_, {blocks, bs, kvh, hd}, DType::kBF16);
    Tensor ckp = make(*cpu_, {blocks, bs, kvh, hd}, DType::kF32),
           cvp = make(*cpu_, {blocks, bs, kvh, hd}, DType::kF32);
    const Tensor gqn = with_norm ? weight(*gpu_, {hd}, qnv) : Tensor(),
                 gkn = with_norm ? weight(*gpu_, {hd}, knv) : Tensor();
    const Tensor cqn = with_norm ? weight(*cpu_, {hd}, qnv) : Tensor(),
                 ckn = with_norm ? weight(*cpu_, {hd}, knv) : Tensor();
    gpu_->attention_prologue(gq, gpu_act({n, width}, xv), gqn, gkn, 1e-6f, gpu_ints(pos),
                             weight(*gpu_, {hd / 2}, freq), 1.1f, gkp, gvp, gpu_ints(slots));
    cpu_->attention_prologue(cq, cpu_act({n, width}, xv), cqn, ckn, 1e-6f, cpu_ints(pos),
                             weight(*cpu_, {hd / 2}, freq), 1.1f, ckp, cvp, cpu_ints(slots));
    const std::string what =
        (with_norm ? "with q/k norm" : "without norm") + std::string(" hd ") + std::to_string(hd);
    expect_close(gq, cq, kBf16Tol, "q " + what);
    expect_close(gkp, ckp, kBf16Tol, "k pool " + what);
    EXPECT_EQ(gpu_->to_host_f32(gvp), cpu_->to_host_f32(cvp)) << "v pool " << what;
  }
}

// prologue_attention runs as one launch on the GPU (queries and the call's own keys / values
// computed inside the attention blocks); it must give the bits of the two separate ops, for the
// output and for both pools, for decode (n 1) and verify (n 16) rows, one or several sequences.
TEST_F(CudaOps, FusedPrologueAttentionEqualsPrologueThenAttention) {
  expect_fused_prologue_equals_unfused();
}

void CudaOps::expect_fused_prologue_equals_unfused() {
  const int64_t heads = 8, kv_heads = 2, capacity = 12, bs = 16;  // launch bound 192 keys
  for (const auto& [hd, with_norm] :
       std::vector<std::pair<int64_t, bool>>{{128, true}, {128, false}, {64, true}, {256, true}}) {
    for (const int64_t num_seqs : {1, 3}) {
      for (const int64_t n : {1, 16, 40}) {  // 40: prompt rows (prologue, then flash prefill)
        const int64_t blocks = num_seqs * capacity, rows = num_seqs * n;
        const int64_t width = (heads + 2 * kv_heads) * hd;
        const PagedKv kv = random_paged_kv(blocks, blocks * bs, kv_heads, hd, /*shuffle=*/true);
        std::vector<int32_t> table(blocks);
        gpu_->copy_to_host(table.data(), kv.table);
        std::vector<int32_t> lens(num_seqs), pos, slots;
        for (int64_t s = 0; s < num_seqs; ++s) {
          // Within the 192-key bound; sequence 1's 16 rows straddle the 64-key chunk boundary.
          lens[s] = static_cast<int32_t>(n + 20 + 37 * s);
          for (int64_t r = 0; r < n; ++r) {
            const int32_t p = static_cast<int32_t>(lens[s] - n + r);
            pos.push_back(p);
            slots.push_back(table[s * capacity + p / bs] * bs + p % bs);
          }
        }
        std::vector<float> freq(hd / 2);
        for (int64_t i = 0; i < hd / 2; ++i) freq[i] = std::pow(1e6f, -2.0f * i / hd);
        const Tensor qkv = gpu_act({rows, width}, rnd(rows * width));
        const Tensor qn = with_norm ? weight(*gpu_, {hd}, rnd(hd)) : Tensor();
        const Tensor kn = with_norm ? weight(*gpu_, {hd}, rnd(hd)) : Tensor();
        const Tensor inv_freq = weight(*gpu_, {hd / 2}, freq);
        const Tensor tables = kv.table.view({num_seqs, capacity}), kv_lens = gpu_ints(lens);
        const Tensor pos_t = gpu_ints(pos), slot_t = gpu_ints(slots);
        const Shape pool_shape{blocks, bs, kv_heads, hd};
        Tensor k2 = make(*gpu_, pool_shape, DType::kBF16),
               v2 = make(*gpu_, pool_shape, DType::kBF16);
        gpu_->copy(k2, kv.k_pool);
        gpu_->copy(v2, kv.v_pool);
        Tensor out1 = make(*gpu_, {rows, heads, hd}, DType::kBF16);
        Tensor out2 = make(*gpu_, {rows, heads, hd}, DType::kBF16);
        Tensor q1 = make(*gpu_, {rows, heads, hd}, DType::kBF16);
        Tensor q2 = make(*gpu_, {rows, heads, hd}, DType::kBF16);
        gpu_->prologue_attention(out1, q1, qkv, qn, kn, 1e-6f, pos_t, inv_freq, 1.1f, kv.k_pool,
                                 kv.v_pool, slot_t, tables, kv_lens, capacity * bs, {}, 0.088f);
        gpu_->Backend::prologue_attention(out2, q2, qkv, qn, kn, 1e-6f, pos_t, inv_freq, 1.1f, k2,
                                          v2, slot_t, tables, kv_lens, capacity * bs, {}, 0.088f);
        const std::string what = "hd " + std::to_string(hd) + (with_norm ? " norm" : "") + " S " +
                                 std::to_string(num_seqs) + " n " + std::to_string(n);
        EXPECT_EQ(gpu_->to_host_f32(out1), gpu_->to_host_f32(out2)) << "output, " << what;
        EXPECT_EQ(gpu_->to_host_f32(kv.k_pool), gpu_->to_host_f32(k2)) << "k pool, " << what;
        EXPECT_EQ(gpu_->to_host_f32(kv.v_pool), gpu_->to_host_f32(v2)) << "v pool, " << what;
      }
    }
  }
}

#ifdef BLOCKSPEC_HAS_CUDA
// ---- Split-KV kernels v2 (a block over consecutive chunks) and v3 (v1's blocks, cp.async loads,
// 16-byte shared reads) against v1, bit for bit; v4 (tensor cores, the default) against v1 within
// BF16 rounding and against itself across row counts, batches, tiles and the fused prologue ----

// Restores the default split kernel when a test ends, a failed assertion included.
struct SplitKernelGuard {
  SplitKernelGuard() = default;
  SplitKernelGuard(const SplitKernelGuard&) = delete;
  SplitKernelGuard& operator=(const SplitKernelGuard&) = delete;
  ~SplitKernelGuard() { cuda::set_attention_kernel(cuda::kDefaultAttentionKernel); }
};

// The split-kernel settings each test runs: v1 first (the reference: session 10's kernel, its
// queries per thread picked by the launch), then v2 with the chunks per block chosen by the
// launch and forced to 1, 2, 3 (runs that end mid-sequence) and 8, then v3, also
// with 2, 4 and 8 queries per thread forced (BLOCKSPEC_ATTN_QPT), and v1 with 2.
struct SplitSetting {
  cuda::AttentionKernel kernel;
  int chunks;
  int qpt = 0;  // queries per thread; 0: picked by the launch
};
const std::vector<SplitSetting> kSplitSettings = {
    {cuda::AttentionKernel::kV1, 0},    {cuda::AttentionKernel::kV2, 0},
    {cuda::AttentionKernel::kV2, 1},    {cuda::AttentionKernel::kV2, 2},
    {cuda::AttentionKernel::kV2, 3},    {cuda::AttentionKernel::kV2, 8},
    {cuda::AttentionKernel::kV3, 0},    {cuda::AttentionKernel::kV3, 0, 2},
    {cuda::AttentionKernel::kV3, 0, 4}, {cuda::AttentionKernel::kV3, 0, 8},
    {cuda::AttentionKernel::kV1, 0, 2}};
bool is_reference(const SplitSetting& s) {
  return s.kernel == cuda::AttentionKernel::kV1 && s.qpt == 0;
}
std::string setting_name(const SplitSetting& s) {
  return "kernel v" + std::to_string(static_cast<int>(s.kernel) + 1) + " chunks per block " +
         std::to_string(s.chunks) + " queries per thread " +
         (s.qpt ? std::to_string(s.qpt) : std::string("auto"));
}

// n bf16 values in [-2, 2) from a seeded LCG (fast enough for pools of many MB).
std::vector<uint16_t> lcg_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = f32_to_bf16(static_cast<float>((x >> 8) & 0xffff) / 16384.0f - 2.0f);
  }
  return v;
}

template <typename T>
std::vector<T> host_bits(Backend& be, const Tensor& t) {
  std::vector<T> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t);
  return h;
}

// Batch lengths: uneven, 1 to 1100 keys, some not multiples of 16 or 64, the first sequences far
// longer / shorter than the others; from the 16th sequence on, random.
std::vector<int32_t> split_test_lengths(int64_t num_seqs, int64_t n, std::mt19937& rng) {
  const int32_t pattern[16] = {1100, 1,  385, 64,  65, 17,  1023, 129,
                               700,  16, 257, 900, 63, 448, 1099, 2};
  std::uniform_int_distribution<int32_t> d(1, 1100);
  std::vector<int32_t> lens(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) {
    lens[s] = std::max(s < 16 ? pattern[s] : d(rng), static_cast<int32_t>(n));
  }
  return lens;
}

struct SplitShape {
  int64_t hd, heads, kv_heads;
};
// Qwen3-8B (group 4, hd 128), groups 1 / 4 / 8 at hd 64 and 128.
const std::vector<SplitShape> kSplitShapes = {{128, 32, 8}, {128, 8, 2},  {64, 8, 8},
                                              {128, 8, 8},  {128, 16, 2}, {64, 16, 2}};

Tensor CudaOps::split_queries(int64_t rows, int64_t heads, int64_t hd, uint32_t& seed) {
  Tensor q = make(*gpu_, {rows, heads, hd}, DType::kBF16);
  gpu_->copy_from_host(q, lcg_bf16(static_cast<size_t>(rows * heads * hd), seed++).data());
  return q;
}

CudaOps::SplitPools CudaOps::split_pools(int64_t kv_heads, int64_t hd, int64_t num_seqs,
                                         int64_t capacity, uint32_t& seed) {
  const int64_t blocks = num_seqs * capacity;
  const Shape pool{blocks, 16, kv_heads, hd};
  const size_t pool_elems = static_cast<size_t>(blocks * 16 * kv_heads * hd);
  SplitPools p{make(*gpu_, pool, DType::kBF16), make(*gpu_, pool, DType::kBF16), Tensor(),
               std::vector<int32_t>(blocks)};
  gpu_->copy_from_host(p.k, lcg_bf16(pool_elems, seed++).data());
  gpu_->copy_from_host(p.v, lcg_bf16(pool_elems, seed++).data());
  std::iota(p.table.begin(), p.table.end(), 0);
  std::shuffle(p.table.begin(), p.table.end(), rng_);
  p.tables = gpu_ints(p.table).view({num_seqs, capacity});
  return p;
}

TEST_F(CudaOps, SplitAttentionV2EqualsV1BitForBit) {
  const SplitKernelGuard guard;
  const int64_t bs = 16, capacity = 70;  // launch bound 1120 keys
  uint32_t seed = 1;
  for (const SplitShape& sh : kSplitShapes) {
    for (const int64_t num_seqs : {1, 3, 32, 77}) {
      const SplitPools pools = split_pools(sh.kv_heads, sh.hd, num_seqs, capacity, seed);
      const Tensor &kp = pools.k, &vp = pools.v, &tables = pools.tables;
      for (const int64_t n : {1, 16}) {
        for (const AttentionMask mask :
             {AttentionMask{}, AttentionMask{.causal = true, .window = 200}}) {
          if (mask.window > 0 && (sh.hd != 128 || num_seqs != 3)) continue;
          const auto lens = split_test_lengths(num_seqs, n, rng_);
          const Tensor kv_lens = gpu_ints(lens);
          const int64_t rows = num_seqs * n;
          const Tensor q = split_queries(rows, sh.heads, sh.hd, seed);
          std::vector<uint16_t> want;
          for (const SplitSetting& setting : kSplitSettings) {
            cuda::set_attention_kernel(setting.kernel, {.chunks_per_block = setting.chunks,
                                                        .queries_per_thread = setting.qpt});
            Tensor out = make(*gpu_, {rows, sh.heads, sh.hd}, DType::kBF16);
            gpu_->paged_attention_batch(out, q, kp, vp, tables, kv_lens, capacity * bs, mask,
                                        0.088f);
            const auto got = host_bits<uint16_t>(*gpu_, out);
            if (is_reference(setting)) {
              want = got;
              continue;
            }
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(uint16_t)), 0)
                << "hd " << sh.hd << " heads " << sh.heads << " kv heads " << sh.kv_heads << " S "
                << num_seqs << " n " << n << " window " << mask.window << " "
                << setting_name(setting);
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, FusedPrologueSplitAttentionV2EqualsV1BitForBit) {
  // The fused prologue (queries and the call's own keys / values computed in the split blocks,
  // the new keys / values written to the pools) under v1 and v2: output and both pools.
  const SplitKernelGuard guard;
  const int64_t bs = 16, capacity = 70;
  uint32_t seed = 100;
  for (const SplitShape& sh : kSplitShapes) {
    for (const int64_t num_seqs : {1, 3, 32, 77}) {
      if (num_seqs == 77 && sh.heads != 32) continue;  // (77 only at the Qwen3-8B shape)
      const Shape pool{num_seqs * capacity, bs, sh.kv_heads, sh.hd};
      const SplitPools pools = split_pools(sh.kv_heads, sh.hd, num_seqs, capacity, seed);
      const Tensor &k0 = pools.k, &v0 = pools.v, &tables = pools.tables;
      const std::vector<int32_t>& table = pools.table;
      std::vector<float> freq(sh.hd / 2);
      for (int64_t i = 0; i < sh.hd / 2; ++i) freq[i] = std::pow(1e6f, -2.0f * i / sh.hd);
      const Tensor inv_freq = weight(*gpu_, {sh.hd / 2}, freq);
      const Tensor qn = weight(*gpu_, {sh.hd}, rnd(sh.hd)), kn = weight(*gpu_, {sh.hd}, rnd(sh.hd));
      for (const int64_t n : {1, 16}) {
        if (num_seqs == 77 && n == 16) continue;  // (pool read-backs of 176 MB per setting)
        const auto lens = split_test_lengths(num_seqs, n, rng_);
        std::vector<int32_t> pos, slots;
        for (int64_t s = 0; s < num_seqs; ++s) {
          for (int64_t r = 0; r < n; ++r) {
            const int32_t p = static_cast<int32_t>(lens[s] - n + r);
            pos.push_back(p);
            slots.push_back(table[s * capacity + p / bs] * bs + p % bs);
          }
        }
        const int64_t rows = num_seqs * n, width = (sh.heads + 2 * sh.kv_heads) * sh.hd;
        Tensor qkv = make(*gpu_, {rows, width}, DType::kBF16);
        gpu_->copy_from_host(qkv, lcg_bf16(static_cast<size_t>(rows * width), seed++).data());
        const Tensor kv_lens = gpu_ints(lens), pos_t = gpu_ints(pos), slot_t = gpu_ints(slots);
        std::vector<uint16_t> want_out, want_k, want_v;
        for (const SplitSetting& setting : kSplitSettings) {
          cuda::set_attention_kernel(setting.kernel, {.chunks_per_block = setting.chunks,
                                                      .queries_per_thread = setting.qpt});
          Tensor kp = make(*gpu_, pool, DType::kBF16), vp = make(*gpu_, pool, DType::kBF16);
          gpu_->copy(kp, k0);
          gpu_->copy(vp, v0);
          Tensor out = make(*gpu_, {rows, sh.heads, sh.hd}, DType::kBF16);
          Tensor q_scratch = make(*gpu_, {rows, sh.heads, sh.hd}, DType::kBF16);
          gpu_->prologue_attention(out, q_scratch, qkv, qn, kn, 1e-6f, pos_t, inv_freq, 1.1f, kp,
                                   vp, slot_t, tables, kv_lens, capacity * bs, {}, 0.088f);
          auto got_out = host_bits<uint16_t>(*gpu_, out);
          auto got_k = host_bits<uint16_t>(*gpu_, kp), got_v = host_bits<uint16_t>(*gpu_, vp);
          if (is_reference(setting)) {
            want_out = std::move(got_out), want_k = std::move(got_k), want_v = std::move(got_v);
            continue;
          }
          const std::string what = "hd " + std::to_string(sh.hd) + " heads " +
                                   std::to_string(sh.heads) + " kv heads " +
                                   std::to_string(sh.kv_heads) + " S " + std::to_string(num_seqs) +
                                   " n " + std::to_string(n) + " " + setting_name(setting);
          EXPECT_TRUE(got_out == want_out) << "output, " << what;
          EXPECT_TRUE(got_k == want_k) << "k pool, " << what;
          EXPECT_TRUE(got_v == want_v) << "v pool, " << what;
        }
      }
    }
  }
}
// v4's row invariance, the property greedy speculative decoding rests on: each of 16 verify rows
// (its query vectors spread over the block's four m-tiles at GQA 4, over two at GQA 8) equals the
// decode call of its position alone, a 1-row call with that position's length, bit for bit;
// causal, causal with a window, and non-causal (drafter rows: every row sees every key).
TEST_F(CudaOps, SplitAttentionV4VerifyRowsEqualTheDecodeOfTheirPosition) {
  const SplitKernelGuard guard;
  cuda::set_attention_kernel(cuda::AttentionKernel::kV4);
  const int64_t bs = 16, capacity = 70, num_seqs = 3, n = 16;
  uint32_t seed = 500;
  for (const SplitShape& sh : std::vector<SplitShape>{{128, 32, 8}, {64, 16, 2}, {128, 8, 8}}) {
    const SplitPools pools = split_pools(sh.kv_heads, sh.hd, num_seqs, capacity, seed);
    const Tensor &kp = pools.k, &vp = pools.v, &tables = pools.tables;
    const std::vector<int32_t> lens{1100, 16, 385};
    const Tensor q = split_queries(num_seqs * n, sh.heads, sh.hd, seed);
    for (const AttentionMask mask : {AttentionMask{}, AttentionMask{.causal = true, .window = 200},
                                     AttentionMask{.causal = false}}) {
      Tensor out = make(*gpu_, {num_seqs * n, sh.heads, sh.hd}, DType::kBF16);
      gpu_->paged_attention_batch(out, q, kp, vp, tables, gpu_ints(lens), capacity * bs, mask,
                                  0.088f);
      const auto verify = host_bits<uint16_t>(*gpu_, out);
      const size_t row_elems = static_cast<size_t>(sh.heads * sh.hd);
      int differing = 0;
      for (int64_t s = 0; s < num_seqs; ++s) {
        for (int64_t r = 0; r < n; ++r) {
          const int32_t len = mask.causal ? lens[s] - static_cast<int32_t>(n - 1 - r) : lens[s];
          Tensor one = make(*gpu_, {1, sh.heads, sh.hd}, DType::kBF16);
          gpu_->paged_attention_batch(one, q.rows(s * n + r, 1), kp, vp, tables.rows(s, 1),
                                      gpu_ints({len}), capacity * bs, mask, 0.088f);
          const auto decode = host_bits<uint16_t>(*gpu_, one);
          if (std::memcmp(decode.data(), verify.data() + (s * n + r) * row_elems,
                          row_elems * sizeof(uint16_t)) != 0) {
            ++differing;
          }
        }
      }
      EXPECT_EQ(differing, 0) << "rows differing from their decode call, hd " << sh.hd << " heads "
                              << sh.heads << " kv heads " << sh.kv_heads << " causal "
                              << mask.causal << " window " << mask.window;
    }
  }
}

// v4's fused prologue (queries, and the call's own keys / values into the pools, computed in its
// blocks) against the prologue kernel then v4's attention, bit for bit.
TEST_F(CudaOps, FusedPrologueSplitAttentionV4EqualsPrologueThenAttention) {
  const SplitKernelGuard guard;
  cuda::set_attention_kernel(cuda::AttentionKernel::kV4);
  expect_fused_prologue_equals_unfused();
}

// v4's tile (16, 32 or 64 query vectors a block; BLOCKSPEC_ATTN_MMA_TILE) only spreads the work:
// decode and 16-row verify calls, one and three sequences, every mask, and the fused prologue
// give the same bits under each (a 16-row verify at GQA 8 spreads 128 vectors over 2-8 blocks).
TEST_F(CudaOps, SplitAttentionV4TileSizeChangesNoBit) {
  const SplitKernelGuard guard;
  const int64_t bs = 16, capacity = 70;
  uint32_t seed = 900;
  for (const SplitShape& sh : kSplitShapes) {
    for (const int64_t num_seqs : {1, 3}) {
      const SplitPools pools = split_pools(sh.kv_heads, sh.hd, num_seqs, capacity, seed);
      for (const int64_t n : {1, 16}) {
        const auto lens = split_test_lengths(num_seqs, n, rng_);
        const int64_t rows = num_seqs * n;
        const Tensor q = split_queries(rows, sh.heads, sh.hd, seed);
        for (const AttentionMask mask :
             {AttentionMask{}, AttentionMask{.causal = true, .window = 200},
              AttentionMask{.causal = false}}) {
          std::vector<uint16_t> want;
          for (const int tile : {64, 32, 16}) {
            cuda::set_attention_kernel(cuda::AttentionKernel::kV4, {.mma_tile = tile});
            Tensor out = make(*gpu_, {rows, sh.heads, sh.hd}, DType::kBF16);
            gpu_->paged_attention_batch(out, q, pools.k, pools.v, pools.tables, gpu_ints(lens),
                                        capacity * bs, mask, 0.088f);
            const auto got = host_bits<uint16_t>(*gpu_, out);
            if (tile == 64) {
              want = got;
              continue;
            }
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(uint16_t)), 0)
                << "hd " << sh.hd << " heads " << sh.heads << " kv heads " << sh.kv_heads << " S "
                << num_seqs << " n " << n << " causal " << mask.causal << " window " << mask.window
                << " tile " << tile;
          }
        }
      }
    }
  }
  for (const int tile : {16, 32}) {
    cuda::set_attention_kernel(cuda::AttentionKernel::kV4, {.mma_tile = tile});
    expect_fused_prologue_equals_unfused();
  }
}

// v4 rounds differently from v1 (MMA sums, BF16 probabilities in P . V): its outputs must stay
// within BF16 rounding of v1's, for decode and verify rows, one and many sequences, every shape
// of the bit-equality tests above.
TEST_F(CudaOps, SplitAttentionV4MatchesV1WithinBf16Rounding) {
  const SplitKernelGuard guard;
  const int64_t bs = 16, capacity = 70;
  uint32_t seed = 700;
  for (const SplitShape& sh : kSplitShapes) {
    for (const int64_t num_seqs : {1, 32}) {
      const SplitPools pools = split_pools(sh.kv_heads, sh.hd, num_seqs, capacity, seed);
      const Tensor &kp = pools.k, &vp = pools.v, &tables = pools.tables;
      for (const int64_t n : {1, 16}) {
        const auto lens = split_test_lengths(num_seqs, n, rng_);
        const int64_t rows = num_seqs * n;
        const Tensor q = split_queries(rows, sh.heads, sh.hd, seed);
        std::vector<float> got[2];
        const cuda::AttentionKernel kernels[2] = {cuda::AttentionKernel::kV1,
                                                  cuda::AttentionKernel::kV4};
        for (int k = 0; k < 2; ++k) {
          cuda::set_attention_kernel(kernels[k]);
          Tensor out = make(*gpu_, {rows, sh.heads, sh.hd}, DType::kBF16);
          gpu_->paged_attention_batch(out, q, kp, vp, tables, gpu_ints(lens), capacity * bs, {},
                                      0.088f);
          got[k] = gpu_->to_host_f32(out);
        }
        EXPECT_LT(rel_err(got[1], got[0]), 8e-3)
            << "hd " << sh.hd << " heads " << sh.heads << " kv heads " << sh.kv_heads << " S "
            << num_seqs << " n " << n;
      }
    }
  }
}
#endif  // BLOCKSPEC_HAS_CUDA

// A KV slot outside the pool (an engine bug) in kv_write, attention_prologue (both kernels) and
// the fused prologue_attention: the kernels skip that row, record the first such slot, and the
// next read-back throws a BackendFault (kInternal) naming the op, the slot and the capacity, then
// clears it. The other rows are written as with a valid slot for the bad row, whose pool row
// stays empty.
TEST_F(CudaOps, OutOfPoolSlotIsReportedAtTheNextReadBack) {
  const int64_t kvh = 2, bs = 16, blocks = 2, capacity = blocks * bs, n = 3, heads = 8;
  const std::vector<int32_t> good{3, 20, 7}, bad{3, capacity + 5, 7};
  // Reads `t` back; expects the fault of `op` at slot capacity + 5 (op empty: any op).
  const auto expect_fault = [&](const Tensor& t, const std::string& op, const std::string& what) {
    try {
      gpu_->to_host_f32(t);
      ADD_FAILURE() << "no BackendFault, " << what;
    } catch (const BackendFault& e) {
      EXPECT_EQ(e.to_status().code(), StatusCode::kInternal);
      const std::string tail = "KV slot " + std::to_string(capacity + 5) +
                               " is outside the KV pool of " + std::to_string(capacity) + " slots";
      EXPECT_NE(std::string(e.what()).find(op + (op.empty() ? "" : ": ") + tail), std::string::npos)
          << e.what() << ", " << what;
    }
    EXPECT_NO_THROW(gpu_->to_host_f32(t)) << "reported once, " << what;
  };
  // The pool written with `good`, without row 1's slot.
  const auto without_row1 = [&](const Tensor& pool, int64_t hd) {
    std::vector<float> v = gpu_->to_host_f32(pool);
    std::fill_n(v.begin() + good[1] * kvh * hd, kvh * hd, 0.0f);
    return v;
  };
  const auto pool = [&](int64_t hd) { return make(*gpu_, {blocks, bs, kvh, hd}, DType::kBF16); };

  {  // kv_write
    const int64_t hd = 64;
    const Tensor k = gpu_act({n, kvh, hd}, rnd(n * kvh * hd));
    const Tensor v = gpu_act({n, kvh, hd}, rnd(n * kvh * hd));
    Tensor kp = pool(hd), vp = pool(hd), rkp = pool(hd), rvp = pool(hd);
    gpu_->kv_write(rkp, rvp, k, v, gpu_ints(good));
    gpu_->kv_write(kp, vp, k, v, gpu_ints(bad));
    expect_fault(kp, "kv_write", "kv_write");
    EXPECT_EQ(gpu_->to_host_f32(kp), without_row1(rkp, hd));
    EXPECT_EQ(gpu_->to_host_f32(vp), without_row1(rvp, hd));
  }
  for (const int64_t hd : {128, 96}) {  // the warp-per-vector kernel, the thread-per-pair one
    const int64_t width = (heads + 2 * kvh) * hd;
    const Tensor qkv = gpu_act({n, width}, rnd(n * width));
    std::vector<float> freq(hd / 2);
    for (int64_t i = 0; i < hd / 2; ++i) freq[i] = std::pow(1e4f, -2.0f * i / hd);
    const Tensor inv_freq = weight(*gpu_, {hd / 2}, freq), pos = gpu_ints({30, 31, 32});
    Tensor q = make(*gpu_, {n, heads, hd}, DType::kBF16),
           rq = make(*gpu_, {n, heads, hd}, DType::kBF16);
    Tensor kp = pool(hd), vp = pool(hd), rkp = pool(hd), rvp = pool(hd);
    gpu_->attention_prologue(rq, qkv, Tensor(), Tensor(), 1e-6f, pos, inv_freq, 1.0f, rkp, rvp,
                             gpu_ints(good));
    gpu_->attention_prologue(q, qkv, Tensor(), Tensor(), 1e-6f, pos, inv_freq, 1.0f, kp, vp,
                             gpu_ints(bad));
    const std::string what = "attention_prologue hd " + std::to_string(hd);
    expect_fault(q, "attention_prologue", what);
    EXPECT_EQ(gpu_->to_host_f32(q), gpu_->to_host_f32(rq)) << what;  // every query row
    EXPECT_EQ(gpu_->to_host_f32(kp), without_row1(rkp, hd)) << what;
    EXPECT_EQ(gpu_->to_host_f32(vp), without_row1(rvp, hd)) << what;
  }
  {  // prologue_attention, one decode row per sequence (the fused launch unless
     // BLOCKSPEC_FUSED_PROLOGUE=0, which takes attention_prologue)
    const int64_t hd = 128, width = (heads + 2 * kvh) * hd;
    const Tensor qkv = gpu_act({n, width}, rnd(n * width));
    std::vector<float> freq(hd / 2, 0.01f);
    const Tensor inv_freq = weight(*gpu_, {hd / 2}, freq), pos = gpu_ints({3, 4, 7});
    // Sequence s has block s % 2 and kv length pos + 1 (its one row is its last position).
    const Tensor tables = gpu_ints({0, 1, 0}).view({n, 1}), lens = gpu_ints({4, 5, 8});
    Tensor out = make(*gpu_, {n, heads, hd}, DType::kBF16),
           q = make(*gpu_, {n, heads, hd}, DType::kBF16);
    Tensor kp = pool(hd), vp = pool(hd);
    gpu_->prologue_attention(out, q, qkv, Tensor(), Tensor(), 1e-6f, pos, inv_freq, 1.0f, kp, vp,
                             gpu_ints(bad), tables, lens, bs, {}, 0.088f);
    expect_fault(out, "", "prologue_attention");
    std::vector<float> k_host = gpu_->to_host_f32(kp);
    EXPECT_TRUE(std::all_of(k_host.begin() + 8 * kvh * hd, k_host.end(), [](float x) {
      return x == 0.0f;
    })) << "a row in the pool where only slots 3 and 7 were written";
  }
}

TEST_F(CudaOps, SwigluMatchesCpu) {
  const int64_t n = 3, i_dim = 1000;
  const auto v = rnd(n * 2 * i_dim, 2.0f);
  Tensor gy = make(*gpu_, {n, i_dim}, DType::kBF16), cy = make(*cpu_, {n, i_dim}, DType::kF32);
  gpu_->swiglu(gy, gpu_act({n, 2 * i_dim}, v));
  cpu_->swiglu(cy, cpu_act({n, 2 * i_dim}, v));
  expect_close(gy, cy, kBf16Tol, "swiglu");
}

// ---- Sampling ops (backend/sampling.h rules): the CPU is the reference ----
//
// Tolerances follow from the arithmetic. A weight expf((x - m) / T) differs by at most ~3 ulps
// between the backends (CUDA expf <= 2 ulps, glibc <= 1), so probabilities agree to ~5e-7
// relative (the test allows 1e-5) and masses to ~2e-7 relative. Top-k cuts are exact (integer
// counts). A top-p cut may land on a neighbouring tie group only where p * Z_k lies within that
// rounding (plus the GPU's fixed-point masses, ~1e-8) of the group's cumulative mass, so the GPU's
// cut is checked to be the rule's cut up to 1e-6 Z_k, and its probabilities against the weights
// renormalised over the cut it took. A draw can differ only where u * S lies within rounding
// (~1e-12 relative) of a CDF boundary: the uniforms are chosen with margins far above that.
// Values below 1e-30 (underflowed weights) may flush differently and are compared as zero.

// Checks one GPU row `g` of filtered_probs(x, f) as above; returns the number of failures
// (reported) and counts in *moved a top-p cut that differs from the CPU's row `c` (admissibly).
int check_filtered_row(std::span<const float> x, const sampling::FilterParams& f,
                       std::span<const float> g, std::span<const float> c, const std::string& what,
                       int* moved) {
  const int64_t v = static_cast<int64_t>(x.size());
  int bad = 0;
  const auto fail = [&](const std::string& msg) {
    if (bad++ < 3) ADD_FAILURE() << what << ": " << msg;
  };
  if (!(f.temperature > 0)) {
    if (!std::equal(g.begin(), g.end(), c.begin())) fail("greedy one-hot differs");
    return bad;
  }
  const float m = *std::max_element(x.begin(), x.end());
  std::vector<double> w(v);
  for (int64_t i = 0; i < v; ++i) w[i] = std::exp((x[i] - m) / f.temperature);
  float cut = -INFINITY;  // the top-k cut, exact
  if (f.top_k > 0 && f.top_k < v) {
    std::vector<float> sorted(x.begin(), x.end());
    std::nth_element(sorted.begin(), sorted.begin() + f.top_k - 1, sorted.end(),
                     std::greater<float>());
    cut = sorted[f.top_k - 1];
  }
  const auto mass = [&](float t, bool strict) {
    double s = 0;
    for (int64_t i = 0; i < v; ++i) {
      if (strict ? x[i] > t : x[i] >= t) s += w[i];
    }
    return s;
  };
  if (f.top_p < 1.0f && f.min_p > 0) {
    // min-p drops entries above the top-p cut, so the GPU's smallest kept logit is not its cut:
    // take the rule's (in double) and let the entries below check the GPU against it.
    std::vector<int64_t> order;
    for (int64_t i = 0; i < v; ++i) {
      if (x[i] >= cut) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    const double target = f.top_p * mass(cut, false);
    double cum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += w[order[i]];
      const bool group_ends = i + 1 == order.size() || x[order[i + 1]] != x[order[i]];
      if (group_ends && cum >= target) {
        cut = x[order[i]];
        break;
      }
    }
  } else if (f.top_p < 1.0f) {
    // The GPU's cut: its smallest kept logit (weights that underflowed to 0 change no mass).
    float t_g = INFINITY, t_c = INFINITY;
    for (int64_t i = 0; i < v; ++i) {
      if (g[i] > 0) t_g = std::min(t_g, x[i]);
      if (c[i] > 0) t_c = std::min(t_c, x[i]);
    }
    const double z_k = mass(cut, false), target = f.top_p * z_k;
    if (!(t_g >= cut && mass(t_g, false) >= target - 1e-6 * z_k &&
          mass(t_g, true) < target + 1e-6 * z_k)) {
      fail("top-p cut at logit " + std::to_string(t_g) +
           " is not the rule's (CPU: " + std::to_string(t_c) + ")");
      return bad;
    }
    if (t_g != t_c) ++*moved;
    cut = t_g;
  }
  // min-p after the cuts: keep w_i >= min_p. The GPU's float expf may put a weight within a few
  // ulps of min_p on the other side: such a border entry counts as the GPU kept it.
  const auto min_p_kept = [&](int64_t i) {
    if (!(f.min_p > 0)) return true;
    if (std::abs(w[i] - f.min_p) <= 1e-5 * f.min_p) return g[i] > 0;
    return w[i] >= f.min_p;
  };
  double z = 0;
  for (int64_t i = 0; i < v; ++i) z += x[i] >= cut && min_p_kept(i) ? w[i] : 0.0;
  for (int64_t i = 0; i < v; ++i) {
    const bool kept = x[i] >= cut && min_p_kept(i);
    const double want = kept ? w[i] / z : 0.0;
    const bool ok = !kept ? g[i] == 0.0f
                          : (g[i] < 1e-30f && want < 1e-30) || std::abs(g[i] - want) <= 1e-5 * want;
    if (!ok) {
      fail("[" + std::to_string(i) + "] gpu " + std::to_string(g[i]) + " want " +
           std::to_string(want) + " logit " + std::to_string(x[i]));
    }
  }
  return bad;
}

// apply_logit_rules: three requests over one set of rows (a 5-row verify block whose drafts
// repeat tokens, a 1-row one, a 3-row one with a stop token forbidden in its first row), rules
// drawn at random, on F32 and BF16 logits: the GPU's rows equal the CPU's (BF16: the CPU's on the
// same BF16 values, rounded to BF16 after the rule), including the -inf of a forbidden token.
TEST_F(CudaOps, LogitRulesMatchCpu) {
  const int64_t v = 4099, rows = 10;
  const std::vector<int32_t> row_tokens = {11, 5, 5, 4098, 5, 8, 0, 7, 7, 3};
  std::vector<std::vector<sampling::TokenRule>> rules(3);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(v - 1));
  for (auto& list : rules) {
    std::vector<int32_t> ids = {5, 7, 3};
    for (int i = 0; i < 40; ++i) ids.push_back(tok(rng_));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t t : ids) {
      list.push_back({.token = t,
                      .count = static_cast<int32_t>(rng_() % 3),
                      .bias = static_cast<float>(static_cast<int>(rng_() % 7) - 3) * 0.5f,
                      .in_prompt = static_cast<uint8_t>(rng_() % 2),
                      .stop = static_cast<uint8_t>(t == 3 || t == 7)});
    }
  }
  const std::vector<sampling::LogitRules> reqs = {
      {.first_row = 0,
       .rows = 5,
       .repetition = 1.3f,
       .frequency = 0.4f,
       .presence = 0.2f,
       .stop_rows = 0,
       .tokens = rules[0]},
      {.first_row = 5,
       .rows = 1,
       .repetition = 1.0f,
       .frequency = 0.0f,
       .presence = 0.7f,
       .stop_rows = 1,
       .tokens = rules[1]},
      {.first_row = 6,
       .rows = 3,
       .repetition = 0.8f,
       .frequency = -0.5f,
       .presence = 0.0f,
       .stop_rows = 1,
       .tokens = rules[2]}};  // row 9 belongs to no request
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> x = rnd(rows * v, 3.0f);  // BF16-representable values
    const Tensor g = gpu_act({rows, v}, x, dt), c = cpu_act({rows, v}, x);
    gpu_->apply_logit_rules(g, gpu_ints(row_tokens), reqs);
    cpu_->apply_logit_rules(c, cpu_ints(row_tokens), reqs);
    const std::vector<float> got = gpu_->to_host_f32(g);
    std::vector<float> want = cpu_->to_host_f32(c);
    if (dt == DType::kBF16) {
      for (float& e : want) e = bf16_to_f32(f32_to_bf16(e));
    }
    int differ = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!(got[i] == want[i]) && differ++ < 5) {
        ADD_FAILURE() << dtype_name(dt) << " row " << i / v << " token " << i % v << ": gpu "
                      << got[i] << ", cpu " << want[i] << " (logit " << x[i] << ")";
      }
    }
    EXPECT_EQ(differ, 0) << dtype_name(dt);
    EXPECT_EQ(got[static_cast<size_t>(5 * v + 3)], -INFINITY);  // request 1's stop token
  }
}

TEST_F(CudaOps, FilteredProbsMatchCpu) {
  const std::vector<sampling::FilterParams> kinds = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 50},
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 0.6f, .top_k = 1000, .top_p = 0.95f},
      {.temperature = 1e-3f, .top_p = 0.5f},
      {.temperature = 50.0f, .top_p = 0.99f},
      {.temperature = 0.0f},
      {.temperature = 1.0f, .top_k = 1},
      {.temperature = 1.3f, .top_k = -1},  // -1: V - 1
      {.temperature = 0.8f, .top_p = 0.01f},
      {.temperature = 2.0f, .top_k = 20, .top_p = 0.999f},
      {.temperature = 1.0f, .min_p = 0.05f},
      {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .min_p = 0.1f},
      {.temperature = 1.0f, .top_k = 3},                  // on the all-equal row below
      {.temperature = 0.9f, .top_p = 0.8f},               // on the row with -inf entries
      {.temperature = 1.1f, .top_k = 7, .top_p = 0.7f}};  // on the few-values row
  const int64_t rows = static_cast<int64_t>(kinds.size());
  int moved = 0;
  for (const int64_t v : {1000, 4099, 151936}) {
    for (const DType dt : {DType::kBF16, DType::kF32}) {
      // BF16 rows are bf16-rounded normals (many ties); F32 rows keep full precision.
      std::vector<float> x = rnd(rows * v, 3.0f);
      if (dt == DType::kF32) {
        std::normal_distribution<float> d(0.0f, 3.0f);
        for (float& e : x) e = d(rng_);
      }
      std::fill(x.begin() + (rows - 3) * v, x.begin() + (rows - 2) * v, 0.5f);
      for (int64_t i = (rows - 2) * v; i < (rows - 1) * v; i += 2) x[i] = -INFINITY;
      for (int64_t i = (rows - 1) * v; i < rows * v; ++i) x[i] = static_cast<float>(i % 5);
      std::vector<sampling::FilterParams> params = kinds;
      for (auto& f : params) {
        if (f.top_k < 0) f.top_k = static_cast<int32_t>(v - 1);
      }
      Tensor gp = make(*gpu_, {rows, v}, DType::kF32), cp = make(*cpu_, {rows, v}, DType::kF32);
      gpu_->filtered_probs(gp, gpu_act({rows, v}, x, dt), params);
      cpu_->filtered_probs(cp, cpu_act({rows, v}, x), params);
      const auto g = gpu_->to_host_f32(gp), c = cpu_->to_host_f32(cp);
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = [&](const std::vector<float>& a) {
          return std::span<const float>(a.data() + r * v, static_cast<size_t>(v));
        };
        const std::string what = "v=" + std::to_string(v) + " " + std::string(dtype_name(dt)) +
                                 " row " + std::to_string(r);
        EXPECT_EQ(check_filtered_row(row(x), params[r], row(g), row(c), what, &moved), 0) << what;
      }
    }
  }
  std::printf("[ filtered_probs: %d top-p cuts on a neighbouring tie group (admissible) ]\n",
              moved);
}

TEST_F(CudaOps, SampleFromProbsMatchesCpuAwayFromCdfBoundaries) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const int64_t v : {1000, 4097, 151936}) {
    const int64_t rows = 6;
    std::vector<float> w(rows * v, 0.0f);
    // Row 0: a filtered distribution; 1: unnormalised weights with zeros; 2: one weight at the
    // end; 3: all zero; 4: one-hot (top-k 1); 5: two weights at the ends.
    const auto x = rnd(2 * v, 3.0f);
    const sampling::FilterParams f0{.temperature = 1.0f, .top_p = 0.9f}, f4{.top_k = 1};
    sampling::filtered_probs(std::span<const float>(x).first(v), f0,
                             std::span<float>(w).subspan(0, v));
    for (int64_t i = v; i < 2 * v; ++i) w[i] = unit(rng_) < 0.3f ? 0.0f : 4.0f * unit(rng_);
    w[3 * v - 1] = 0.7f;
    sampling::filtered_probs(std::span<const float>(x).subspan(v, v), f4,
                             std::span<float>(w).subspan(4 * v, v));
    w[5 * v] = 1.0f;
    w[6 * v - 1] = 3.0f;
    const Tensor gw = gpu_act({rows, v}, w, DType::kF32), cw = cpu_act({rows, v}, w);
    for (int round = 0; round < 20; ++round) {
      std::vector<float> u(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const std::span<const float> row(w.data() + r * v, static_cast<size_t>(v));
        double total = 0;
        for (float e : row) total += e;
        if (round == 0 || total == 0) {
          u[r] = 0.0f;  // the first positive weight
          continue;
        }
        if (round == 1) {
          u[r] = 1.0f - 0x1p-24f;  // the last positive weight (never tiny in these rows)
          continue;
        }
        // The middle of the interval of an index holding >= 1e-5 of the mass.
        int64_t j = static_cast<int64_t>(unit(rng_) * static_cast<float>(v)) % v;
        while (row[j] < 1e-5 * total) j = (j + 1) % v;
        double before = 0;
        for (int64_t i = 0; i < j; ++i) before += row[i];
        u[r] = static_cast<float>((before + 0.5 * row[j]) / total);
      }
      Tensor go = gpu_->empty({rows}, DType::kI32), co = cpu_->empty({rows}, DType::kI32);
      gpu_->sample_from_probs(go, gw, gpu_act({rows}, u, DType::kF32));
      cpu_->sample_from_probs(co, cw, cpu_act({rows}, u));
      std::vector<int32_t> a(rows), b(rows);
      gpu_->copy_to_host(a.data(), go);
      cpu_->copy_to_host(b.data(), co);
      EXPECT_EQ(a, b) << "v=" << v << " round " << round;
    }
  }
}

TEST_F(CudaOps, RejectionSampleMatchesCpu) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const sampling::FilterParams fp{.temperature = 0.9f, .top_p = 0.95f};
  for (const int64_t v : {1000, 151936}) {
    for (const int64_t k : {0, 1, 4, 15}) {
      const int trials = v > 10000 ? 4 : 40;
      for (int trial = 0; trial < trials; ++trial) {
        // Target rows p; draft rows q from noisy copies of the target's logits (trial 1: q = p,
        // every draft accepted; trial 2: q = 2p, a rejection falls back to p).
        const auto x = rnd((k + 1) * v, 3.0f);
        std::vector<float> p((k + 1) * v), q(k * v), noisy(v);
        std::vector<int32_t> drafts(k);
        for (int64_t i = 0; i <= k; ++i) {
          const std::span<const float> xi(x.data() + i * v, static_cast<size_t>(v));
          sampling::filtered_probs(xi, fp, std::span<float>(p).subspan(i * v, v));
          if (i == k) break;
          for (int64_t j = 0; j < v; ++j) noisy[j] = xi[j] + (trial == 1 ? 0.0f : noise(rng_));
          const std::span<float> qi = std::span<float>(q).subspan(i * v, v);
          sampling::filtered_probs(noisy, fp, qi);
          if (trial == 2) {
            for (float& e : qi) e *= 2.0f;
          }
          drafts[i] = sampling::draw_index(qi, unit(rng_));
        }
        std::vector<float> u(k + 1);
        for (float& e : u) e = unit(rng_);
        // The committed draw's uniform away from the CDF boundaries of the row it draws from.
        const AcceptResult host = accept_sampled(drafts, q, p, v, u);
        {
          const int64_t a = host.accepted;
          std::vector<float> row(p.begin() + a * v, p.begin() + (a + 1) * v);
          if (a < k) {
            std::vector<float> res(v);
            bool any = false;
            for (int64_t j = 0; j < v; ++j) {
              const float d = p[a * v + j] - q[a * v + j];
              res[j] = d > 0 ? d : 0.0f;
              any |= d > 0;
            }
            if (any) row = res;
          }
          double total = 0, before = 0;
          for (float e : row) total += e;
          for (int64_t j = 0; j < host.next; ++j) before += row[j];
          const double lo = before / total, hi = (before + row[host.next]) / total;
          if (u[k] - lo < 1e-9 || hi - u[k] < 1e-9) u[k] = static_cast<float>(0.5 * (lo + hi));
        }
        Tensor go = gpu_->empty({k + 2}, DType::kI32), co = cpu_->empty({k + 2}, DType::kI32);
        gpu_->rejection_sample(
            go, k ? gpu_ints(drafts) : Tensor(), k ? gpu_act({k, v}, q, DType::kF32) : Tensor(),
            gpu_act({k + 1, v}, p, DType::kF32), gpu_act({k + 1}, u, DType::kF32));
        cpu_->rejection_sample(co, k ? cpu_ints(drafts) : Tensor(),
                               k ? cpu_act({k, v}, q) : Tensor(), cpu_act({k + 1, v}, p),
                               cpu_act({k + 1}, u));
        std::vector<int32_t> a(k + 2), b(k + 2);
        gpu_->copy_to_host(a.data(), go);
        cpu_->copy_to_host(b.data(), co);
        EXPECT_EQ(a, b) << "v=" << v << " k=" << k << " trial " << trial;
        if (trial == 1 && k > 0) {
          EXPECT_EQ(b[0], k) << "q = p accepts every draft";
        }
      }
    }
  }
}

TEST_F(CudaOps, DeviceDrawsFollowTheFilteredDistribution) {
  // DeviceSampling (the engine's device path) on the GPU: 100,000 draws from one row of BF16
  // logits against the CPU's filtered distribution of the same values (chi-square).
  const int64_t v = 1000, rows = 1000, calls = 100;
  const auto x = rnd(v, 2.0f);
  std::vector<float> repeated;
  for (int64_t r = 0; r < rows; ++r) repeated.insert(repeated.end(), x.begin(), x.end());
  const SamplingParams params{.temperature = 0.8f, .top_k = 100, .top_p = 0.9f, .seed = 5};
  Sampler sampler(params);
  std::vector<float> exact;
  sampler.probs(x, &exact);
  const Tensor logits = gpu_act({rows, v}, repeated);
  DeviceSampling dev(*gpu_);
  const auto counts = test_util::count_device_draws(dev, sampler, logits, calls);
  // The GPU kept what the CPU kept (else the comparison below would test the cut, not the draw).
  const std::vector<float> gpu_probs = gpu_->to_host_f32(dev.probs().rows(0, 1));
  for (int64_t i = 0; i < v; ++i) ASSERT_EQ(gpu_probs[i] > 0, exact[i] > 0) << "[" << i << "]";
  std::string detail;
  EXPECT_GT(test_util::goodness_of_fit(counts, test_util::support(exact), rows * calls, &detail),
            test_util::kAlpha)
      << detail;
}

TEST_F(CudaOps, SamplingOpTimes) {
  // Informational: medians of the sampling ops at Qwen3's vocabulary (BF16 logits).
#ifdef BLOCKSPEC_HAS_CUDA
  const int64_t v = 151936;
  for (const int64_t rows : {1, 16, 32}) {
    const Tensor logits = gpu_act({rows, v}, rnd(rows * v, 3.0f));
    const Tensor probs = make(*gpu_, {rows, v}, DType::kF32);
    const Tensor u = gpu_act({rows}, std::vector<float>(rows, 0.5f), DType::kF32);
    const Tensor ids = gpu_->empty({rows + 2}, DType::kI32);
    const auto time_us = [&](const std::function<void()>& op) {
      cuda::EventTimer timer(*gpu_);
      std::vector<double> t;
      for (int i = 0; i < 25; ++i) {
        timer.start();
        op();
        t.push_back(timer.stop_ms() * 1e3);
      }
      std::nth_element(t.begin(), t.begin() + 12, t.end());
      return t[12];
    };
    const sampling::FilterParams plain{.temperature = 0.8f},
        top_p{.temperature = 0.8f, .top_p = 0.9f},
        both{.temperature = 0.8f, .top_k = 50, .top_p = 0.9f};
    const double t_plain = time_us([&] { gpu_->filtered_probs(probs, logits, {&plain, 1}); });
    const double t_top_p = time_us([&] { gpu_->filtered_probs(probs, logits, {&top_p, 1}); });
    const double t_both = time_us([&] { gpu_->filtered_probs(probs, logits, {&both, 1}); });
    const double t_draw = time_us([&] { gpu_->sample_from_probs(ids.rows(0, rows), probs, u); });
    std::printf(
        "[ %lld x %lld: filtered_probs T only %.1f us, top-p %.1f us, top-k + top-p %.1f us; "
        "draw %.1f us ]\n",
        static_cast<long long>(rows), static_cast<long long>(v), t_plain, t_top_p, t_both, t_draw);
    if (rows == 16) {
      const int64_t k = rows - 1;
      const Tensor drafts = gpu_ints(std::vector<int32_t>(k, 7));
      const Tensor uk = gpu_act({k + 1}, std::vector<float>(k + 1, 0.5f), DType::kF32);
      const double t_rej =
          time_us([&] { gpu_->rejection_sample(ids, drafts, probs.rows(0, k), probs, uk); });
      std::printf("[ rejection_sample k=%lld: %.1f us ]\n", static_cast<long long>(k), t_rej);
    }
  }
#endif
}

TEST_F(CudaOps, CapturedSequencesReplayWithNewContents) {
  // run_captured: first call eager, second captures, later ones replay; each must compute on
  // the current contents of its tensors.
  const int64_t n = 4, d = 256;
  Tensor a = make(*gpu_, {n, d}, DType::kBF16), b = make(*gpu_, {n, d}, DType::kBF16);
  Tensor y = make(*gpu_, {n, d}, DType::kBF16), w = make(*gpu_, {d}, DType::kF32);
  for (int round = 0; round < 4; ++round) {
    const auto av = rnd(n * d), bv = rnd(n * d), wv = rnd(d);
    Tensor ga = gpu_act({n, d}, av), gb = gpu_act({n, d}, bv);
    gpu_->copy(a, ga);
    gpu_->copy(b, gb);
    gpu_->copy_from_host(w, wv.data());
    gpu_->run_captured("test:add-norm", [&] {
      gpu_->add(y, a, b);
      gpu_->rms_norm(y, y, w, 1e-6f);
    });
    Tensor cy = make(*cpu_, {n, d}, DType::kF32);
    cpu_->add(cy, cpu_act({n, d}, av), cpu_act({n, d}, bv));
    cpu_->rms_norm(cy, cy, weight(*cpu_, {d}, wv), 1e-6f);
    expect_close(y, cy, kBf16Tol, "round " + std::to_string(round));
  }
}

// DSpark / DFlash2 ops: topk (ties to the lower index, every rank), scale_softcap, and the
// grouped dynamic convolution over blocks of rows (both kernels, accumulate).
TEST_F(CudaOps, RelativeOpsMatchCpu) {
  const int64_t n = 3, v = 5000;
  std::vector<float> xv = rnd(n * v);
  for (int64_t i = 0; i < n * v; i += 97) xv[i] = 2.5f;  // ties among the largest entries
  Tensor gx = gpu_act({n, v}, xv), cx = cpu_act({n, v}, xv);
  for (const int64_t k : {1, 16, 100}) expect_topk_equal(gx, cx, n, k);
  for (const float cap : {0.0f, 3.0f}) {
    Tensor gy = make(*gpu_, {n, v}, DType::kF32), cy = make(*cpu_, {n, v}, DType::kF32);
    gpu_->scale_softcap(gy, gx, 0.7f, cap);
    cpu_->scale_softcap(cy, cx, 0.7f, cap);
    expect_close(gy, cy, 1e-6, "scale_softcap cap=" + std::to_string(cap));
  }
  const int64_t block = 4, rows = 3 * block, h = 64, group = 16, taps = 2;
  const auto xs = rnd(rows * h), dyn = rnd(rows * 2 * taps * (h / group)), base = rnd(taps * h);
  const auto ys = rnd(rows * h);
  for (const int64_t which : {0, 1}) {
    for (const bool acc : {false, true}) {
      Tensor gxx = gpu_act({rows, h}, xs), cxx = cpu_act({rows, h}, xs);
      Tensor gd = gpu_act({rows, 2 * taps * (h / group)}, dyn);
      Tensor cd = cpu_act({rows, 2 * taps * (h / group)}, dyn);
      Tensor gb = weight(*gpu_, {taps, h}, base), cb = weight(*cpu_, {taps, h}, base);
      Tensor gy = gpu_act({rows, h}, ys, DType::kF32), cy = cpu_act({rows, h}, ys);
      gpu_->dynamic_conv(gy, gxx, gd, which, gb, group, block, acc);
      cpu_->dynamic_conv(cy, cxx, cd, which, cb, group, block, acc);
      expect_close(gy, cy, 2e-2,
                   "dynamic_conv which=" + std::to_string(which) + " acc=" + std::to_string(acc));
    }
  }
}

// The two-stage top-k of long rows (chunks of 4096, then a merge) against the CPU: a partial last
// chunk, ties across chunks (to the lower index), -inf entries and k up to its limit.
TEST_F(CudaOps, TopkLongRowsMatchCpu) {
  const int64_t n = 5, v = 70001;
  std::vector<float> xv = rnd(n * v);
  for (int64_t i = 0; i < n * v; i += 4099) xv[i] = 3.5f;  // ties in several chunks
  for (int64_t i = 7; i < n * v; i += 13) xv[i] = -INFINITY;
  for (const DType t : {DType::kBF16, DType::kF32}) {
    Tensor gx = gpu_act({n, v}, xv, t), cx = cpu_act({n, v}, xv);
    for (const int64_t k : {1, 16, 64}) expect_topk_equal(gx, cx, n, k);
  }
  // Stage 1's threshold filter (k <= 32) and its fallback: row 0 large in the entries that lanes
  // 0..14 of every warp hold (index % 32 < 15), so that no warp has 16 large thread maxima and
  // ~1,900 keys of a chunk pass the threshold (more than the filter keeps: the block passes run);
  // row 1 all equal (ties to the lower index: 16 keys pass); row 2 all -inf but a few.
  std::vector<float> yv = rnd(3 * v);
  for (int64_t c = 0; c < v; ++c) {
    if (c % 32 < 15) yv[c] += 10.0f;
    yv[v + c] = 1.5f;
    yv[2 * v + c] = c % 9001 == 7 ? yv[2 * v + c] : -INFINITY;
  }
  Tensor gy = gpu_act({3, v}, yv, DType::kF32), cy = cpu_act({3, v}, yv);
  for (const int64_t k : {1, 16, 32}) expect_topk_equal(gy, cy, 3, k);
}

// markov_row (DSpark's full-vocabulary chain row) against the CPU: the vectorised path (r % 8 ==
// 0) and the plain one, z and the argmax, twice in a row and inside a captured graph (the
// last-block counter must be back at 0 after every launch).
TEST_F(CudaOps, MarkovRowMatchesCpu) {
  for (const int64_t r : {256, 20}) {
    const int64_t v = 30011;
    const auto w1v = rnd(v * r, 0.05f), w2v = rnd(v * r, 0.05f), uv = rnd(v, 2.0f);
    Tensor gw1 = weight(*gpu_, {v, r}, w1v), cw1 = weight(*cpu_, {v, r}, w1v);
    Tensor gw2 = weight(*gpu_, {v, r}, w2v), cw2 = weight(*cpu_, {v, r}, w2v);
    Tensor gu = gpu_act({1, v}, uv), cu = cpu_act({1, v}, uv);
    Tensor gz = make(*gpu_, {1, v}, DType::kF32), cz = make(*cpu_, {1, v}, DType::kF32);
    Tensor gprev = make(*gpu_, {1}, DType::kI32), cprev = make(*cpu_, {1}, DType::kI32);
    Tensor gout = make(*gpu_, {1}, DType::kI32), cout = make(*cpu_, {1}, DType::kI32);
    for (int round = 0; round < 4; ++round) {
      const int32_t prev = static_cast<int32_t>((round * 7919 + 13) % v);
      gpu_->copy_from_host(gprev, &prev);
      cpu_->copy_from_host(cprev, &prev);
      const std::string key = "test:markov_row:" + std::to_string(r);
      gpu_->run_captured(key, [&] { gpu_->markov_row(gz, gout, gu, gprev, gw1, gw2); });
      cpu_->markov_row(cz, cout, cu, cprev, cw1, cw2);
      const auto zg = gpu_->to_host_f32(gz), zc = cpu_->to_host_f32(cz);
      EXPECT_LT(rel_err(zg, zc), 1e-5) << "r=" << r << " round " << round;
      int32_t ig = -1, ic = -1;
      gpu_->copy_to_host(&ig, gout);
      cpu_->copy_to_host(&ic, cout);
      EXPECT_EQ(ig, std::max_element(zg.begin(), zg.end()) - zg.begin()) << "r=" << r;
      EXPECT_EQ(ig, ic) << "r=" << r << " round " << round;
      // Without z: the same argmax.
      int32_t again = -1;
      gpu_->markov_row(Tensor(), gout, gu, gprev, gw1, gw2);
      gpu_->copy_to_host(&again, gout);
      EXPECT_EQ(again, ig);
    }
  }
}

#ifdef BLOCKSPEC_HAS_CUDA
// markov_chain with norm bounds (the pruned greedy chain: z only for the ids that can win)
// against the full kernel: k markov_row launches chained on the GPU must give the same ids bit for
// bit. U cases: spread (a few dozen ids per row pass the bound), near ties (U within the bias
// bound of each other), equal values (U rounded to halves: many ids share the maximum; the bias
// decides), a row pair with identical U and identical w2 rows far above the rest (an exact tie of
// z: the lower id, also checked against that independent expectation), and U all zero (every id
// passes: the worst case). BF16 and F32 U, the 16-byte path (r = 256) and the plain one (r = 20),
// eagerly and replayed in a captured graph with new anchors.
TEST_F(CudaOps, MarkovChainPrunedEqualsMarkovRows) {
  const int64_t k = 7, v = 30011;
  std::mt19937 pick(11);
  for (const int64_t r : {256, 20}) {
    auto w1v = rnd(v * r, 0.05f), w2v = rnd(v * r, 0.05f);
    // Pairs (a_j, b_j) with identical w2 rows for the exact-tie case.
    std::vector<std::pair<int32_t, int32_t>> pairs;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t a = static_cast<int32_t>(pick() % (v - 64));
      const int32_t b = a + 1 + static_cast<int32_t>(pick() % 50);
      ASSERT_LT(b, v);
      std::copy_n(w2v.begin() + a * r, r, w2v.begin() + b * r);
      pairs.emplace_back(a, b);
    }
    Tensor gw1 = weight(*gpu_, {v, r}, w1v), gw2 = weight(*gpu_, {v, r}, w2v);
    const std::vector<float> nv = markov_norm_bounds(gpu_->to_host_f32(gw2), v, r);
    Tensor gnorms = make(*gpu_, {v}, DType::kF32);
    gpu_->copy_from_host(gnorms, nv.data());
    Tensor ganchor = make(*gpu_, {1}, DType::kI32);
    Tensor gfull = make(*gpu_, {k}, DType::kI32), gpruned = make(*gpu_, {k}, DType::kI32);
    for (int c = 0; c < 5; ++c) {
      std::vector<float> uv;
      if (c == 0) uv = rnd(k * v, 2.0f);
      if (c == 1) uv = rnd(k * v, 0.05f);
      if (c == 2) {
        uv = rnd(k * v, 2.0f);
        for (float& x : uv) x = std::round(x * 2.0f) / 2.0f;
      }
      if (c == 3) {
        uv = rnd(k * v, 1.0f);
        for (int64_t j = 0; j < k; ++j) {
          uv[j * v + pairs[j].first] = uv[j * v + pairs[j].second] = 64.0f;
        }
      }
      if (c == 4) uv.assign(static_cast<size_t>(k * v), 0.0f);
      for (const DType t : {DType::kBF16, DType::kF32}) {
        Tensor gu = gpu_act({k, v}, uv, t);
        for (int round = 0; round < 3; ++round) {
          const int32_t anchor = static_cast<int32_t>((round * 7919 + c * 31 + 5) % v);
          gpu_->copy_from_host(ganchor, &anchor);
          for (int64_t j = 0; j < k; ++j) {
            gpu_->markov_row(Tensor(), gfull.rows(j, 1), gu.rows(j, 1),
                             j == 0 ? ganchor : gfull.rows(j - 1, 1), gw1, gw2);
          }
          const std::string key = fmt::format("test:markov_chain:{}:{}:{}", r, c, int(t));
          gpu_->run_captured(key,
                             [&] { gpu_->markov_chain(gpruned, ganchor, gu, gw1, gw2, gnorms); });
          std::vector<int32_t> full(k, -1), pruned(k, -2);
          gpu_->copy_to_host(full.data(), gfull);
          gpu_->copy_to_host(pruned.data(), gpruned);
          const std::string where = fmt::format("r={} case {} {} round {}", r, c,
                                                t == DType::kF32 ? "f32" : "bf16", round);
          EXPECT_EQ(pruned, full) << where;
          if (c == 3) {
            for (int64_t j = 0; j < k; ++j) EXPECT_EQ(full[j], pairs[j].first) << where;
          }
        }
      }
    }
  }
}
#endif  // BLOCKSPEC_HAS_CUDA

// candidate_walk (DFlash2's selector walk, DSpark's top-t chain) against the CPU: greedy drafts
// and rows, exact ties of the scores going to the lower id, and sampled drafts with their q rows
// under temperature / top-k / top-p; inside a captured graph with new inputs on every replay.
TEST_F(CudaOps, CandidateWalkMatchesCpu) {
  // t = 16 stages the candidates' succ rows in shared memory, t = 64 does not (too large).
  for (const int64_t t : {16, 64}) check_candidate_walk(t);
}

void CudaOps::check_candidate_walk(int64_t t) {
  const int64_t k = 15, r = 256, v = 5003;
  std::mt19937 ids_rng(7);
  const auto pv = rnd(v * r, 0.1f), sv = rnd(v * r, 0.1f);
  Tensor gp = weight(*gpu_, {v, r}, pv), cp = weight(*cpu_, {v, r}, pv);
  Tensor gs = weight(*gpu_, {v, r}, sv), cs = weight(*cpu_, {v, r}, sv);
  const sampling::FilterParams filters[] = {{.temperature = 0.0f},
                                            {.temperature = 0.8f},
                                            {.temperature = 1.0f, .top_k = 5},
                                            {.temperature = 0.7f, .top_p = 0.9f},
                                            {.temperature = 1.3f, .top_k = 3, .top_p = 0.5f}};
  int captures = 0;
  for (const bool with_rank : {true, false}) {
    for (const auto& f : filters) {
      for (int round = 0; round < 3; ++round) {
        std::vector<float> vals = rnd(k * t, 1.0f), scale = rnd(k * r, 1.0f);
        if (!with_rank) {
          for (int64_t i = 0; i < k * t; i += 3) vals[i] = 0.5f;  // exact ties of the scores
        }
        std::vector<int32_t> ids(k * t);
        for (int64_t j = 0; j < k; ++j) {
          std::vector<int32_t> all(v);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), ids_rng);
          std::copy(all.begin(), all.begin() + t, ids.begin() + j * t);
        }
        std::vector<float> us(k);
        for (auto& u : us) u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng_);
        const int32_t anchor = static_cast<int32_t>(round * 101 + 5);
        Tensor gv = gpu_act({k, t}, vals, DType::kF32), cv = cpu_act({k, t}, vals);
        Tensor gsc = gpu_act({k, r}, scale), csc = cpu_act({k, r}, scale);
        Tensor gi = gpu_ints(ids), ci = make(*cpu_, {k, t}, DType::kI32);
        cpu_->copy_from_host(ci, ids.data());
        Tensor gu = gpu_act({k}, us, DType::kF32), cu = cpu_act({k}, us);
        Tensor ga = gpu_ints({anchor}), ca = make(*cpu_, {1}, DType::kI32);
        cpu_->copy_from_host(ca, &anchor);
        Tensor gd = make(*gpu_, {k}, DType::kI32), cd = make(*cpu_, {k}, DType::kI32);
        Tensor grows = make(*gpu_, {k, v}, DType::kF32), crows = make(*cpu_, {k, v}, DType::kF32);
        Tensor gq = make(*gpu_, {k, v}, DType::kF32), cq = make(*cpu_, {k, v}, DType::kF32);
        const Tensor P = with_rank ? gp : Tensor(), S = with_rank ? gs : Tensor();
        const Tensor Z = with_rank ? gsc : Tensor();
        gpu_->candidate_walk(gd, grows, gq, ga, gv, gi.view({k, t}), P, S, Z, f, gu);
        cpu_->candidate_walk(cd, crows, cq, ca, cv, ci, with_rank ? cp : Tensor(),
                             with_rank ? cs : Tensor(), with_rank ? csc : Tensor(), f, cu);
        std::vector<int32_t> dg(k), dc(k);
        gpu_->copy_to_host(dg.data(), gd);
        cpu_->copy_to_host(dc.data(), cd);
        const std::string what =
            "T=" + std::to_string(f.temperature) + " top_k=" + std::to_string(f.top_k) +
            " top_p=" + std::to_string(f.top_p) + " rank=" + std::to_string(with_rank) + " round " +
            std::to_string(round);
        EXPECT_EQ(dg, dc) << what;
        EXPECT_LT(rel_err(gpu_->to_host_f32(grows), cpu_->to_host_f32(crows)), 1e-5) << what;
        if (f.temperature > 0.0f) {
          EXPECT_LT(rel_err(gpu_->to_host_f32(gq), cpu_->to_host_f32(cq)), 1e-5) << what;
        }
        // The same walk captured (greedy / this filter), drafts only: equal drafts.
        Tensor gd2 = make(*gpu_, {k}, DType::kI32);
        const std::string key = "test:walk:" + std::to_string(t) + ":" + std::to_string(captures++);
        for (int rep = 0; rep < 3; ++rep) {
          gpu_->run_captured(key, [&] {
            gpu_->candidate_walk(gd2, Tensor(), gq, ga, gv, gi.view({k, t}), P, S, Z, f, gu);
          });
        }
        std::vector<int32_t> d2(k);
        gpu_->copy_to_host(d2.data(), gd2);
        EXPECT_EQ(d2, dc) << what << " (captured)";
      }
    }
  }
}

#ifdef BLOCKSPEC_HAS_CUDA
// candidate_walk with its table of candidate terms (the default: walk_pairs_kernel, then a walk
// that looks its rows up) against the walk that computes each row's terms itself
// (set_walk_table(false)): the same drafts, rows and q bit for bit, greedy and sampled, with an
// invalid anchor, and with a sampled row whose mass is all -inf (its draw, id 0, is not among its
// candidates: the next row falls back to computing its own terms).
TEST_F(CudaOps, CandidateWalkTableIsBitExact) {
  const int64_t k = 15, t = 16, r = 256, v = 5003;
  std::mt19937 ids_rng(11);
  const auto pv = rnd(v * r, 0.1f), sv = rnd(v * r, 0.1f);
  Tensor gp = weight(*gpu_, {v, r}, pv), gs = weight(*gpu_, {v, r}, sv);
  const sampling::FilterParams filters[] = {{.temperature = 0.0f},
                                            {.temperature = 0.8f},
                                            {.temperature = 1.0f, .top_k = 5, .top_p = 0.9f}};
  auto bits = [](const std::vector<float>& f) {
    std::vector<uint32_t> u(f.size());
    std::memcpy(u.data(), f.data(), f.size() * sizeof(float));
    return u;
  };
  int fallbacks = 0;
  for (const auto& f : filters) {
    for (int round = 0; round < 4; ++round) {
      std::vector<float> vals = rnd(k * t, 1.0f), scale = rnd(k * r, 1.0f);
      std::vector<int32_t> ids(k * t);
      for (int64_t j = 0; j < k; ++j) {
        std::vector<int32_t> all(v - 1);
        std::iota(all.begin(), all.end(), 1);  // id 0 is never a candidate
        std::shuffle(all.begin(), all.end(), ids_rng);
        std::copy(all.begin(), all.begin() + t, ids.begin() + j * t);
      }
      if (round == 1 && f.temperature > 0.0f) {
        for (int64_t c = 0; c < t; ++c) vals[4 * t + c] = -INFINITY;  // row 4 draws id 0
        ++fallbacks;
      }
      if (round == 2) {  // row 7 repeats row 6's candidates: its predecessor is among them
        std::copy(ids.begin() + 6 * t, ids.begin() + 7 * t, ids.begin() + 7 * t);
      }
      std::vector<float> us(k);
      for (auto& u : us) u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng_);
      const int32_t anchor = round == 3 ? static_cast<int32_t>(v + 3) : round * 101 + 5;
      Tensor gv = gpu_act({k, t}, vals, DType::kF32), gsc = gpu_act({k, r}, scale);
      Tensor gi = gpu_ints(ids), gu = gpu_act({k}, us, DType::kF32), ga = gpu_ints({anchor});
      std::vector<int32_t> drafts[2];
      std::vector<float> rows[2], q[2];
      for (const bool table : {true, false}) {
        cuda::set_walk_table(*gpu_, table);
        Tensor gd = make(*gpu_, {k}, DType::kI32);
        Tensor grows = make(*gpu_, {k, v}, DType::kF32), gq = make(*gpu_, {k, v}, DType::kF32);
        gpu_->candidate_walk(gd, grows, gq, ga, gv, gi.view({k, t}), gp, gs, gsc, f, gu);
        drafts[table].resize(k);
        gpu_->copy_to_host(drafts[table].data(), gd);
        rows[table] = gpu_->to_host_f32(grows);
        if (f.temperature > 0.0f) q[table] = gpu_->to_host_f32(gq);
      }
      cuda::set_walk_table(*gpu_, true);
      const std::string what = fmt::format("T={} top_k={} round {}", f.temperature, f.top_k, round);
      EXPECT_EQ(drafts[1], drafts[0]) << what;
      EXPECT_TRUE(bits(rows[1]) == bits(rows[0])) << what << ": rows differ";
      EXPECT_TRUE(bits(q[1]) == bits(q[0])) << what << ": q differs";
      if (round == 1 && f.temperature > 0.0f) {
        EXPECT_EQ(drafts[1][4], 0) << what;
      }
    }
  }
  EXPECT_EQ(fallbacks, 2);
}

// dynamic_conv's 8-channel BF16 kernel (the default where it applies: every operand BF16, 2 taps,
// group and h multiples of 8) against the generic per-element kernel
// (set_conv_kernel(false)): the same bits for both convolutions (which 0 with the base
// rows at offset 0, which 1 with the base's second half as DFlash2 passes it), written and
// accumulated, with negative zeros and exact zeros in x; and both close to the CPU.
TEST_F(CudaOps, DynamicConvFastKernelIsBitExact) {
  const int64_t block = 16, rows = 3 * block, h = 512, group = 32, taps = 2;
  const int64_t width = 2 * taps * (h / group);
  auto xs = rnd(rows * h);
  for (int64_t i = 0; i < rows * h; i += 37) xs[i] = -0.0f;
  for (int64_t i = 5; i < rows * h; i += 41) xs[i] = 0.0f;
  const auto dyn = rnd(rows * width, 0.5f), base = rnd(2 * taps * h), ys = rnd(rows * h);
  Tensor gb = weight(*gpu_, {2 * taps, h}, base), cb = weight(*cpu_, {2 * taps, h}, base);
  ASSERT_EQ(gb.dtype(), DType::kBF16);
  Tensor gx = gpu_act({rows, h}, xs), gd = gpu_act({rows, width}, dyn);
  Tensor cx = cpu_act({rows, h}, xs), cd = cpu_act({rows, width}, dyn);
  auto raw = [&](const Tensor& t) {
    std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
    gpu_->copy_to_host(v.data(), t);
    return v;
  };
  for (const int64_t which : {0, 1}) {
    for (const bool acc : {false, true}) {
      const std::string what = fmt::format("which={} accumulate={}", which, acc);
      std::vector<uint16_t> out[2];
      for (const bool fast : {true, false}) {
        cuda::set_conv_kernel(*gpu_, fast);
        Tensor gy = gpu_act({rows, h}, ys);
        gpu_->dynamic_conv(gy, gx, gd, which, gb.rows(which * taps, taps), group, block, acc);
        out[fast] = raw(gy);
        if (fast) {
          Tensor cy = cpu_act({rows, h}, ys);
          cpu_->dynamic_conv(cy, cx, cd, which, cb.rows(which * taps, taps), group, block, acc);
          expect_close(gy, cy, 2e-2, what);
        }
      }
      cuda::set_conv_kernel(*gpu_, true);
      size_t differ = 0;
      for (size_t i = 0; i < out[0].size(); ++i) differ += out[0][i] != out[1][i];
      EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << out[0].size() << " differ";
    }
  }
}

// DFlash2's fused convolutions against the ops apart on the same GPU (set_conv_kernel(false)
// runs the projection as one cuBLASLt GEMM, the generic convolution and rms_norm):
// projected_conv's K slices summed by the convolution give dyn and y within a BF16 rounding of
// the one-GEMM path (the slices' sum order differs) and close to the CPU;
// dynamic_conv_rms_norm gives the same bits as dynamic_conv then rms_norm, for the residual and
// the norm.
TEST_F(CudaOps, DFlash2FusedConvolutionsMatchTheOpsApart) {
  const int64_t block = 16, rows = 2 * block, h = 1024, group = 16, taps = 2;
  const int64_t width = 2 * taps * (h / group);
  const auto xs = rnd(rows * h), proj = rnd(width * h, 0.03f), base = rnd(2 * taps * h);
  const auto norm = rnd(h), outs = rnd(rows * h), res = rnd(rows * h), dyns = rnd(rows * width);
  Tensor gp = weight(*gpu_, {width, h}, proj), gb = weight(*gpu_, {2 * taps, h}, base);
  Tensor cp = weight(*cpu_, {width, h}, proj), cb = weight(*cpu_, {2 * taps, h}, base);
  Tensor gw = weight(*gpu_, {h}, norm), cw = weight(*cpu_, {h}, norm);
  ASSERT_EQ(gp.dtype(), DType::kBF16);
  ASSERT_EQ(gw.dtype(), DType::kF32);
  Tensor gx = gpu_act({rows, h}, xs), cx = cpu_act({rows, h}, xs);
  auto raw = [&](const Tensor& t) {
    std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
    gpu_->copy_to_host(v.data(), t);
    return v;
  };
  auto count_differ = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  std::vector<uint16_t> y[2], dyn[2], x_res[2], x_norm[2];
  for (const bool fused : {true, false}) {
    cuda::set_conv_kernel(*gpu_, fused);
    Tensor gy = make(*gpu_, {rows, h}, DType::kBF16), gd = make(*gpu_, {rows, width}, DType::kBF16);
    gpu_->projected_conv(gy, gd, gx, gp, gb.rows(0, taps), group, block);
    y[fused] = raw(gy);
    dyn[fused] = raw(gd);
    if (fused) {
      Tensor cy = make(*cpu_, {rows, h}, DType::kF32), cd = make(*cpu_, {rows, width}, DType::kF32);
      cpu_->projected_conv(cy, cd, cx, cp, cb.rows(0, taps), group, block);
      expect_close(gd, cd, 2e-2, "projected_conv dyn vs cpu");
      expect_close(gy, cy, 2e-2, "projected_conv y vs cpu");
    }
    Tensor gr = gpu_act({rows, h}, res), gn = make(*gpu_, {rows, h}, DType::kBF16);
    gpu_->dynamic_conv_rms_norm(gn, gr, gpu_act({rows, h}, outs), gpu_act({rows, width}, dyns),
                                gb.rows(taps, taps), group, block, gw, 1e-6f);
    x_res[fused] = raw(gr);
    x_norm[fused] = raw(gn);
  }
  cuda::set_conv_kernel(*gpu_, true);
  // The sliced sum may round a dyn value to the neighbouring BF16 value, rarely.
  EXPECT_LT(count_differ(dyn[0], dyn[1]), dyn[0].size() / 20);
  {
    std::vector<float> a(y[0].size()), b(y[1].size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_f32(y[0][i]), b[i] = bf16_to_f32(y[1][i]);
    EXPECT_LT(rel_err(a, b), 1e-2);
  }
  EXPECT_EQ(count_differ(x_res[0], x_res[1]), 0u) << "residual";
  EXPECT_EQ(count_differ(x_norm[0], x_norm[1]), 0u) << "norm";
  // The fused norm is the CPU's too, within BF16 rounding.
  Tensor cr = cpu_act({rows, h}, res), cn = make(*cpu_, {rows, h}, DType::kF32);
  cpu_->dynamic_conv_rms_norm(cn, cr, cpu_act({rows, h}, outs), cpu_act({rows, width}, dyns),
                              cb.rows(taps, taps), group, block, cw, 1e-6f);
  Tensor gr = gpu_act({rows, h}, res), gn = make(*gpu_, {rows, h}, DType::kBF16);
  gpu_->dynamic_conv_rms_norm(gn, gr, gpu_act({rows, h}, outs), gpu_act({rows, width}, dyns),
                              gb.rows(taps, taps), group, block, gw, 1e-6f);
  expect_close(gn, cn, 2e-2, "dynamic_conv_rms_norm vs cpu");
}

#endif  // BLOCKSPEC_HAS_CUDA

}  // namespace
// Backend::begin_read / end_read on CUDA: each read gives the bytes its tensor held when it
// began, though later queued work overwrote them (pinned buffer per pending read, stream order);
// end_read waits for its own copy (its event), and reports a fault as copy_to_host does.
TEST_F(CudaOps, AsyncReadBackGivesTheBytesAtItsBegin) {
  Tensor ids = gpu_->empty({4}, DType::kI32);
  const std::vector<int32_t> before = {1, 2, 3, 4}, after = {9, 8, 7, 6};
  for (int round = 0; round < 3; ++round) {  // the slots are reused
    gpu_->copy_from_host(ids, before.data());
    const int64_t first = gpu_->begin_read(ids.rows(1, 3));
    // Work queued behind the read: a large product, then the source overwritten.
    Tensor x = gpu_->empty({64, 4096}), w = gpu_->empty({4096, 4096}), y = gpu_->empty({64, 4096});
    gpu_->matmul(y, x, w, nullptr, false);
    gpu_->copy_from_host(ids, after.data());
    const int64_t second = gpu_->begin_read(ids);
    std::vector<int32_t> a(3), b(4);
    gpu_->end_read(first, a.data());
    gpu_->end_read(second, b.data());
    EXPECT_EQ(a, (std::vector<int32_t>{2, 3, 4})) << "round " << round;
    EXPECT_EQ(b, after) << "round " << round;
  }
}

}  // namespace bs
