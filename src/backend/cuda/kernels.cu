// CUDA kernels of the CUDA backend (see kernels.h). Straightforward, correct-first kernels:
// fp32 arithmetic everywhere, generic per-operand element types for the small ops, templates on
// the element type where the data volume matters (attention, GEMV).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace bs::cuda {

int elem_size(Elem t) {
  switch (t) {
    case Elem::kF32:
      return 4;
    case Elem::kF16:
      return 2;
    case Elem::kBF16:
      return 2;
    case Elem::kF8E4M3:
      return 1;
  }
  return 0;
}

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float ld(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::kF32:
      return static_cast<const float*>(p)[i];
    case Elem::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return static_cast<float>(v);
    }
  }
}
__device__ __forceinline__ float ld(In a, int64_t i) { return ld(a.p, a.t, i); }

__device__ __forceinline__ void st(Out a, int64_t i, float v) {
  switch (a.t) {
    case Elem::kBF16:
      static_cast<__nv_bfloat16*>(a.p)[i] = __float2bfloat16_rn(v);
      break;
    case Elem::kF32:
      static_cast<float*>(a.p)[i] = v;
      break;
    case Elem::kF16:
      static_cast<__half*>(a.p)[i] = __float2half_rn(v);
      break;
    default: {
      __nv_fp8_e4m3 q(v);
      static_cast<__nv_fp8_storage_t*>(a.p)[i] = q.__x;
    }
  }
}

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ void from_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_f(float* p, float v) { *p = v; }

// Sum over the block; every thread gets the total. Safe to call repeatedly.
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return warp_sum(lane < nw ? sh[lane] : 0.0f);
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return warp_max(lane < nw ? sh[lane] : -INFINITY);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

inline int grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}
inline int row_threads(int64_t d) { return d >= 2048 ? 512 : (d > 128 ? 256 : 128); }

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- Elementwise ----
enum class Op : int { kAdd, kMul, kSiluMul, kSilu, kGeluTanh, kGeluErf, kCopy };

__global__ void unary_binary_kernel(Out y, In a, In b, int64_t n, Op op) {
  GRID_STRIDE(i, n) {
    const float x = ld(a, i);
    float r;
    switch (op) {
      case Op::kAdd:
        r = x + ld(b, i);
        break;
      case Op::kMul:
        r = x * ld(b, i);
        break;
      case Op::kSiluMul:
        r = silu_f(x) * ld(b, i);
        break;
      case Op::kSilu:
        r = silu_f(x);
        break;
      case Op::kGeluTanh: {
        const float c = 0.7978845608028654f;
        r = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
        break;
      }
      case Op::kGeluErf:
        r = 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        break;
      default:
        r = x;
    }
    st(y, i, r);
  }
}

__global__ void axpby_kernel(Out y, float a, In x, float b, In z, int64_t n) {
  GRID_STRIDE(i, n) { st(y, i, a * ld(x, i) + b * ld(z, i)); }
}

__global__ void gated_add_kernel(Out y, In x, In gate, int64_t rows, int64_t d) {
  GRID_STRIDE(i, rows * d) {
    const float yv = ld(In{y.p, y.t}, i);
    st(y, i, yv + ld(gate, i % d) * ld(x, i));
  }
}

__global__ void modulate_kernel(Out y, In x, In shift, In scale, int64_t rows, int64_t d,
                                bool per_row) {
  GRID_STRIDE(i, rows * d) {
    const int64_t o = per_row ? i : i % d;
    st(y, i, ld(x, i) * (1.0f + ld(scale, o)) + ld(shift, o));
  }
}

__global__ void add_bias_kernel(Out y, In bias, int64_t rows, int64_t m) {
  GRID_STRIDE(i, rows * m) { st(y, i, ld(In{y.p, y.t}, i) + ld(bias, i % m)); }
}

__global__ void convert_kernel(Out dst, In src, int64_t n) {
  GRID_STRIDE(i, n) { st(dst, i, ld(src, i)); }
}

// ---- Row reductions ----
__global__ void rms_norm_kernel(Out y, In x, In w, int64_t d, float eps) {
  const int64_t base = blockIdx.x * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = ld(x, base + i);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    st(y, base + i, ld(x, base + i) * inv * ld(w, i));
  }
}

__global__ void layer_norm_kernel(Out y, In x, In w, In b, int64_t d, float eps) {
  const int64_t base = blockIdx.x * d;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += ld(x, base + i);
  const float mean = block_sum(s) / static_cast<float>(d);
  float v2 = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = ld(x, base + i) - mean;
    v2 += c * c;
  }
  const float inv = 1.0f / sqrtf(block_sum(v2) / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = (ld(x, base + i) - mean) * inv;
    if (w.p) v *= ld(w, i);
    if (b.p) v += ld(b, i);
    st(y, base + i, v);
  }
}

__global__ void noise_combine_kernel(Out y, In base, In x, In z, In w, int64_t d, int64_t e,
                                     float gate, float eps) {
  const int64_t r = blockIdx.x;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < e; i += blockDim.x) {
    const float zv = ld(z, r * e + i);
    ss += ld(w, i) * zv * zv;
  }
  const float sc = gate / sqrtf(block_sum(ss) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    st(y, r * d + i, ld(base, i) + sc * ld(x, r * d + i));
  }
}

__global__ void softmax_kernel(Out y, In x, int64_t v, float scale) {
  const int64_t base = blockIdx.x * v;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) mx = fmaxf(mx, ld(x, base + i) * scale);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) s += expf(ld(x, base + i) * scale - mx);
  const float inv = 1.0f / block_sum(s);
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    st(y, base + i, expf(ld(x, base + i) * scale - mx) * inv);
  }
}

__device__ __forceinline__ void better(float& best, int& bi, float v, int i) {
  if (v > best || (v == best && i < bi)) {
    best = v;
    bi = i;
  }
}

// Best (value, index) of x[base + i] over i in [lo, hi) across the block, first index on ties
// (indices are i); the result is valid in thread 0. Every thread of the block must call it.
__device__ void block_argmax(In x, int64_t base, int64_t lo, int64_t hi, float& best, int& bi) {
  best = -INFINITY;
  bi = INT_MAX;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    better(best, bi, ld(x, base + i), static_cast<int>(i));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    better(best, bi, ob, oi);
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {
    sb[w] = best;
    si[w] = bi;
  }
  __syncthreads();
  if (w == 0) {
    best = lane < nw ? sb[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      better(best, bi, ob, oi);
    }
  }
}

__global__ void argmax_kernel(int32_t* out, In x, int64_t v) {
  float best;
  int bi;
  block_argmax(x, blockIdx.x * v, 0, v, best, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
}

// Two-pass argmax for long rows: pass 1 gives each (row, chunk) block its best (value, index)
// packed into one ordered 64-bit key (larger value first, then smaller index), pass 2 takes the
// maximum key of each row. Same result as argmax_kernel, first index on ties.
__device__ __forceinline__ uint64_t argmax_key(float best, int bi) {
  const uint32_t u = __float_as_uint(best);
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(bi));
}

__global__ void argmax_chunk_kernel(uint64_t* keys, In x, int64_t v, int64_t chunk) {
  const int64_t row = blockIdx.y, c0 = blockIdx.x * chunk;
  float best;
  int bi;
  block_argmax(x, row * v, c0, c0 + chunk < v ? c0 + chunk : v, best, bi);
  if (threadIdx.x == 0) keys[row * gridDim.x + blockIdx.x] = argmax_key(best, bi);
}

__global__ void argmax_reduce_kernel(int32_t* out, const uint64_t* keys, int chunks) {
  const int64_t row = blockIdx.x;
  uint64_t k = 0;
  for (int c = threadIdx.x; c < chunks; c += 32) {
    const uint64_t o = keys[row * chunks + c];
    k = o > k ? o : k;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t ok = __shfl_xor_sync(0xffffffffu, k, o);
    k = ok > k ? ok : k;
  }
  if (threadIdx.x == 0) {
    const uint32_t bi = 0xFFFFFFFFu - static_cast<uint32_t>(k & 0xFFFFFFFFu);
    out[row] = bi == static_cast<uint32_t>(INT_MAX) ? 0 : static_cast<int32_t>(bi);
  }
}

// RMSNorm for BF16 rows with d % 8 == 0 and d / 8 threads (<= 1024): each thread loads its 8
// elements once (one 16-byte load), the row's sum of squares is one block reduction.
__global__ void rms_norm_bf16_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, const float* w,
                                     int64_t d, float eps) {
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();
  const int64_t base = blockIdx.x * d + threadIdx.x * 8;
  const uint4 raw = *reinterpret_cast<const uint4*>(x + base);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  float v[8];
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[2 * e] = __uint_as_float(words[e] << 16);
    v[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
  }
  for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  const float* wr = w + threadIdx.x * 8;
  uint32_t packed[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __nv_bfloat162 pair =
        __floats2bfloat162_rn(v[2 * e] * inv * wr[2 * e], v[2 * e + 1] * inv * wr[2 * e + 1]);
    packed[e] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  *reinterpret_cast<uint4*>(y + base) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// ---- Indexing ----
__global__ void embedding_kernel(Out y, const int32_t* ids, In table, int64_t d, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const int64_t id = ids[r];
  const bool ok = id >= 0 && id < vocab;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    st(y, r * d + i, ok ? ld(table, id * d + i) : 0.0f);
  }
}

__global__ void copy_block_kernel(Out dst, int64_t dst_cols, int64_t dst_off, In src,
                                  int64_t src_cols, int64_t src_off, int64_t rows, int64_t d) {
  GRID_STRIDE(i, rows * d) {
    const int64_t r = i / d, c = i % d;
    st(dst, r * dst_cols + dst_off + c, ld(src, r * src_cols + src_off + c));
  }
}

__global__ void fill_kernel(Out dst, int64_t n, float value) {
  GRID_STRIDE(i, n) st(dst, i, value);
}
// scatter_columns' second pass (the first fills the whole [rows, v] output; a grid of many blocks
// each: one block a row left the draft step's 15 x 151,936 fill to 15 SMs, ~49 us on an H100,
// session 23): the draft vocabulary's columns from src.
__global__ void scatter_picked_kernel(Out dst, In src, const int32_t* ids, int64_t rows, int64_t v,
                                      int64_t vs) {
  GRID_STRIDE(i, rows * vs) {
    const int64_t r = i / vs, c = ids[i % vs];
    if (c >= 0 && c < v) st(dst, r * v + c, ld(src, i));
  }
}

// ---- DSpark / DFlash2 ----
// Pass j picks the first entry, in the order (value descending, index ascending), that comes after
// the entry pass j - 1 picked: no exclusion list, any k.
__global__ void topk_kernel(float* values, int32_t* ids, In x, int64_t v, int64_t k) {
  __shared__ float s_val[32];
  __shared__ int64_t s_idx[32];
  __shared__ float prev_val;
  __shared__ int64_t prev_idx;
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  if (threadIdx.x == 0) {
    prev_val = INFINITY;
    prev_idx = -1;
  }
  __syncthreads();
  for (int64_t j = 0; j < k; ++j) {
    const float pv = prev_val;
    const int64_t pi = prev_idx;
    float best = -INFINITY;
    int64_t bi = LLONG_MAX;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const float xv = ld(x, r * v + i);
      const bool after = xv < pv || (xv == pv && i > pi);
      if (after && (xv > best || (xv == best && i < bi))) {
        best = xv;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) {
        best = ob;
        bi = oi;
      }
    }
    if (lane == 0) {
      s_val[warp] = best;
      s_idx[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float b = s_val[0];
      int64_t b_i = s_idx[0];
      for (int w = 1; w < warps; ++w) {
        if (s_val[w] > b || (s_val[w] == b && s_idx[w] < b_i)) {
          b = s_val[w];
          b_i = s_idx[w];
        }
      }
      values[r * k + j] = b;
      ids[r * k + j] = static_cast<int32_t>(b_i);
      prev_val = b;
      prev_idx = b_i;
    }
    __syncthreads();
  }
}

// Launched with programmatic dependent launch (launch_pdl): x comes from the kernel before.
__global__ void scale_softcap_kernel(Out y, In x, int64_t n, float multiplier, float cap) {
  griddep_wait();
  GRID_STRIDE(i, n) {
    const float v = multiplier * ld(x, i);
    st(y, i, cap > 0.0f ? cap * tanhf(v / cap) : v);
  }
}

__global__ void dynamic_conv_kernel(Out y, In x, In dyn, int64_t which, In base, int64_t n,
                                    int64_t h, int64_t taps, int64_t group, int64_t block_rows,
                                    bool accumulate) {
  // Launched with programmatic dependent launch (launch_pdl): DFlash2 runs 4 of these per drafter
  // layer, each right after the kernel that wrote x, dyn or y.
  griddep_wait();
  const int64_t groups = h / group;
  GRID_STRIDE(e, n * h) {
    const int64_t i = e / h, c = e % h;
    float acc = 0.0f;
    for (int64_t t = 0; t < taps && t <= i % block_rows; ++t) {
      const float kt =
          ld(base, t * h + c) + ld(dyn, ((i * 2 + which) * taps + t) * groups + c / group);
      acc += kt * ld(x, (i - t) * h + c);
    }
    if (accumulate) acc += ld(In{y.p, y.t}, e);
    st(y, e, acc);
  }
}

// dynamic_conv_kernel's common case (DFlash2 at its published shapes: 2 taps, groups of 16+
// channels, BF16 activations and weights): thread e takes channels c = 8 (e % (h / 8)) .. c + 7 of
// row i = e / (h / 8), which all share one group, so its two dynamic values are loaded once and
// x[i], x[i - 1], both base rows and y come in one 16-byte load each; 32-bit indices. The base
// rows are weights: loaded before griddep_wait. Each channel's arithmetic is dynamic_conv_kernel's
// (the same expressions in the same order: acc = 0, += kt * x per tap, += y), so the bits are the
// same (CudaOps.DynamicConvFastKernelIsBitExact).
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) f[2 * q] = bf16_lo(w[q]), f[2 * q + 1] = bf16_hi(w[q]);
}

constexpr int kConvThreads = 64;  // 128 blocks for DFlash2's 16 x 4096 rows

// The 8 channels of one thread: acc = 0, += (b0 + d0) x0, (+= (b1 + d1) x1 from the row before,
// when `second`), (+= y when accumulating), in this order in every kernel below (the same bits).
struct Conv8 {
  float x0[8], x1[8], b0[8], b1[8], y[8];
  __device__ __forceinline__ void run(float (&out)[8], float d0, float d1, bool second,
                                      bool accumulate) const {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float acc = 0.0f;
      {
        const float kt = b0[q] + d0;
        acc += kt * x0[q];
      }
      if (second) {
        const float kt = b1[q] + d1;
        acc += kt * x1[q];
      }
      if (accumulate) acc += y[q];
      out[q] = acc;
    }
  }
  // Both base rows at channels c.. (weights: loaded before griddep_wait); zeros when !live.
  __device__ __forceinline__ void load_base(const __nv_bfloat16* base, int h, int c, bool live) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    unpack_bf16x8(live ? __ldg(reinterpret_cast<const uint4*>(base + c)) : zero, b0);
    unpack_bf16x8(live ? __ldg(reinterpret_cast<const uint4*>(base + h + c)) : zero, b1);
  }
  // x at element `at` (row i, channel c) and, when `second`, the row before.
  __device__ __forceinline__ void load_x(const __nv_bfloat16* x, int64_t at, int h, bool second) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(x + at), x0);
    unpack_bf16x8(second ? *reinterpret_cast<const uint4*>(x + at - h) : make_uint4(0, 0, 0, 0),
                  x1);
  }
};

// Thread e of an 8-channels-a-thread launch over n rows of h: row i, first channel c.
struct ConvThread {
  int i = 0, c = 0;
  bool live = false;
  __device__ __forceinline__ ConvThread(int n, int h) {
    const int h8 = h >> 3, e = blockIdx.x * kConvThreads + threadIdx.x;
    live = e < n * h8;
    i = live ? e / h8 : 0;
    c = (e - i * h8) * 8;
  }
};

__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[8]) {
  return make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                    pack_bf16(v[6], v[7]));
}

__global__ void __launch_bounds__(kConvThreads)
    dynamic_conv_bf16x8_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* dyn,
                               int which, const __nv_bfloat16* base, int n, int h, int group,
                               int block_rows, bool accumulate) {
  const ConvThread t(n, h);
  const int i = t.i, c = t.c;
  Conv8 v;
  v.load_base(base, h, c, t.live);
  griddep_wait();  // x, dyn and y come from the kernels before
  griddep_launch();
  if (!t.live) return;
  const bool second = i % block_rows >= 1;  // tap 1 reads the row before, inside the block
  const int groups = h / group;
  const __nv_bfloat16* d = dyn + ((i * 2 + which) * 2) * groups + c / group;
  const float d0 = __bfloat162float(d[0]), d1 = second ? __bfloat162float(d[groups]) : 0.0f;
  v.load_x(x, i * h + c, h, second);
  unpack_bf16x8(
      accumulate ? *reinterpret_cast<const uint4*>(y + i * h + c) : make_uint4(0, 0, 0, 0), v.y);
  float out[8];
  v.run(out, d0, d1, second, accumulate);
  *reinterpret_cast<uint4*>(y + i * h + c) = pack_bf16x8(out);
}

// DFlash2's prepare convolution straight from the projection's split-K partials: dyn[i, :] is
// the sum over s (ascending) of part[s, i, :] (F32, [splits, n, width], width = 4 * groups, or
// 2 * groups when the partials hold the prepare half only) rounded to BF16, as the one-GEMM
// path's BF16 dyn; the thread of each group's first 8 channels writes the group's values (the
// prepare taps, and with the whole width the finish taps) to dyn [n, 4 * groups].
// y = conv(x, dyn[:, 0]).
__device__ __forceinline__ float sum_partials(const float* p, int splits, int64_t stride) {
  float acc = 0.0f;
  for (int s = 0; s < splits; ++s) acc += p[s * stride];
  return __bfloat162float(__float2bfloat16_rn(acc));
}

__global__ void __launch_bounds__(kConvThreads)
    dynamic_conv_partials_kernel(__nv_bfloat16* y, __nv_bfloat16* dyn, const float* part,
                                 int splits, int width, const __nv_bfloat16* x,
                                 const __nv_bfloat16* base, int n, int h, int group,
                                 int block_rows) {
  const ConvThread t(n, h);
  const int i = t.i, c = t.c;
  Conv8 v;
  v.load_base(base, h, c, t.live);
  griddep_wait();  // the partials come from the GEMM before
  griddep_launch();
  if (!t.live) return;
  const bool second = i % block_rows >= 1;
  const int groups = h / group, g = c / group;
  const int64_t stride = static_cast<int64_t>(n) * width;
  const float* p = part + static_cast<int64_t>(i) * width + g;
  const float d0 = sum_partials(p, splits, stride);
  const float d1 = second ? sum_partials(p + groups, splits, stride) : 0.0f;
  if (c % group == 0) {
    __nv_bfloat16* d = dyn + static_cast<int64_t>(i) * 4 * groups + g;
    d[0] = __float2bfloat16_rn(d0);
    d[groups] = __float2bfloat16_rn(second ? d1 : sum_partials(p + groups, splits, stride));
    if (width == 4 * groups) {
      d[2 * groups] = __float2bfloat16_rn(sum_partials(p + 2 * groups, splits, stride));
      d[3 * groups] = __float2bfloat16_rn(sum_partials(p + 3 * groups, splits, stride));
    }
  }
  v.load_x(x, i * h + c, h, second);
  float out[8];
  v.run(out, d0, d1, second, /*accumulate=*/false);
  *reinterpret_cast<uint4*>(y + i * h + c) = pack_bf16x8(out);
}

// DFlash2's finish convolution and the RMSNorm after it in one launch: a block per row, h / 8
// threads; residual[i] += conv(out, dyn[:, 1])[i] (dynamic_conv_bf16x8_kernel's bits), then
// xn[i] = rms_norm(residual[i]) * w (rms_norm_bf16_kernel's bits: the same BF16 values, the
// same per-thread order and block reduction).
__global__ void dynamic_conv_rms_norm_kernel(__nv_bfloat16* xn, __nv_bfloat16* residual,
                                             const __nv_bfloat16* out, const __nv_bfloat16* dyn,
                                             const __nv_bfloat16* base, const float* w, int h,
                                             int group, int block_rows, float eps) {
  const int i = blockIdx.x, c = threadIdx.x * 8;
  Conv8 v;
  v.load_base(base, h, c, /*live=*/true);
  griddep_wait();  // out, dyn and the residual come from the kernels before
  griddep_launch();
  const bool second = i % block_rows >= 1;
  const int groups = h / group;
  const __nv_bfloat16* d = dyn + ((i * 2 + 1) * 2) * groups + c / group;
  const float d0 = __bfloat162float(d[0]), d1 = second ? __bfloat162float(d[groups]) : 0.0f;
  const int64_t at = static_cast<int64_t>(i) * h + c;
  v.load_x(out, at, h, second);
  unpack_bf16x8(*reinterpret_cast<const uint4*>(residual + at), v.y);
  float r[8];
  v.run(r, d0, d1, second, /*accumulate=*/true);
  const uint4 packed = pack_bf16x8(r);
  *reinterpret_cast<uint4*>(residual + at) = packed;
  float rv[8];
  unpack_bf16x8(packed, rv);
  float ss = 0.0f;
  for (int q = 0; q < 8; ++q) ss += rv[q] * rv[q];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  const float* wr = w + c;
  float o[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) o[q] = rv[q] * inv * wr[q];
  *reinterpret_cast<uint4*>(xn + at) = pack_bf16x8(o);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void seeded_normal_kernel(Out out, const int32_t* positions, int64_t n, int64_t d,
                                     uint64_t seed, uint32_t stream_id, float scale) {
  const int64_t pairs = (d + 1) / 2;
  const uint64_t h_seed = mix64(mix64(seed) ^ stream_id);
  GRID_STRIDE(i, n * pairs) {
    const int64_t r = i / pairs, c = (i % pairs) * 2;
    const uint64_t pos = static_cast<uint64_t>(static_cast<int64_t>(positions[r]));
    const uint64_t h = mix64(mix64(h_seed ^ pos) ^ static_cast<uint64_t>(c / 2));
    const double u1 = static_cast<double>((h >> 40) + 1) * 0x1p-24;
    const double u2 = static_cast<double>((h >> 16) & 0xFFFFFFull) * 0x1p-24;
    const double radius = sqrt(-2.0 * log(u1));
    const double angle = 6.283185307179586 * u2;
    st(out, r * d + c, scale * static_cast<float>(radius * cos(angle)));
    if (c + 1 < d) st(out, r * d + c + 1, scale * static_cast<float>(radius * sin(angle)));
  }
}

// ---- Speculative decoding ----
// Backend::greedy_accept: one warp per verify block s (rows [offsets[s], offsets[s + 1])).
__global__ void greedy_accept_kernel(int32_t* out, const int32_t* tokens, const int32_t* target,
                                     const int32_t* offsets, int64_t width) {
  const int64_t s = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const int32_t first = offsets[s], k = offsets[s + 1] - first - 1;
  const int32_t* drafts = tokens + first + 1;
  const int32_t* tgt = target + first;
  // a = the first i < k with drafts[i] != tgt[i] (k when there is none); the ballot is the same
  // in every lane, so the whole warp leaves the loop together.
  int32_t a = k;
  for (int32_t base = 0; base < k; base += 32) {
    const int32_t i = base + lane;
    const unsigned miss = __ballot_sync(0xffffffffu, i < k && drafts[i] != tgt[i]);
    if (miss != 0) {
      a = base + __ffs(static_cast<int>(miss)) - 1;
      break;
    }
  }
  int32_t* row = out + s * width;
  for (int64_t j = lane; j < width; j += 32) {
    int32_t v = 0;
    if (j == 0) {
      v = a;
    } else if (j == 1) {
      v = tgt[a];
    } else if (j - 2 < k) {
      v = drafts[j - 2];
    }
    row[j] = v;
  }
}

// ---- RoPE and KV ----
__global__ void rope_kernel(Out x, const int32_t* positions, In inv_freq, int64_t heads, int64_t hd,
                            float scaling) {
  const int64_t t = blockIdx.x / heads, half = hd / 2, base = blockIdx.x * hd;
  const float pos = static_cast<float>(positions[t]);
  const In xi{x.p, x.t};
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * ld(inv_freq, i);
    float sn, cs;
    sincosf(angle, &sn, &cs);
    cs *= scaling;
    sn *= scaling;
    const float a = ld(xi, base + i), b = ld(xi, base + i + half);
    st(x, base + i, a * cs - b * sn);
    st(x, base + i + half, b * cs + a * sn);
  }
}

__global__ void kv_write_kernel(Out kp, Out vp, In k, In v, const int32_t* slots, int64_t n,
                                int64_t row, int64_t capacity, FaultSink fault) {
  GRID_STRIDE(i, n * row) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= capacity) {
      if (c == 0) report_slot_fault(fault, FaultOp::kKvWrite, slot, capacity);
      continue;
    }
    st(kp, slot * row + c, ld(k, i));
    st(vp, slot * row + c, ld(v, i));
  }
}

// ---- Attention ----
constexpr int kMaxAttnWarps = 32;
constexpr int kMaxHeadDim = 256;

// Row of key j in the pools: 32-bit block arithmetic, shifts for power-of-two block sizes.
__device__ __forceinline__ int64_t key_offset(const AttentionArgs& a, int bs_shift, int64_t j,
                                              int64_t kvh) {
  int64_t slot = j;
  if (a.block_table) {
    const int jj = static_cast<int>(j), bs = static_cast<int>(a.block_size);
    const int blk = bs_shift >= 0 ? jj >> bs_shift : jj / bs;
    const int in_blk = bs_shift >= 0 ? jj & (bs - 1) : jj - blk * bs;
    slot = static_cast<int64_t>(a.block_table[blk]) * bs + in_blk;
  }
  return (slot * a.kv_heads + kvh) * a.hd;
}

// Block = (query row, head); warps stride over keys in groups of G, each lane holding E
// elements (c = lane + 32 e) of the head dimension; online softmax per warp, merged at the end.
template <typename T, int E, int G>
__global__ void __launch_bounds__(1024) attention_kernel(AttentionArgs a) {
  const int64_t row = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int64_t kvh = h / (a.heads / a.kv_heads);
  const int64_t qpos = a.kv_len - a.n + row;
  int bs_shift = -1;
  for (int sh = 0; sh < 31; ++sh) {
    if ((int64_t{1} << sh) == a.block_size) bs_shift = sh;
  }
  int64_t lo = 0, hi = a.kv_len - 1;
  if (a.causal) hi = min(hi, qpos);
  if (a.window > 0) {
    lo = max(lo, qpos - a.window + 1);
    if (!a.causal) hi = min(hi, qpos + a.window - 1);
  }
  const T* q = static_cast<const T*>(a.q) + (row * a.heads + h) * a.hd;
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  float qr[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = lane + 32 * e;
    qr[e] = c < a.hd ? to_f(q[c]) : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = lo + static_cast<int64_t>(warp) * G; j0 <= hi;
       j0 += static_cast<int64_t>(nw) * G) {
    float kr[G][E], vr[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t j = j0 + g;
      const bool ok = j <= hi;
      const int64_t off = ok ? key_offset(a, bs_shift, j, kvh) : 0;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = lane + 32 * e;
        const bool okc = ok && c < a.hd;
        kr[g][e] = okc ? to_f(K[off + c]) : 0.0f;
        vr[g][e] = okc ? to_f(V[off + c]) : 0.0f;
      }
    }
    float sc[G];
    float mx = m;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) d += qr[e] * kr[g][e];
      d = warp_sum(d);  // j0 is warp-uniform: every lane takes part
      sc[g] = j0 + g <= hi ? d * a.scale : -INFINITY;
      mx = fmaxf(mx, sc[g]);
    }
    const float corr = expf(m - mx);
    l *= corr;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float p = expf(sc[g] - mx);
      l += p;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += p * vr[g][e];
    }
    m = mx;
  }
  __shared__ float sm_m[kMaxAttnWarps], sm_l[kMaxAttnWarps];
  __shared__ float sm_acc[kMaxAttnWarps][kMaxHeadDim];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = lane + 32 * e;
    if (c < a.hd) sm_acc[warp][c] = acc[e];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w]);
  T* out = static_cast<T*>(a.out) + (row * a.heads + h) * a.hd;
  for (int c = threadIdx.x; c < a.hd; c += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (M != -INFINITY) {
      for (int w = 0; w < nw; ++w) {
        if (sm_m[w] == -INFINITY) continue;
        const float f = expf(sm_m[w] - M);
        num += f * sm_acc[w][c];
        den += f * sm_l[w];
      }
    }
    from_f(out + c, den > 0.0f ? num / den : 0.0f);
  }
}

template <typename T>
cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s) {
  // A fixed number of warps per block, so that a query row's result never depends on how many
  // rows (or keys beyond its own) share the launch: the verify pass reproduces decode exactly.
  const int nw = kMaxAttnWarps;
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads));
  const int threads = nw * 32;
  if (a.hd <= 32) {
    attention_kernel<T, 1, 8><<<grid, threads, 0, s>>>(a);
  } else if (a.hd <= 64) {
    attention_kernel<T, 2, 8><<<grid, threads, 0, s>>>(a);
  } else if (a.hd <= 128) {
    attention_kernel<T, 4, 4><<<grid, threads, 0, s>>>(a);
  } else {
    attention_kernel<T, 8, 2><<<grid, threads, 0, s>>>(a);
  }
  return cudaGetLastError();
}

// ---- GEMV (n <= 4 rows) ----
__device__ __forceinline__ float dot2(uint32_t a, uint32_t b) {
  return __uint_as_float(a << 16) * __uint_as_float(b << 16) +
         __uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u);
}
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  return (dot2(a.x, b.x) + dot2(a.y, b.y)) + (dot2(a.z, b.z) + dot2(a.w, b.w));
}

// One warp per output feature j (grid-stride); each lane streams 16-byte weight vectors, 4 in
// flight, and dots them with the matching x vectors (L1-resident).
template <int NR, typename TY>
__global__ void __launch_bounds__(256)
    gemv_kernel(TY* y, const uint4* x, const uint4* w, const float* bias, int64_t m, int64_t k,
                bool accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x >> 5;
  const int64_t kv = k / 8;  // 16-byte vectors per row
  for (int64_t j = blockIdx.x * per_block + warp; j < m; j += gridDim.x * per_block) {
    const uint4* wr = w + j * kv;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    int64_t i = lane;
    for (; i + 96 < kv; i += 128) {
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = ld_stream(wr + i + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] += dot8(wv[u], __ldg(x + r * kv + i + 32 * u));
      }
    }
    for (; i < kv; i += 32) {
      const uint4 wv = ld_stream(wr + i);
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] += dot8(wv, __ldg(x + r * kv + i));
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
      const float b = bias ? bias[j] : 0.0f;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        TY* o = y + r * m + j;
        from_f(o, (accumulate ? to_f(*o) : 0.0f) + acc[r] + b);
      }
    }
  }
}

template <int NR>
cudaError_t launch_gemv(Out y, const void* x, const void* w, const float* bias, int64_t m,
                        int64_t k, bool accumulate, int num_sms, cudaStream_t s) {
  const int64_t per_block = kThreads / 32;
  int64_t blocks = (m + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 132) * 16;
  if (blocks > cap) blocks = cap;
  const auto* xv = static_cast<const uint4*>(x);
  const auto* wv = static_cast<const uint4*>(w);
  if (y.t == Elem::kF32) {
    gemv_kernel<NR, float><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        static_cast<float*>(y.p), xv, wv, bias, m, k, accumulate);
  } else {
    gemv_kernel<NR, __nv_bfloat16><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        static_cast<__nv_bfloat16*>(y.p), xv, wv, bias, m, k, accumulate);
  }
  return cudaGetLastError();
}

// ---- Skinny GEMM on tensor cores (n <= 16 rows) ----
// y[r, j] = sum_c x[r, c] w[j, c] for r < n <= 16 with mma.sync m16n8k16 (bf16 in, fp32
// accumulate). A block owns 16 output features; its 8 warps split k into interleaved 32-wide
// chunks and their partial sums are added in a fixed order. Each thread loads 8 consecutive
// k-elements (16 bytes) of two weight rows and of one x row per chunk; the k order inside a
// chunk is permuted identically for A and B, which leaves every dot product unchanged. Nothing
// about a row's arithmetic depends on n, so 1-row decode and 16-row verify agree bit for bit.
constexpr int kSkinnyWarps = 8;
constexpr int kSkinnyUnroll = 4;

// Elements [kk, kk + 8) of row `row` of a [rows, k] bf16 matrix, zero outside.
template <bool VEC, bool STREAM>
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* base, int64_t row, int64_t kk,
                                       int64_t k, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!ok || kk >= k) return v;
  const __nv_bfloat16* p = base + row * k + kk;
  if constexpr (VEC) {
    v = STREAM ? ld_stream(reinterpret_cast<const uint4*>(p))
               : __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    const auto* q = reinterpret_cast<const unsigned short*>(p);
    uint32_t e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = kk + i < k ? q[i] : 0u;
    v.x = e[0] | (e[1] << 16);
    v.y = e[2] | (e[3] << 16);
    v.z = e[4] | (e[5] << 16);
    v.w = e[6] | (e[7] << 16);
  }
  return v;
}

template <int NT, bool VEC, typename TY>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    skinny_gemm_kernel(TY* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias,
                       int n, int64_t m, int64_t k, bool accumulate) {
  constexpr int U = kSkinnyUnroll, W = kSkinnyWarps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t ra = j0 + g, rb = j0 + g + 8;
  const bool ok_a = ra < m, ok_b = rb < m;
  const int64_t chunks = (k + 31) / 32;
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  for (int64_t c0 = warp; c0 < chunks; c0 += W * U) {
    uint4 wa[U], wb[U], xb[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * W;
      const int64_t kk = c * 32 + 8 * t;
      const bool live = c < chunks;
      wa[u] = load8<VEC, true>(w, ra, kk, k, live && ok_a);
      wb[u] = load8<VEC, true>(w, rb, kk, k, live && ok_b);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        xb[u][nt] = load8<VEC, false>(x, g + 8 * nt, kk, k, live && g + 8 * nt < n);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma16816(acc[nt], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xb[u][nt].x, xb[u][nt].y);
        mma16816(acc[nt], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xb[u][nt].z, xb[u][nt].w);
      }
    }
  }
  reduce_warp_tiles<W, NT>(acc, n, [&](int col, int row, float sum) {
    const int64_t j = j0 + row;
    if (j >= m) return;
    if (bias) sum += bias[j];
    TY* o = y + static_cast<int64_t>(col) * m + j;
    from_f(o, (accumulate ? to_f(*o) : 0.0f) + sum);
  });
}

template <int NT, bool VEC>
cudaError_t launch_skinny(Out y, const void* x, const void* w, const float* bias, int n, int64_t m,
                          int64_t k, bool accumulate, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((m + 15) / 16);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (y.t == Elem::kF32) {
    skinny_gemm_kernel<NT, VEC, float><<<blocks, kSkinnyWarps * 32, 0, s>>>(
        static_cast<float*>(y.p), xb, wb, bias, n, m, k, accumulate);
  } else {
    skinny_gemm_kernel<NT, VEC, __nv_bfloat16><<<blocks, kSkinnyWarps * 32, 0, s>>>(
        static_cast<__nv_bfloat16*>(y.p), xb, wb, bias, n, m, k, accumulate);
  }
  return cudaGetLastError();
}

}  // namespace

// ---- Launchers ----
cudaError_t convert(Out dst, In src, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  convert_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}

static cudaError_t elementwise(Out y, In a, In b, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  unary_binary_kernel<<<grid_for(n), kThreads, 0, s>>>(y, a, b, n, op);
  return cudaGetLastError();
}
cudaError_t add(Out y, In a, In b, int64_t n, cudaStream_t s) {
  return elementwise(y, a, b, n, Op::kAdd, s);
}
cudaError_t mul(Out y, In a, In b, int64_t n, cudaStream_t s) {
  return elementwise(y, a, b, n, Op::kMul, s);
}
cudaError_t silu_mul(Out y, In gate, In up, int64_t n, cudaStream_t s) {
  return elementwise(y, gate, up, n, Op::kSiluMul, s);
}
cudaError_t silu(Out y, In x, int64_t n, cudaStream_t s) {
  return elementwise(y, x, x, n, Op::kSilu, s);
}
cudaError_t gelu(Out y, In x, int64_t n, bool tanh_approx, cudaStream_t s) {
  return elementwise(y, x, x, n, tanh_approx ? Op::kGeluTanh : Op::kGeluErf, s);
}
cudaError_t axpby(Out y, float a, In x, float b, In z, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  axpby_kernel<<<grid_for(n), kThreads, 0, s>>>(y, a, x, b, z, n);
  return cudaGetLastError();
}
cudaError_t gated_add(Out y, In x, In gate, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows * d <= 0) return cudaSuccess;
  gated_add_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(y, x, gate, rows, d);
  return cudaGetLastError();
}
cudaError_t modulate(Out y, In x, In shift, In scale, int64_t rows, int64_t d, bool per_row,
                     cudaStream_t s) {
  if (rows * d <= 0) return cudaSuccess;
  modulate_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(y, x, shift, scale, rows, d, per_row);
  return cudaGetLastError();
}
cudaError_t add_bias(Out y, In bias, int64_t rows, int64_t m, cudaStream_t s) {
  if (rows * m <= 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(rows * m), kThreads, 0, s>>>(y, bias, rows, m);
  return cudaGetLastError();
}

cudaError_t rms_norm(Out y, In x, In w, int64_t rows, int64_t d, float eps, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (y.t == Elem::kBF16 && x.t == Elem::kBF16 && w.t == Elem::kF32 && d % 8 == 0 &&
      (d / 8) % 32 == 0 && d / 8 <= 1024 && aligned(y.p) && aligned(x.p)) {
    return launch_pdl(rms_norm_bf16_kernel, dim3(static_cast<unsigned>(rows)),
                      dim3(static_cast<unsigned>(d / 8)), 0, s, static_cast<__nv_bfloat16*>(y.p),
                      static_cast<const __nv_bfloat16*>(x.p), static_cast<const float*>(w.p), d,
                      eps);
  }
  rms_norm_kernel<<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(y, x, w, d, eps);
  return cudaGetLastError();
}
cudaError_t layer_norm(Out y, In x, In w, In b, int64_t rows, int64_t d, float eps,
                       cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  layer_norm_kernel<<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(y, x, w, b, d, eps);
  return cudaGetLastError();
}
cudaError_t noise_combine(Out y, In base, In x, In z, In w, int64_t rows, int64_t d, int64_t e,
                          float gate, float eps, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  noise_combine_kernel<<<static_cast<unsigned>(rows), row_threads(d > e ? d : e), 0, s>>>(
      y, base, x, z, w, d, e, gate, eps);
  return cudaGetLastError();
}
cudaError_t softmax(Out y, In x, int64_t rows, int64_t v, float scale, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  softmax_kernel<<<static_cast<unsigned>(rows), v >= 4096 ? 1024 : row_threads(v), 0, s>>>(y, x, v,
                                                                                           scale);
  return cudaGetLastError();
}
cudaError_t argmax(int32_t* out, In x, int64_t rows, int64_t v, cudaStream_t s, uint64_t* scratch,
                   int64_t scratch_keys) {
  if (rows <= 0) return cudaSuccess;
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (v + kChunk - 1) / kChunk;
  if (chunks >= 4 && chunks <= 1024 && rows <= 65535 && scratch != nullptr &&
      rows * chunks <= scratch_keys) {
    argmax_chunk_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), 256, 0,
                          s>>>(scratch, x, v, kChunk);
    argmax_reduce_kernel<<<static_cast<unsigned>(rows), 32, 0, s>>>(out, scratch,
                                                                    static_cast<int>(chunks));
    return cudaGetLastError();
  }
  argmax_kernel<<<static_cast<unsigned>(rows), v >= 4096 ? 1024 : 256, 0, s>>>(out, x, v);
  return cudaGetLastError();
}

cudaError_t embedding(Out y, const int32_t* ids, In table, int64_t n, int64_t d, int64_t vocab,
                      cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  embedding_kernel<<<static_cast<unsigned>(n), row_threads(d), 0, s>>>(y, ids, table, d, vocab);
  return cudaGetLastError();
}
cudaError_t fill(Out dst, int64_t n, float value, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, n, value);
  return cudaGetLastError();
}
cudaError_t copy_block(Out dst, int64_t dst_cols, int64_t dst_off, In src, int64_t src_cols,
                       int64_t src_off, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows * d <= 0) return cudaSuccess;
  copy_block_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(dst, dst_cols, dst_off, src, src_cols,
                                                            src_off, rows, d);
  return cudaGetLastError();
}
cudaError_t topk(float* values, int32_t* ids, In x, int64_t rows, int64_t v, int64_t k,
                 cudaStream_t s) {
  if (rows <= 0 || k <= 0) return cudaSuccess;
  topk_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(values, ids, x, v, k);
  return cudaGetLastError();
}
cudaError_t scale_softcap(Out y, In x, int64_t n, float multiplier, float cap, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return launch_pdl(scale_softcap_kernel, dim3(static_cast<unsigned>(grid_for(n))), dim3(kThreads),
                    0, s, y, x, n, multiplier, cap);
}
cudaError_t dynamic_conv(Out y, In x, In dyn, int64_t which, In base, int64_t n, int64_t h,
                         int64_t taps, int64_t group, int64_t block_rows, bool accumulate,
                         cudaStream_t s, bool fast) {
  if (n * h <= 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool bf16 =
      y.t == Elem::kBF16 && x.t == Elem::kBF16 && dyn.t == Elem::kBF16 && base.t == Elem::kBF16;
  if (fast && bf16 && taps == 2 && group % 8 == 0 && h % 8 == 0 && n * h < INT_MAX &&
      aligned(y.p) && aligned(x.p) && aligned(base.p)) {
    const int64_t threads = n * h / 8;
    return launch_pdl(
        dynamic_conv_bf16x8_kernel,
        dim3(static_cast<unsigned>((threads + kConvThreads - 1) / kConvThreads)),
        dim3(kConvThreads), 0, s, static_cast<__nv_bfloat16*>(y.p),
        static_cast<const __nv_bfloat16*>(x.p), static_cast<const __nv_bfloat16*>(dyn.p),
        static_cast<int>(which), static_cast<const __nv_bfloat16*>(base.p), static_cast<int>(n),
        static_cast<int>(h), static_cast<int>(group), static_cast<int>(block_rows), accumulate);
  }
  return launch_pdl(dynamic_conv_kernel, dim3(static_cast<unsigned>(grid_for(n * h))),
                    dim3(kThreads), 0, s, y, x, dyn, which, base, n, h, taps, group, block_rows,
                    accumulate);
}
bool dynamic_conv_fused_supported(int64_t n, int64_t h, int64_t taps, int64_t group,
                                  std::initializer_list<const void*> rows) {
  for (const void* p : rows) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return taps == 2 && group % 8 == 0 && h % 8 == 0 && (h / 8) % 32 == 0 && h / 8 <= 1024 &&
         n * h < INT_MAX;
}
cudaError_t dynamic_conv_partials(__nv_bfloat16* y, __nv_bfloat16* dyn, const float* part,
                                  int64_t splits, int64_t width, const __nv_bfloat16* x,
                                  const __nv_bfloat16* base, int64_t n, int64_t h, int64_t group,
                                  int64_t block_rows, cudaStream_t s) {
  if (n * h <= 0) return cudaSuccess;
  const int64_t threads = n * h / 8;
  return launch_pdl(dynamic_conv_partials_kernel,
                    dim3(static_cast<unsigned>((threads + kConvThreads - 1) / kConvThreads)),
                    dim3(kConvThreads), 0, s, y, dyn, part, static_cast<int>(splits),
                    static_cast<int>(width), x, base, static_cast<int>(n), static_cast<int>(h),
                    static_cast<int>(group), static_cast<int>(block_rows));
}
cudaError_t dynamic_conv_rms_norm(__nv_bfloat16* xn, __nv_bfloat16* residual,
                                  const __nv_bfloat16* out, const __nv_bfloat16* dyn,
                                  const __nv_bfloat16* base, const float* w, int64_t n, int64_t h,
                                  int64_t group, int64_t block_rows, float eps, cudaStream_t s) {
  if (n * h <= 0) return cudaSuccess;
  return launch_pdl(dynamic_conv_rms_norm_kernel, dim3(static_cast<unsigned>(n)),
                    dim3(static_cast<unsigned>(h / 8)), 0, s, xn, residual, out, dyn, base, w,
                    static_cast<int>(h), static_cast<int>(group), static_cast<int>(block_rows),
                    eps);
}
cudaError_t scatter_columns(Out dst, In src, const int32_t* ids, int64_t rows, int64_t v,
                            int64_t vs, float value, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (const cudaError_t e = fill(dst, rows * v, value, s); e != cudaSuccess) return e;
  scatter_picked_kernel<<<grid_for(rows * vs), kThreads, 0, s>>>(dst, src, ids, rows, v, vs);
  return cudaGetLastError();
}
cudaError_t seeded_normal(Out out, const int32_t* positions, int64_t n, int64_t d, uint64_t seed,
                          uint32_t stream_id, float scale, cudaStream_t s) {
  const int64_t total = n * ((d + 1) / 2);
  if (total <= 0) return cudaSuccess;
  seeded_normal_kernel<<<grid_for(total), kThreads, 0, s>>>(out, positions, n, d, seed, stream_id,
                                                            scale);
  return cudaGetLastError();
}

cudaError_t greedy_accept(int32_t* out, const int32_t* tokens, const int32_t* target_ids,
                          const int32_t* offsets, int64_t seqs, int64_t width, cudaStream_t s) {
  if (seqs <= 0) return cudaSuccess;
  greedy_accept_kernel<<<static_cast<unsigned>(seqs), 32, 0, s>>>(out, tokens, target_ids, offsets,
                                                                  width);
  return cudaGetLastError();
}

cudaError_t rope(Out x, const int32_t* positions, In inv_freq, int64_t n, int64_t heads, int64_t hd,
                 float attention_scaling, cudaStream_t s) {
  if (n * heads <= 0) return cudaSuccess;
  const int threads = hd / 2 >= 128 ? 128 : (hd / 2 >= 64 ? 64 : 32);
  rope_kernel<<<static_cast<unsigned>(n * heads), threads, 0, s>>>(x, positions, inv_freq, heads,
                                                                   hd, attention_scaling);
  return cudaGetLastError();
}
cudaError_t kv_write(Out k_pool, Out v_pool, In k, In v, const int32_t* slots, int64_t n,
                     int64_t row, int64_t capacity, FaultSink fault, cudaStream_t s) {
  if (n * row <= 0) return cudaSuccess;
  kv_write_kernel<<<grid_for(n * row), kThreads, 0, s>>>(k_pool, v_pool, k, v, slots, n, row,
                                                         capacity, fault);
  return cudaGetLastError();
}

cudaError_t attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.n <= 0 || a.heads <= 0) return cudaSuccess;
  if (a.hd > kMaxHeadDim || a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.num_seqs != 1) {
    return cudaErrorInvalidValue;
  }
  if (a.t == Elem::kBF16) return launch_attention<__nv_bfloat16>(a, s);
  if (a.t == Elem::kF32) return launch_attention<float>(a, s);
  return cudaErrorInvalidValue;
}

bool gemv_supported(int64_t n, int64_t k, const void* x, const void* w) {
  return n >= 1 && n <= 4 && k % 8 == 0 && k > 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t gemv(Out y, const void* x, const void* w, const float* bias, int64_t n, int64_t m,
                 int64_t k, bool accumulate, int num_sms, cudaStream_t s) {
  if (m <= 0) return cudaSuccess;
  switch (n) {
    case 1:
      return launch_gemv<1>(y, x, w, bias, m, k, accumulate, num_sms, s);
    case 2:
      return launch_gemv<2>(y, x, w, bias, m, k, accumulate, num_sms, s);
    case 3:
      return launch_gemv<3>(y, x, w, bias, m, k, accumulate, num_sms, s);
    case 4:
      return launch_gemv<4>(y, x, w, bias, m, k, accumulate, num_sms, s);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t skinny_gemm(Out y, const void* x, const void* w, const float* bias, int64_t n,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (n > kSkinnyMaxRows) return cudaErrorInvalidValue;
  const bool vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const int ni = static_cast<int>(n);
  if (n <= 8) {
    return vec ? launch_skinny<1, true>(y, x, w, bias, ni, m, k, accumulate, s)
               : launch_skinny<1, false>(y, x, w, bias, ni, m, k, accumulate, s);
  }
  return vec ? launch_skinny<2, true>(y, x, w, bias, ni, m, k, accumulate, s)
             : launch_skinny<2, false>(y, x, w, bias, ni, m, k, accumulate, s);
}

}  // namespace bs::cuda
