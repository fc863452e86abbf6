// Sampling kernels (Backend "Sampling" ops): the filtered distribution, the inverse-CDF draw and
// speculative rejection sampling. The rules are those of backend/sampling.h; comments here say
// only how the GPU computes them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"

namespace bs::cuda {
namespace {

// ---- Block-wide helpers (fixed reduction order, so every result is deterministic) ----

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the whole block; every thread gets the result. Every thread must call it.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, T identity, Op op) {
  __shared__ T partial[32];
  __shared__ T result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? partial[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) result = w;
  }
  __syncthreads();
  const T r = result;
  __syncthreads();  // `result` and `partial` may be reused by the next call
  return r;
}

// Exclusive prefix sum over the block in thread order; *total gets the sum of all. Every thread
// must call it.
template <typename T>
__device__ T block_exclusive_scan(T v, T* total) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  T incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T s = lane < warps ? warp_sums[lane] : T(0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T n = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += n;
    }
    if (lane < warps) warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const T before = warp > 0 ? warp_sums[warp - 1] : T(0);
  *total = warp_sums[warps - 1];
  __syncthreads();
  return before + incl - v;
}

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// ---- Logit rows ----

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
// The 16-bit element T whose bits are `bits`, as a float.
template <typename T>
__device__ __forceinline__ float bits_to_f32(uint32_t bits) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __uint_as_float(bits << 16);  // BF16
  }
}

// -0 becomes +0: the rules compare values, and the ordered keys below would tell them apart.
__device__ __forceinline__ float canon(float x) { return x == 0.0f ? 0.0f : x; }

// A float's bits mapped to an unsigned key with the same order (-inf < ... < +inf).
__device__ __forceinline__ uint32_t ordered_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Calls f(i0, x, count) for the thread's groups of up to 4 consecutive elements x[0..count) =
// row[i0 .. i0 + count), two groups' loads in flight at a time. kVec: v % 4 == 0 and the row is
// aligned for one 4-element load.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_each_group(const T* row, int64_t v, F&& f) {
  const int64_t groups = (v + 3) / 4, stride = blockDim.x;
  const auto load = [&](int64_t g, float(&x)[4]) {
    const int64_t i0 = g * 4;
    if constexpr (kVec && sizeof(T) == 4) {
      const float4 p = *reinterpret_cast<const float4*>(row + i0);
      x[0] = p.x, x[1] = p.y, x[2] = p.z, x[3] = p.w;
    } else if constexpr (kVec) {
      const uint2 p = *reinterpret_cast<const uint2*>(row + i0);
      x[0] = bits_to_f32<T>(p.x & 0xffffu), x[1] = bits_to_f32<T>(p.x >> 16);
      x[2] = bits_to_f32<T>(p.y & 0xffffu), x[3] = bits_to_f32<T>(p.y >> 16);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = i0 + e < v ? to_f32(row[i0 + e]) : 0.0f;
    }
  };
  for (int64_t g = threadIdx.x; g < groups; g += 2 * stride) {
    float a[4], b[4];
    const bool has_b = g + stride < groups;
    load(g, a);
    if (has_b) load(g + stride, b);
    f(g * 4, a, static_cast<int>(v - g * 4 < 4 ? v - g * 4 : 4));
    if (has_b) {
      const int64_t h = g + stride;
      f(h * 4, b, static_cast<int>(v - h * 4 < 4 ? v - h * 4 : 4));
    }
  }
}

// ---- Filtered distribution: one block of kFilterThreads per row ----
//
// Top-k and top-p need thresholds on the logit values: t_k, the k-th largest logit, and t_p, the
// largest value whose tie groups and above hold mass p. A full sort of 152K logits per row is
// far more work than needed; both thresholds are found by the same selection: the largest value
// v with F(>= v) >= target, F a count (top-k) or a mass (top-p), in a few histogram passes over
// the row (each a read of the row, from L2 after the first):
//   level 1: kBins linear buckets of the value range [lo, max] (spreads real logits over many
//            bins, so few threads hit one bin's shared-memory atomics at once);
//   then, inside the selected bucket only, radix levels on the ordered float keys, 11 bits at a
//            time starting at the first bit in which the bucket's smallest and largest keys differ,
//            until the selected bin holds one distinct value. Typically 1-2 radix levels; BF16
//            logits (few distinct values) often need none.
// Each bin records its count or mass and its smallest and largest key. Masses are fixed point
// (w * 2^s rounded, s = 62 - bit length of V, so sums cannot overflow): integer sums do not depend
// on the order of the atomics, so the thresholds are deterministic; the rounding (<= V * 2^-s-1
// of a mass Z >= 1, ~1e-8 at V = 152K) only matters when p * Z lies that close to a tie group's
// cumulative mass. A thread merges runs of equal bins among its consecutive elements before its
// atomics (a row of equal logits would otherwise serialise on one address).
// Passes over a row: max/min, top-k (1 + radix levels), top-p (the same), the normaliser Z, the
// write: ~5-8 reads of 300-600 KB per row, one block per row, rows in parallel.

constexpr int kFilterThreads = 1024;
constexpr int kBins = 2048;  // 11 bits
static_assert(kBins == 2 * kFilterThreads, "select_bin gives each thread two bins");
constexpr int kMaxFilterRows = 64;  // rows per launch (their parameters travel as kernel arguments)

struct FilterBatch {
  FilterArg args[kMaxFilterRows];
};

struct Histogram {
  uint64_t f[kBins];  // count or fixed-point mass
  uint32_t kmin[kBins], kmax[kBins];
  int sel_bin;
  uint64_t sel_above;
};

template <typename T, bool kVec>
struct Row {
  const T* x;
  int64_t v;
  float m, temperature, fx_scale;
  __device__ float weight(float x_canon) const { return expf((x_canon - m) / temperature); }
  __device__ uint64_t fixed(float x_canon) const {
    return __float2ull_rn(weight(x_canon) * fx_scale);
  }
};

// Picks, from the top bin down, the first bin where above + cumulative f reaches `target`:
// h.sel_bin, and h.sel_above = above + f of the bins above it. When no bin reaches it (only
// possible through rounding), the lowest non-empty bin, h.sel_above = above.
__device__ void select_bin(Histogram& h, uint64_t above, uint64_t target) {
  const int b0 = kBins - 1 - 2 * static_cast<int>(threadIdx.x), b1 = b0 - 1;
  if (threadIdx.x == 0) h.sel_bin = -1;
  const uint64_t f0 = h.f[b0], f1 = h.f[b1];
  uint64_t total = 0;
  const uint64_t base = above + block_exclusive_scan<uint64_t>(f0 + f1, &total);
  if (base < target && base + f0 >= target) {
    h.sel_bin = b0;
    h.sel_above = base;
  } else if (base + f0 < target && base + f0 + f1 >= target) {
    h.sel_bin = b1;
    h.sel_above = base + f0;
  }
  __syncthreads();
  if (threadIdx.x == 0 && h.sel_bin < 0) {
    int b = 0;
    while (b < kBins - 1 && h.kmin[b] > h.kmax[b]) ++b;
    h.sel_bin = b;
    h.sel_above = above;
  }
  __syncthreads();
}

// One histogram pass over the candidates (x >= cand) whose key lies in [lo_key, hi_key], binned
// by bin_of(x, key) (monotone: a larger value never gets a smaller bin).
template <bool kMass, typename T, bool kVec, typename BinOf>
__device__ void histogram(Histogram& h, const Row<T, kVec>& r, float cand, uint32_t lo_key,
                          uint32_t hi_key, BinOf bin_of) {
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    h.f[b] = 0;
    h.kmin[b] = UINT_MAX;
    h.kmax[b] = 0;
  }
  __syncthreads();
  for_each_group<T, kVec>(r.x, r.v, [&](int64_t, const float(&xs)[4], int count) {
    int cur = -1;
    uint64_t acc = 0;
    uint32_t cmin = 0, cmax = 0;
    const auto flush = [&] {
      if (cur < 0) return;
      atomicAdd(reinterpret_cast<unsigned long long*>(&h.f[cur]),
                static_cast<unsigned long long>(acc));
      atomicMin(&h.kmin[cur], cmin);
      atomicMax(&h.kmax[cur], cmax);
    };
    for (int e = 0; e < count; ++e) {
      const float x = canon(xs[e]);
      if (!(x >= cand)) continue;
      const uint32_t key = ordered_key(x);
      if (key < lo_key || key > hi_key) continue;
      const int bin = bin_of(x, key);
      if (bin != cur) {
        flush();
        cur = bin;
        acc = 0;
        cmin = cmax = key;
      }
      acc += kMass ? r.fixed(x) : 1;
      cmin = key < cmin ? key : cmin;
      cmax = key > cmax ? key : cmax;
    }
    flush();
  });
  __syncthreads();
}

// The largest candidate value v (candidates: x >= cand, whose smallest finite value is lo) with
// F(>= v) >= target: F counts (kMass false, target = k) or sums fixed-point weights (kMass true,
// target = ceil(top_p * total mass)).
template <bool kMass, typename T, bool kVec>
__device__ float select_threshold(Histogram& h, const Row<T, kVec>& r, float cand, float lo,
                                  uint64_t k, float top_p) {
  const float range = r.m - lo;
  const float scale = range > 0.0f ? static_cast<float>(kBins) / range : 0.0f;
  histogram<kMass>(h, r, cand, 0u, UINT_MAX, [&](float x, uint32_t) {
    const float d = (r.m - x) * scale;  // NaN (inf * 0) and inf fall into the lowest bin
    return kBins - 1 - (d < static_cast<float>(kBins) ? static_cast<int>(d) : kBins - 1);
  });
  uint64_t target = k;
  if (kMass) {
    const uint64_t total =
        block_all_reduce<uint64_t>(h.f[2 * threadIdx.x] + h.f[2 * threadIdx.x + 1], 0, SumOp());
    const double t = ceil(static_cast<double>(top_p) * static_cast<double>(total));
    target = t < 1.0 ? 1 : static_cast<uint64_t>(t);
  }
  select_bin(h, 0, target);
  uint64_t above = h.sel_above;
  uint32_t lo_key = h.kmin[h.sel_bin], hi_key = h.kmax[h.sel_bin];
  __syncthreads();
  // Each level fixes 11 more bits of the key; lo_key > hi_key (no candidate: NaN logits) ends it.
  for (int level = 0; level < 4 && lo_key < hi_key; ++level) {
    const int high = 31 - __clz(static_cast<int>(lo_key ^ hi_key));
    const int shift = high >= 10 ? high - 10 : 0;
    histogram<kMass>(h, r, cand, lo_key, hi_key, [&](float, uint32_t key) {
      return static_cast<int>((key >> shift) & (kBins - 1));
    });
    select_bin(h, above, target);
    above = h.sel_above;
    lo_key = h.kmin[h.sel_bin];
    hi_key = h.kmax[h.sel_bin];
    __syncthreads();
  }
  return key_value(lo_key);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kFilterThreads)
    filtered_probs_kernel(float* probs, const T* logits, int64_t v, FilterBatch batch, int64_t row0,
                          int fx_shift) {
  __shared__ Histogram h;
  const int64_t row = row0 + blockIdx.x;
  const FilterArg a = batch.args[blockIdx.x];
  Row<T, kVec> r{logits + row * v, v, 0.0f, a.temperature, ldexpf(1.0f, fx_shift)};
  float* out = probs + row * v;

  // Maximum (first index on ties, packed as argmax's ordered 64-bit key) and smallest finite.
  uint64_t best = 0;
  float lo = INFINITY;
  for_each_group<T, kVec>(r.x, v, [&](int64_t i0, const float(&xs)[4], int count) {
    for (int e = 0; e < count; ++e) {
      const float x = canon(xs[e]);
      const uint64_t key = (static_cast<uint64_t>(ordered_key(x)) << 32) |
                           (0xFFFFFFFFu - static_cast<uint32_t>(i0 + e));
      best = key > best ? key : best;
      if (x > -INFINITY && x < lo) lo = x;
    }
  });
  best = block_all_reduce<uint64_t>(best, 0, MaxOp());
  lo = block_all_reduce<float>(lo, INFINITY, MinOp());
  r.m = key_value(static_cast<uint32_t>(best >> 32));
  const int64_t argmax = 0xFFFFFFFFu - static_cast<uint32_t>(best & 0xFFFFFFFFu);
  if (!(a.temperature > 0.0f)) {
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) out[i] = i == argmax ? 1.0f : 0.0f;
    return;
  }
  if (!(lo <= r.m)) lo = r.m;

  float t = -INFINITY;  // keep x >= t
  if (a.top_k > 0 && a.top_k < v) {
    t = select_threshold<false>(h, r, -INFINITY, lo, static_cast<uint64_t>(a.top_k), 1.0f);
  }
  if (a.top_p < 1.0f) {
    t = select_threshold<true>(h, r, t, t > -INFINITY ? t : lo, 0, a.top_p);
  }
  const float min_p = a.min_p > 0.0f ? a.min_p : 0.0f;  // after top-k / top-p (sampling.h)
  double z = 0;
  for_each_group<T, kVec>(r.x, v, [&](int64_t, const float(&xs)[4], int count) {
    for (int e = 0; e < count; ++e) {
      const float x = canon(xs[e]);
      if (x < t) continue;
      const float w = r.weight(x);
      if (w >= min_p) z += w;
    }
  });
  z = block_all_reduce<double>(z, 0.0, SumOp());
  const float inv = static_cast<float>(1.0 / z);
  for_each_group<T, kVec>(r.x, v, [&](int64_t i0, const float(&xs)[4], int count) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = canon(xs[e]);
      const float w = x >= t ? r.weight(x) : 0.0f;  // no expf for the dropped entries
      p[e] = x >= t && w >= min_p ? w * inv : 0.0f;
    }
    if constexpr (kVec) {
      *reinterpret_cast<float4*>(out + i0) = make_float4(p[0], p[1], p[2], p[3]);
    } else {
      for (int e = 0; e < count; ++e) out[i0 + e] = p[e];
    }
  });
}

template <typename T>
cudaError_t launch_filtered_probs(float* probs, const T* logits, int64_t rows, int64_t v,
                                  const FilterArg* params, int64_t num_params, cudaStream_t s) {
  int bits = 0;
  while (bits < 63 && (int64_t{1} << bits) <= v) ++bits;
  const int fx_shift = 62 - bits;
  const bool vec = v % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % (4 * sizeof(T)) == 0 &&
                   reinterpret_cast<uintptr_t>(probs) % 16 == 0;
  for (int64_t row0 = 0; row0 < rows; row0 += kMaxFilterRows) {
    const int64_t n = rows - row0 < kMaxFilterRows ? rows - row0 : kMaxFilterRows;
    FilterBatch batch;
    for (int64_t i = 0; i < n; ++i) batch.args[i] = params[num_params == 1 ? 0 : row0 + i];
    const dim3 grid(static_cast<unsigned>(n));
    if (vec) {
      filtered_probs_kernel<T, true>
          <<<grid, kFilterThreads, 0, s>>>(probs, logits, v, batch, row0, fx_shift);
    } else {
      filtered_probs_kernel<T, false>
          <<<grid, kFilterThreads, 0, s>>>(probs, logits, v, batch, row0, fx_shift);
    }
  }
  return cudaGetLastError();
}

// ---- Inverse-CDF draws ----
//
// Two kernels: (1) every kDrawChunk-element chunk of every row sums its weights (double) in its
// own block, so the whole row is read by many SMs at once; (2) one block per row scans the chunk
// sums to the chunk holding u * S, scans that chunk (kDrawThreads threads x 16 elements) and
// takes the first element whose running sum exceeds u * S. The two kernels sum in different
// orders; where rounding leaves no element past u * S in the chosen chunk, the chunk's last
// positive element is taken (the CPU's sequential sum can differ only within the same rounding).

constexpr int kDrawChunk = 4096;
constexpr int kDrawThreads = 256;
constexpr int kDrawPerThread = kDrawChunk / kDrawThreads;

__device__ __forceinline__ float positive(float w) { return w > 0.0f ? w : 0.0f; }

// Where a draw's weights come from. Plain draws: row r of w (r = blockIdx.y), output out[r],
// uniform uniforms[r]. Rejection sampling (row_of set): the one row a = *row_of (the number of
// accepted drafts); weights max(p_a - q_a, 0), falling back to p_a when those are all zero, when
// q is set and a < k, else p_a; output out[1], uniform uniforms[k].
struct DrawSource {
  const float* w = nullptr;  // [rows, v]: probs / p
  const float* q = nullptr;  // [k, v] or null
  const int32_t* row_of = nullptr;
  const float* uniforms = nullptr;
  int64_t k = 0, v = 0;
  int chunks = 0;
  __device__ int64_t row() const { return row_of ? *row_of : blockIdx.y; }
  __device__ bool residual(int64_t r) const { return q != nullptr && r < k; }
  __device__ float weight(int64_t r, bool resid, int64_t i) const {
    return resid ? positive(w[r * v + i] - q[r * v + i]) : positive(w[r * v + i]);
  }
};

// sums[(slot * chunks + c) * 2 + j]: j = 0 the chunk's draw weights, j = 1 (residual rows) its
// sum of p, the fallback.
__global__ void __launch_bounds__(kDrawThreads)
    draw_chunk_sums_kernel(double* sums, DrawSource src) {
  const int64_t r = src.row(), c0 = static_cast<int64_t>(blockIdx.x) * kDrawChunk;
  const bool resid = src.residual(r);
  const int64_t end = c0 + kDrawChunk < src.v ? c0 + kDrawChunk : src.v;
  double s0 = 0, s1 = 0;
  for (int64_t i = c0 + threadIdx.x; i < end; i += kDrawThreads) {
    s0 += src.weight(r, resid, i);
    if (resid) s1 += positive(src.w[r * src.v + i]);
  }
  s0 = block_all_reduce<double>(s0, 0.0, SumOp());
  s1 = block_all_reduce<double>(s1, 0.0, SumOp());
  if (threadIdx.x == 0) {
    double* out = sums + (static_cast<int64_t>(blockIdx.y) * src.chunks + blockIdx.x) * 2;
    out[0] = s0;
    out[1] = s1;
  }
}

__global__ void __launch_bounds__(kDrawThreads)
    draw_find_kernel(int32_t* out, const double* sums, DrawSource src) {
  __shared__ int chunk;
  __shared__ double base, target;
  __shared__ bool use_resid, empty;
  const int64_t r = src.row();
  const double* my = sums + static_cast<int64_t>(blockIdx.y) * src.chunks * 2;
  int32_t* dst = src.row_of ? out + 1 : out + r;
  if (threadIdx.x == 0) {
    // The residual when it has mass, else p (the fallback), else the plain row's own weights.
    bool resid = src.residual(r);
    double s0 = 0, s1 = 0;
    for (int c = 0; c < src.chunks; ++c) s0 += my[2 * c], s1 += my[2 * c + 1];
    if (resid && !(s0 > 0)) resid = false, s0 = s1;
    const int j = resid || !src.residual(r) ? 0 : 1;
    const float u = src.uniforms[src.row_of ? src.k : r];
    const double total = s0;
    target = static_cast<double>(u) * total;
    empty = !(total > 0);
    use_resid = resid;
    // The first chunk whose running sum passes the target; else the last chunk with weight.
    double run = 0;
    int pick = -1, last = 0;
    for (int c = 0; c < src.chunks; ++c) {
      const double sc = my[2 * c + j];
      if (sc > 0) last = c;
      if (pick < 0 && run + sc > target) {
        pick = c;
        base = run;
      }
      run += sc;
    }
    if (pick < 0) {
      pick = last;
      base = run - my[2 * last + j];
    }
    chunk = pick;
  }
  __syncthreads();
  if (empty) {
    if (threadIdx.x == 0) *dst = 0;
    return;
  }
  const int64_t first = static_cast<int64_t>(chunk) * kDrawChunk + threadIdx.x * kDrawPerThread;
  float w[kDrawPerThread];
  double local = 0;
#pragma unroll
  for (int e = 0; e < kDrawPerThread; ++e) {
    w[e] = first + e < src.v ? src.weight(r, use_resid, first + e) : 0.0f;
    local += w[e];
  }
  double unused = 0;
  double cum = base + block_exclusive_scan<double>(local, &unused);
  int pick = INT_MAX, last_positive = -1;
#pragma unroll
  for (int e = 0; e < kDrawPerThread; ++e) {
    if (!(w[e] > 0.0f)) continue;
    cum += w[e];
    last_positive = static_cast<int>(first + e);
    if (pick == INT_MAX && cum > target) pick = static_cast<int>(first + e);
  }
  pick = block_all_reduce<int>(pick, INT_MAX, MinOp());
  last_positive = block_all_reduce<int>(last_positive, -1, MaxOp());
  if (threadIdx.x == 0) *dst = pick != INT_MAX ? pick : (last_positive >= 0 ? last_positive : 0);
}

// Accept tests of rejection sampling: out[0] = a, out[2 .. k + 1] = the drafts (draw_find_kernel
// then writes out[1], the next token). A draft outside [0, v) counts as rejected.
__global__ void accept_drafts_kernel(int32_t* out, const int32_t* drafts, const float* q,
                                     const float* p, const float* uniforms, int64_t k, int64_t v) {
  if (threadIdx.x != 0) return;
  int64_t a = 0;
  for (; a < k; ++a) {
    const int32_t d = drafts[a];
    if (d < 0 || d >= v || !(uniforms[a] * q[a * v + d] < p[a * v + d])) break;
  }
  out[0] = static_cast<int32_t>(a);
  for (int64_t i = 0; i < k; ++i) out[2 + i] = drafts[i];
}

cudaError_t launch_draw(int32_t* out, DrawSource src, int64_t slots, void* workspace,
                        cudaStream_t s) {
  if (slots > 65535) return cudaErrorInvalidValue;
  src.chunks = static_cast<int>((src.v + kDrawChunk - 1) / kDrawChunk);
  auto* sums = static_cast<double*>(workspace);
  const dim3 grid_sums(static_cast<unsigned>(src.chunks), static_cast<unsigned>(slots));
  draw_chunk_sums_kernel<<<grid_sums, kDrawThreads, 0, s>>>(sums, src);
  draw_find_kernel<<<dim3(1, static_cast<unsigned>(slots)), kDrawThreads, 0, s>>>(out, sums, src);
  return cudaGetLastError();
}

}  // namespace

// ---- Logits processing (backend/logit_rules.h) ----
//
// One block per (row of a block, request): the threads take the request's rule tokens in turn
// (c adds the row's matching extras), then the row's extras that no rule names (the first
// occurrence of each). Every token is written by one thread only.
namespace {

constexpr int kRuleThreads = 128;

__device__ __forceinline__ void store_f32(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void store_f32(__half* p, float x) { *p = __float2half(x); }

template <typename T>
__global__ void __launch_bounds__(kRuleThreads)
    logit_rules_kernel(T* logits, int64_t v, const int32_t* row_tokens, const LogitRulesArg* reqs,
                       const sampling::TokenRule* tokens) {
  const LogitRulesArg q = reqs[blockIdx.y];
  const int64_t r = blockIdx.x;
  if (r >= q.rows) return;
  T* row = logits + (q.first_row + r) * v;
  const int32_t* extra = row_tokens + q.first_row + 1;  // e_1 .. e_r (read only when r > 0)
  const sampling::TokenRule* rules = tokens + q.token_offset;
  const bool blocking = r < q.stop_rows;
  for (int64_t i = threadIdx.x; i < q.token_count; i += blockDim.x) {
    const sampling::TokenRule e = rules[i];
    if (e.token < 0 || e.token >= v) continue;
    int32_t c = e.count;
    for (int64_t j = 0; j < r; ++j) c += extra[j] == e.token ? 1 : 0;
    T* x = row + e.token;
    store_f32(x,
              sampling::rule_logit(to_f32(*x), c, e.bias, e.in_prompt != 0, blocking && e.stop != 0,
                                   q.repetition, q.frequency, q.presence));
  }
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) {
    const int32_t t = extra[j];
    if (t < 0 || t >= v) continue;
    bool named = false;
    for (int64_t i = 0; i < j && !named; ++i) named = extra[i] == t;  // not its first occurrence
    int64_t lo = 0, hi = q.token_count;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (rules[mid].token < t)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (named || (lo < q.token_count && rules[lo].token == t)) continue;
    int32_t c = 0;
    for (int64_t i = 0; i < r; ++i) c += extra[i] == t ? 1 : 0;
    T* x = row + t;
    store_f32(x, sampling::rule_logit(to_f32(*x), c, 0.0f, false, false, q.repetition, q.frequency,
                                      q.presence));
  }
}

template <typename T>
cudaError_t launch_logit_rules(T* logits, int64_t v, const int32_t* row_tokens,
                               const LogitRulesArg* reqs, int64_t num_reqs, int64_t max_rows,
                               const sampling::TokenRule* tokens, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(max_rows), static_cast<unsigned>(num_reqs));
  logit_rules_kernel<T><<<grid, kRuleThreads, 0, s>>>(logits, v, row_tokens, reqs, tokens);
  return cudaGetLastError();
}

}  // namespace

cudaError_t apply_logit_rules(Out logits, int64_t v, const int32_t* row_tokens,
                              const LogitRulesArg* reqs, int64_t num_reqs, int64_t max_rows,
                              const sampling::TokenRule* tokens, cudaStream_t s) {
  if (num_reqs <= 0 || max_rows <= 0 || v <= 0) return cudaSuccess;
  switch (logits.t) {
    case Elem::kF32:
      return launch_logit_rules(static_cast<float*>(logits.p), v, row_tokens, reqs, num_reqs,
                                max_rows, tokens, s);
    case Elem::kBF16:
      return launch_logit_rules(static_cast<__nv_bfloat16*>(logits.p), v, row_tokens, reqs,
                                num_reqs, max_rows, tokens, s);
    case Elem::kF16:
      return launch_logit_rules(static_cast<__half*>(logits.p), v, row_tokens, reqs, num_reqs,
                                max_rows, tokens, s);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t filtered_probs(float* probs, In logits, int64_t rows, int64_t v,
                           const FilterArg* params, int64_t num_params, cudaStream_t s) {
  if (rows <= 0 || v <= 0) return cudaSuccess;
  switch (logits.t) {
    case Elem::kF32:
      return launch_filtered_probs(probs, static_cast<const float*>(logits.p), rows, v, params,
                                   num_params, s);
    case Elem::kBF16:
      return launch_filtered_probs(probs, static_cast<const __nv_bfloat16*>(logits.p), rows, v,
                                   params, num_params, s);
    case Elem::kF16:
      return launch_filtered_probs(probs, static_cast<const __half*>(logits.p), rows, v, params,
                                   num_params, s);
    default:
      return cudaErrorInvalidValue;
  }
}

size_t draw_workspace_bytes(int64_t rows, int64_t v) {
  const int64_t chunks = (v + kDrawChunk - 1) / kDrawChunk;
  return static_cast<size_t>((rows > 1 ? rows : 1) * chunks * 2) * sizeof(double);
}

cudaError_t sample_from_probs(int32_t* out, const float* weights, const float* uniforms,
                              int64_t rows, int64_t v, void* workspace, cudaStream_t s) {
  if (rows <= 0 || v <= 0) return cudaSuccess;
  DrawSource src;
  src.w = weights;
  src.uniforms = uniforms;
  src.v = v;
  return launch_draw(out, src, rows, workspace, s);
}

cudaError_t rejection_sample(int32_t* out, const int32_t* drafts, const float* q, const float* p,
                             const float* uniforms, int64_t k, int64_t v, void* workspace,
                             cudaStream_t s) {
  if (v <= 0) return cudaSuccess;
  accept_drafts_kernel<<<1, 32, 0, s>>>(out, drafts, q, p, uniforms, k, v);
  DrawSource src;
  src.w = p;
  src.q = k > 0 ? q : nullptr;
  src.row_of = out;
  src.uniforms = uniforms;
  src.k = k;
  src.v = v;
  return launch_draw(out, src, 1, workspace, s);
}

}  // namespace bs::cuda
