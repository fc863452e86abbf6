// Weight-streaming skinny GEMM (stream_gemm.h, GemvMode::kStream): two kernels, the register
// ring (variant 2) first, the cp.async persistent kernel (variants 0, 1, 3) below it.
//
// Register ring: block b owns output features [16 b, 16 b + 16) and W warps; warp w owns the
// contiguous chunk range [w P, (w + 1) P) of k (a chunk = 32 k-elements, P = ceil(chunks / W)). Per
// chunk, lane (g, t) loads 16 bytes (8 k-elements) of weight rows g and g + 8 and of x rows g (+
// 8), i.e. the mma.sync m16n8k16 fragments of two k16 steps with the k order inside the chunk
// permuted the same way for the weights and x (dot products unchanged). The loads of the next S
// chunks are always in flight: a ring of S register stages, refilled as each stage is consumed. The
// first ring's weight loads are issued before griddep_wait(), x only after it.
//
// The warps' partial tiles are summed in warp order (reduce_warp_tiles). A row's arithmetic is
// fixed by k, W and S alone; mma.sync columns never mix, so a row does not depend on n.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/stream_gemm.h"

namespace bs::cuda {
namespace {

constexpr int kChunk = 32;  // k-elements per warp step: 4 lanes x 8

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

// Sums the warps' partial tiles of output features j0..j0+15 in warp order and writes them:
// y[col, j] (+)= sum (+ bias[j]) for j < m.
template <int W, int NT, typename TY>
__device__ __forceinline__ void store_tile(float (&acc)[NT][4], int n, int64_t j0, int64_t m,
                                           const float* bias, TY* y, bool accumulate) {
  reduce_warp_tiles<W, NT>(acc, n, [&](int col, int row, float sum) {
    const int64_t j = j0 + row;
    if (j >= m) return;
    if (bias) sum += bias[j];
    TY* o = y + static_cast<int64_t>(col) * m + j;
    store(o, (accumulate ? to_float(*o) : 0.0f) + sum);
  });
}

// x is written by the previous kernel: an ordinary cached load (L1 keeps it for the other warps).
__device__ __forceinline__ uint4 ld_x(const __nv_bfloat16* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

template <int W, int S, int NT, typename TY>
__global__ void __launch_bounds__(W * 32)
    stream_gemm_kernel(TY* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias,
                       int n, int64_t m, int64_t k, int64_t per_warp, bool accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t cb = warp * per_warp;
  const int64_t ce = cb + per_warp < chunks ? cb + per_warp : chunks;
  const bool ok_a = j0 + g < m, ok_b = j0 + g + 8 < m;
  const __nv_bfloat16* pa = w + (ok_a ? j0 + g : 0) * k + 8 * t;
  const __nv_bfloat16* pb = w + (ok_b ? j0 + g + 8 : 0) * k + 8 * t;
  bool ok_x[NT];
  const __nv_bfloat16* px[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    ok_x[nt] = g + 8 * nt < n;
    px[nt] = x + (ok_x[nt] ? g + 8 * nt : 0) * k + 8 * t;
  }
  // k % 8 == 0: a lane's 8 elements are all inside k or all outside.
  const auto live = [&](int64_t c) { return c < ce && c * kChunk + 8 * t < k; };
  const uint4 zero = make_uint4(0, 0, 0, 0);

  uint4 wa[S], wb[S], xr[S][NT];
#pragma unroll
  for (int u = 0; u < S; ++u) {
    const int64_t c = cb + u;
    const bool l = live(c);
    wa[u] = l && ok_a ? ld_stream(reinterpret_cast<const uint4*>(pa + c * kChunk)) : zero;
    wb[u] = l && ok_b ? ld_stream(reinterpret_cast<const uint4*>(pb + c * kChunk)) : zero;
  }
  griddep_wait();  // x (and y when accumulating) come from the kernels before
#pragma unroll
  for (int u = 0; u < S; ++u) {
    const int64_t c = cb + u;
    const bool l = live(c);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xr[u][nt] = l && ok_x[nt] ? ld_x(px[nt] + c * kChunk) : zero;
  }
  griddep_launch();

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  for (int64_t c0 = cb; c0 < ce; c0 += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int64_t c = c0 + u;
      if (c >= ce) break;  // warp-uniform
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma16816(acc[nt], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xr[u][nt].x, xr[u][nt].y);
        mma16816(acc[nt], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xr[u][nt].z, xr[u][nt].w);
      }
      const int64_t cn = c + S;
      const bool l = live(cn);
      wa[u] = l && ok_a ? ld_stream(reinterpret_cast<const uint4*>(pa + cn * kChunk)) : zero;
      wb[u] = l && ok_b ? ld_stream(reinterpret_cast<const uint4*>(pb + cn * kChunk)) : zero;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        xr[u][nt] = l && ok_x[nt] ? ld_x(px[nt] + cn * kChunk) : zero;
      }
    }
  }
  store_tile<W, NT>(acc, n, j0, m, bias, y, accumulate);
}

// ---- cp.async variant: a persistent grid, each warp's stages in shared memory ----
// The same fragments and k permutation, but every lane's 16-byte pieces (two weight rows, NT x
// rows) are copied by cp.async into the lane's own slots of a ring of S stages in shared memory
// (no other lane reads them: no barriers), so S stages stay in flight at the cost of shared
// memory instead of registers. The grid is at most one resident wave; block b takes tiles b,
// b + G, ... and its warps stream them back to back (the ring runs on across tile ends, so a
// block never drains until its last tile). Warp w takes the interleaved chunks w, w + W, ... of
// a tile (the block's pieces in flight are one contiguous window of each row). Per tile, the
// warps' partial tiles are summed in warp order.
// cp_async16 with a generic shared-memory pointer; ok false zero-fills.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool ok) {
  cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, ok ? 16 : 0);
}

// Where a warp's next stage comes from: its j-th chunk of tile `tile` (tiles advance by G).
struct Cursor {
  int64_t tile, j;
};

template <int W, int S, int NT>
constexpr size_t async_smem_bytes() {
  return static_cast<size_t>(W) * S * (2 + NT) * 32 * sizeof(uint4);
}

template <int W, int S, int NT, typename TY>
__global__ void __launch_bounds__(W * 32)
    stream_async_kernel(TY* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias,
                        int n, int64_t m, int64_t k, int64_t tiles, int64_t per_warp,
                        bool accumulate) {
  extern __shared__ __align__(16) uint4 ring_smem[];  // [warp][stage][2 + NT][lane]
  constexpr int P = 2 + NT;                           // pieces per lane per stage
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint4* ring = ring_smem + static_cast<int64_t>(warp) * S * P * 32 + lane;
  const int64_t G = gridDim.x;
  const int64_t my_tiles = (tiles - 1 - blockIdx.x) / G + 1;  // grid <= tiles
  const int64_t total = my_tiles * per_warp;
  const auto advance = [&](Cursor& c) {
    if (++c.j == per_warp) {
      c.j = 0;
      c.tile += G;
    }
  };
  // Copies the weight (and / or x) pieces of the stage at `c` into ring slot `slot`.
  const auto issue = [&](const Cursor& c, int slot, bool weights, bool xs) {
    const int64_t kk = (c.j * W + warp) * kChunk + 8 * t;
    const bool live = kk < k;  // k % 8 == 0
    uint4* dst = ring + slot * P * 32;
    if (weights) {
      const int64_t ra = c.tile * 16 + g, rb = ra + 8;
      const bool oa = live && ra < m, ob = live && rb < m;
      copy16_async(dst, oa ? w + ra * k + kk : w, oa);
      copy16_async(dst + 32, ob ? w + rb * k + kk : w, ob);
    }
    if (xs) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const bool ox = live && g + 8 * nt < n;
        copy16_async(dst + (2 + nt) * 32, ox ? x + (g + 8 * nt) * k + kk : x, ox);
      }
    }
  };
  // The first S - 1 stages: weights now (each its own group), x after the wait (one group).
  Cursor load{blockIdx.x, 0};
  for (int u = 0; u < S - 1; ++u) {
    if (u < total) issue(load, u, true, false);
    cp_async_commit();
    advance(load);
  }
  griddep_wait();  // x (and y when accumulating) come from the kernels before
  {
    Cursor c{blockIdx.x, 0};
    for (int u = 0; u < S - 1; ++u) {
      if (u < total) issue(c, u, false, true);
      advance(c);
    }
    cp_async_commit();
  }
  griddep_launch();

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  Cursor cur{blockIdx.x, 0};
  int slot = 0, load_slot = S - 1;
  for (int64_t i = 0; i < total; ++i) {
    if (i == 0) {
      cp_async_wait<0>();
    } else {
      cp_async_wait<S - 2>();
    }
    const uint4* src = ring + slot * P * 32;
    const uint4 wa = src[0], wb = src[32];
    uint4 xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xr[nt] = src[(2 + nt) * 32];
    // Refill the slot consumed one step ago with the stage S - 1 ahead.
    if (i + S - 1 < total) issue(load, load_slot, true, true);
    cp_async_commit();
    advance(load);
    load_slot = load_slot + 1 == S ? 0 : load_slot + 1;
    slot = slot + 1 == S ? 0 : slot + 1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma16816(acc[nt], wa.x, wb.x, wa.y, wb.y, xr[nt].x, xr[nt].y);
      mma16816(acc[nt], wa.z, wb.z, wa.w, wb.w, xr[nt].z, xr[nt].w);
    }
    if (cur.j + 1 == per_warp) {  // the tile's last chunk: sum the warps, store, next tile
      const int64_t j0 = cur.tile * 16;
      store_tile<W, NT>(acc, n, j0, m, bias, y, accumulate);
      __syncthreads();  // the reduction's shared tiles are free again
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    }
    advance(cur);
  }
  cp_async_wait<0>();
}

template <int W, int S, int NT>
cudaError_t launch_async(Out y, const void* x, const void* w, const float* bias, int n, int64_t m,
                         int64_t k, bool accumulate, cudaStream_t s) {
  constexpr size_t smem = async_smem_bytes<W, S, NT>();
  void (*kf)(float*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, int, int64_t,
             int64_t, int64_t, int64_t, bool) = stream_async_kernel<W, S, NT, float>;
  void (*kb)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, int, int64_t,
             int64_t, int64_t, int64_t, bool) = stream_async_kernel<W, S, NT, __nv_bfloat16>;
  // Per instantiation, once: the shared memory opt-in and one wave's size (resident blocks).
  static const int wave = [&] {
    cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    cudaFuncSetAttribute(kb, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kf, W * 32, smem);
    return std::max(1, per_sm) * std::max(1, sms);
  }();
  const int64_t tiles = (m + 15) / 16;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, wave)));
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t per_warp = (chunks + W - 1) / W;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (y.t == Elem::kF32) {
    return launch_pdl(kf, grid, dim3(W * 32), smem, s, static_cast<float*>(y.p), xb, wb, bias, n, m,
                      k, tiles, per_warp, accumulate);
  }
  return launch_pdl(kb, grid, dim3(W * 32), smem, s, static_cast<__nv_bfloat16*>(y.p), xb, wb, bias,
                    n, m, k, tiles, per_warp, accumulate);
}

template <int W, int S>
cudaError_t launch_async_rows(Out y, const void* x, const void* w, const float* bias, int n,
                              int64_t m, int64_t k, bool accumulate, cudaStream_t s) {
  return n <= 8 ? launch_async<W, S, 1>(y, x, w, bias, n, m, k, accumulate, s)
                : launch_async<W, S, 2>(y, x, w, bias, n, m, k, accumulate, s);
}

template <int W, int S, int NT>
cudaError_t launch(Out y, const void* x, const void* w, const float* bias, int n, int64_t m,
                   int64_t k, bool accumulate, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((m + 15) / 16));
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  const int64_t per_warp = (chunks + W - 1) / W;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (y.t == Elem::kF32) {
    return launch_pdl(stream_gemm_kernel<W, S, NT, float>, grid, dim3(W * 32), 0, s,
                      static_cast<float*>(y.p), xb, wb, bias, n, m, k, per_warp, accumulate);
  }
  return launch_pdl(stream_gemm_kernel<W, S, NT, __nv_bfloat16>, grid, dim3(W * 32), 0, s,
                    static_cast<__nv_bfloat16*>(y.p), xb, wb, bias, n, m, k, per_warp, accumulate);
}

template <int W, int S>
cudaError_t launch_rows(Out y, const void* x, const void* w, const float* bias, int n, int64_t m,
                        int64_t k, bool accumulate, cudaStream_t s) {
  return n <= 8 ? launch<W, S, 1>(y, x, w, bias, n, m, k, accumulate, s)
                : launch<W, S, 2>(y, x, w, bias, n, m, k, accumulate, s);
}

}  // namespace

bool stream_gemm_supported(int64_t n, int64_t k, const void* x, const void* w) {
  return n >= 1 && n <= kSkinnyMaxRows && k > 0 && k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t stream_gemm(Out y, const void* x, const void* w, const float* bias, int64_t n,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s, int variant,
                        const StreamSplitSpace& space) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (!stream_gemm_supported(n, k, x, w) || (y.t != Elem::kF32 && y.t != Elem::kBF16)) {
    return cudaErrorInvalidValue;
  }
  if (stream_fuses(variant)) {  // the bulk variants: the plain form of their kernels
    return stream_gemm_fused(y, StreamX::kRows, x, nullptr, 0.0f, w, bias, n, m, k, accumulate, s,
                             variant, space);
  }
  const int ni = static_cast<int>(n);
  switch (variant) {
    case 1:
      return launch_async_rows<4, 12>(y, x, w, bias, ni, m, k, accumulate, s);
    case 2:
      return launch_rows<8, 4>(y, x, w, bias, ni, m, k, accumulate, s);
    case 3:
      return launch_async_rows<4, 16>(y, x, w, bias, ni, m, k, accumulate, s);
    default:  // the fastest on the Qwen3-8B o_proj, 1 and 16 rows (docs/BENCHMARKS.md)
      return launch_async_rows<8, 6>(y, x, w, bias, ni, m, k, accumulate, s);
  }
}

}  // namespace bs::cuda
