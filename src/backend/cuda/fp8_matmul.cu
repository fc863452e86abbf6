// FP8 weights with one scale per output row (Backend::quantize_fp8_rows / matmul_fp8): the
// quantizer, the dequantizer (fallback for shapes the kernel does not take) and a weight-only FP8
// product for few activation rows on the tensor cores.
#include <cuda_fp8.h>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace bs::cuda {
namespace {

constexpr int kQuantThreads = 256;

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store_f(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// One block per row j: scale[j] = max |w[j, :]| / 448 (1 for a zero row), q = e4m3(w / scale)
// rounded to nearest even, saturated (the rule of f32_to_f8e4m3 on the host).
template <typename T>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_fp8_rows_kernel(uint8_t* q, float* scale, const T* w, int64_t k) {
  const int64_t j = blockIdx.x;
  const T* row = w + j * k;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(load_f(row, c)));
  __shared__ float part[kQuantThreads / 32];
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int i = 0; i < kQuantThreads / 32; ++i) amax = fmaxf(amax, part[i]);
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) scale[j] = s;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    q[j * k + c] = __nv_cvt_float_to_fp8(load_f(row, c) / s, __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
__global__ void dequantize_fp8_rows_kernel(T* w, const uint8_t* q, const float* scale, int64_t m,
                                           int64_t k) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m * k;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __half h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
    store_f(w, i, __half2float(h) * scale[i / k]);
  }
}

// ---- Weight-only FP8 product on the tensor cores (n <= 16 rows per launch) ----
// A block owns 16 output features j0..j0+15; its 8 warps take interleaved 64-wide k chunks, each
// thread 16 consecutive k of feature rows g and g + 8 (one 16-byte load each) and of x rows
// g (+ 8). FP8 codes become FP16 by moving their bits into FP16's fields (value * 2^-8, exact,
// subnormals included; the 2^8 goes into the row scale), x is rounded to FP16 (saturated), and
// four m16n8k16 MMAs with FP32 accumulation take the 64 k. The k order inside a thread's 16 is
// permuted identically for weights and x, which leaves every dot product unchanged. Partial sums
// of the 8 warps are added in a fixed order, so a row's result never depends on n.
constexpr int kFp8Warps = 8;
constexpr int kFp8Unroll = 4;
constexpr float kFp8ToF16Scale = 256.0f;  // e4m3 bits read as fp16 are the value * 2^-8

// Four E4M3 codes (bytes of w, k order 0..3) -> FP16 pairs lo = (0, 1), hi = (2, 3).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = __byte_perm(w, 0, 0x1404);  // byte 0 -> bits 15..8, byte 1 -> 31..24
  const uint32_t b = __byte_perm(w, 0, 0x3424);  // byte 2 -> bits 15..8, byte 3 -> 31..24
  lo = (a & 0x80008000u) | ((a >> 1) & 0x3f803f80u);
  hi = (b & 0x80008000u) | ((b >> 1) & 0x3f803f80u);
}

// Two BF16 (k order 0, 1) -> one FP16 pair, saturated at +-65504.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 consecutive codes -> 8 FP16 pairs in k order.
__device__ __forceinline__ void unpack16(const uint4& v, uint32_t (&h)[8]) {
  e4m3x4_to_f16x2(v.x, h[0], h[1]);
  e4m3x4_to_f16x2(v.y, h[2], h[3]);
  e4m3x4_to_f16x2(v.z, h[4], h[5]);
  e4m3x4_to_f16x2(v.w, h[6], h[7]);
}

// The weight codes of chunk c for this thread (zero past k).
__device__ __forceinline__ void load_weights(const uint8_t* q, int64_t ra, int64_t rb, int64_t k,
                                             int64_t kk, bool live, uint4& wa, uint4& wb) {
  wa = wb = make_uint4(0, 0, 0, 0);
  if (!live) return;
  wa = ld_stream(reinterpret_cast<const uint4*>(q + ra * k + kk));
  wb = ld_stream(reinterpret_cast<const uint4*>(q + rb * k + kk));
}

// x16: x already converted to FP16 (bf16_to_f16_kernel), else BF16 converted here.
template <int NT, bool X16, typename TY>
__global__ void __launch_bounds__(kFp8Warps * 32, 2)
    fp8_matmul_kernel(TY* y, const uint16_t* x, const uint8_t* q, const float* scale, int n,
                      int64_t m, int64_t k, bool accumulate) {
  constexpr int U = kFp8Unroll, W = kFp8Warps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 16;
  // Feature rows past m repeat the last row (their results are not stored).
  const int64_t ra = min(j0 + g, m - 1), rb = min(j0 + g + 8, m - 1);
  const int64_t chunks = (k + 63) / 64;
  // The weight codes of the round starting at chunk c0 (U chunks W apart).
  auto load_round = [&](int64_t c0, uint4(&a)[U], uint4(&b)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * W, kk = c * 64 + 16 * t;
      load_weights(q, ra, rb, k, kk, c < chunks && kk < k, a[u], b[u]);
    }
  };

  // The weights do not depend on the kernels before this one: start streaming them before
  // waiting for those kernels (programmatic dependent launch), then read x.
  uint4 wa[U], wb[U];
  load_round(warp, wa, wb);
  griddep_wait();

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  for (int64_t c0 = warp; c0 < chunks; c0 += W * U) {
    uint4 na[U], nb[U];
    load_round(c0 + W * U, na, nb);  // in flight while this round computes
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t ha[8], hb[8];
      unpack16(wa[u], ha);
      unpack16(wb[u], hb);
      const int64_t c = c0 + u * W, kk = c * 64 + 16 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        // x is small and L1-resident: loaded where it is used, to save registers.
        const int row = g + 8 * nt;
        uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
        if (c < chunks && kk < k && row < n) {
          const auto* p = reinterpret_cast<const uint4*>(x + row * k + kk);
          x0 = __ldg(p);
          x1 = __ldg(p + 1);
        }
        uint32_t hx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        if constexpr (!X16) {
#pragma unroll
          for (int i = 0; i < 8; ++i) hx[i] = bf16x2_to_f16x2(hx[i]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          mma_f16(acc[nt], ha[2 * i], hb[2 * i], ha[2 * i + 1], hb[2 * i + 1], hx[2 * i],
                  hx[2 * i + 1]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = na[u];
      wb[u] = nb[u];
    }
  }

  reduce_warp_tiles<W, NT>(acc, n, [&](int col, int row, float sum) {
    const int64_t j = j0 + row;
    if (j >= m) return;
    const float v = sum * (scale[j] * kFp8ToF16Scale);
    const int64_t o = static_cast<int64_t>(col) * m + j;
    store_f(y, o, accumulate ? load_f(y, o) + v : v);
  });
}

// x (BF16) -> FP16 saturated (as fp8_matmul_kernel converts it), 8 values per thread.
__global__ void bf16_to_f16_kernel(uint4* out, const uint4* in, int64_t n8) {
  griddep_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = in[i];
    out[i] = make_uint4(bf16x2_to_f16x2(v.x), bf16x2_to_f16x2(v.y), bf16x2_to_f16x2(v.z),
                        bf16x2_to_f16x2(v.w));
  }
}

template <int NT, bool X16, typename TY>
cudaError_t launch_rows(TY* y, const uint16_t* x, const uint8_t* q, const float* scale, int rows,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((m + 15) / 16)), block(kFp8Warps * 32);
  return launch_pdl(fp8_matmul_kernel<NT, X16, TY>, grid, block, 0, s, y, x, q, scale, rows, m, k,
                    accumulate);
}

template <typename TY>
cudaError_t launch_fp8_matmul(TY* y, const uint16_t* x, const uint8_t* q, const float* scale,
                              int64_t n, int64_t m, int64_t k, bool accumulate, uint16_t* x16,
                              cudaStream_t s) {
  // More than 8 rows: x converted to FP16 once instead of in every block.
  const bool pre = x16 != nullptr && n > 8;
  if (pre) {
    const int64_t n8 = n * k / 8, blocks = (n8 + 255) / 256;
    const cudaError_t e = launch_pdl(
        bf16_to_f16_kernel, dim3(static_cast<unsigned>(blocks < 1024 ? blocks : 1024)), dim3(256),
        0, s, reinterpret_cast<uint4*>(x16), reinterpret_cast<const uint4*>(x), n8);
    if (e != cudaSuccess) return e;
    x = x16;
  }
  // 16 rows per launch; every launch streams the weights again.
  for (int64_t r0 = 0; r0 < n; r0 += 16) {
    const int rows = static_cast<int>(n - r0 < 16 ? n - r0 : 16);
    TY* yr = y + r0 * m;
    const uint16_t* xr = x + r0 * k;
    const cudaError_t e =
        rows <= 8 ? (pre ? launch_rows<1, true>(yr, xr, q, scale, rows, m, k, accumulate, s)
                         : launch_rows<1, false>(yr, xr, q, scale, rows, m, k, accumulate, s))
                  : (pre ? launch_rows<2, true>(yr, xr, q, scale, rows, m, k, accumulate, s)
                         : launch_rows<2, false>(yr, xr, q, scale, rows, m, k, accumulate, s));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t quantize_fp8_rows(uint8_t* q, float* scale, In w, int64_t m, int64_t k,
                              cudaStream_t s) {
  if (m <= 0 || k <= 0) return cudaSuccess;
  if (w.t == Elem::kBF16) {
    quantize_fp8_rows_kernel<<<static_cast<unsigned>(m), kQuantThreads, 0, s>>>(
        q, scale, static_cast<const __nv_bfloat16*>(w.p), k);
  } else if (w.t == Elem::kF32) {
    quantize_fp8_rows_kernel<<<static_cast<unsigned>(m), kQuantThreads, 0, s>>>(
        q, scale, static_cast<const float*>(w.p), k);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t dequantize_fp8_rows(Out w, const uint8_t* q, const float* scale, int64_t m, int64_t k,
                                cudaStream_t s) {
  if (m * k <= 0) return cudaSuccess;
  const int64_t blocks = (m * k + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  if (w.t == Elem::kBF16) {
    dequantize_fp8_rows_kernel<<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(w.p), q, scale, m,
                                                    k);
  } else if (w.t == Elem::kF32) {
    dequantize_fp8_rows_kernel<<<grid, 256, 0, s>>>(static_cast<float*>(w.p), q, scale, m, k);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

bool fp8_matmul_supported(int64_t k, const void* x, const void* q) {
  return k > 0 && k % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

cudaError_t fp8_matmul(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                       int64_t m, int64_t k, bool accumulate, cudaStream_t s, void* x16) {
  if (n <= 0 || m <= 0) return cudaSuccess;
  const auto* xb = static_cast<const uint16_t*>(x);
  auto* xh = static_cast<uint16_t*>(x16);
  if (y.t == Elem::kBF16) {
    return launch_fp8_matmul(static_cast<__nv_bfloat16*>(y.p), xb, q, scale, n, m, k, accumulate,
                             xh, s);
  }
  if (y.t == Elem::kF32) {
    return launch_fp8_matmul(static_cast<float*>(y.p), xb, q, scale, n, m, k, accumulate, xh, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bs::cuda
