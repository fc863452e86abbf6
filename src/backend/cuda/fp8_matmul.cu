// FP8 weights with one scale per output row (Backend::quantize_fp8_rows / matmul_fp8): the
// quantizer, the dequantizer (fallback for shapes the kernels do not take) and two weight-only
// FP8 products for few activation rows on the tensor cores: v1 (fp8_matmul_kernel, 16 features
// per block; the default) and v2 (fp8_matmul_v2_kernel, BLOCKSPEC_FP8_KERNEL=v2: x staged once
// per block, weights through a cp.async ring, deterministic split-K; its design is at the top of
// its section below; slower on the H200's draft shapes, docs/BENCHMARKS.md session 10).
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/fp8_fragments.cuh"
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
    // __fmul_rn: never contracted with the accumulation into an FMA, which nvcc decides per
    // kernel (the bulk kernel's instantiations must give these bits).
    const float v = __fmul_rn(sum, scale[j] * kFp8ToF16Scale);
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

// ---- Weight-only FP8 product, v2: x staged once per block, a cp.async ring of weights ----
// Why: v1 gives each block 16 output features, so every block re-reads all rows of x (16 rows x
// k x 2 bytes, more than its own 16 x k weight bytes) and a block lives for only two rounds of
// loads; it streams 1.7-2.9 TB/s at 16 rows. v2:
// - A warp owns a 16-feature tile (the MMA's M side, exactly as v1: codes turned into FP16 by a
//   bit move, the same k permutation for weights and x, m16n8k16 MMAs with FP32 accumulation)
//   over one k split; the 8 warps of a block take 8 different tiles of the same split, so the
//   block stages that split's x slab ONCE into shared memory (BF16 -> FP16 saturated there, the
//   conversion of bf16_to_f16_kernel; no separate conversion launch) and every warp reads it
//   from there (row stride padded by 16 bytes: conflict-free 16-byte reads).
// - Weights stream through a per-warp cp.async ring of kV2Depth 64-k chunks (1 KB per warp per
//   chunk; each lane copies and later reads back only its own 2 x 16 bytes, so the only
//   synchronisation is cp.async.wait_group): kV2Depth chunks stay in flight per warp across
//   tile boundaries, 128 KB per SM. The first kV2Depth chunks are requested before
//   griddepcontrol.wait (programmatic dependent launch), as in v1.
// - The grid is one wave: splits x groups <= 2 blocks per SM (fp8_v2_plan picks the split count
//   from m, k and the SM count alone, never from n), block (group p, split s) handles tiles
//   p * 8 + warp, + groups * 8, ...; a split's x slab is at most kV2MaxSlabChunks chunks.
// - Split-K is reduced deterministically: each warp stores its F32 tile partials (in the MMA's
//   C-fragment order, so lane i of the reducing warp reads exactly its own elements) to
//   partials[tile][split] as it goes; after its last tile (a fence inside the stream would wait
//   for the ring's copies) it fences once and counts its arrivals on counters[tile], 32 tiles
//   per atomic round; for each tile it arrived at last it sums the partials in split order
//   0, 1, ..., S-1 and writes y, and resets the counter to 0 for the next launch. Row r's
//   arithmetic (MMAs in chunk order, then the fixed split sum, then the scale) therefore does
//   not depend on n, nor on which warp arrives last. Without splits the warp writes y directly.
constexpr int kV2Warps = 8;
constexpr int kV2Depth = 8;             // 64-k chunks in flight per warp (cp.async ring stages)
constexpr int kV2BlocksPerSm = 2;       // the plan's wave: blocks resident per SM
constexpr int kV2MaxSlabChunks = 20;    // x slab per block: 16 rows x 20 x 64 FP16 = 41 KB
constexpr int kV2MaxPlanSplits = 32;    // more only when k needs them for the slab limit
constexpr int kV2ChunkBytes = 32 * 32;  // one chunk of one warp: 32 lanes x (16 + 16) bytes
constexpr int kV2PartialFloats = 256;   // one tile's partial: 32 lanes x 2 x 4 accumulators
constexpr size_t kV2RingBytes = static_cast<size_t>(kV2Warps) * kV2Depth * kV2ChunkBytes;

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zero-filled when src_bytes is 0 (then nothing is read). The
// "memory" clobbers keep the compiler from moving shared-memory reads across the ring's
// copies and waits.

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <int NT, typename TY>
__global__ void __launch_bounds__(kV2Warps * 32, kV2BlocksPerSm)
    fp8_matmul_v2_kernel(TY* y, const uint16_t* x, const uint8_t* q, const float* scale, int n,
                         int64_t m, int64_t k, bool accumulate, int splits, int64_t chunks,
                         int slab_chunks, float* partials, int* counters) {
  constexpr int W = kV2Warps, D = kV2Depth;
  extern __shared__ uint4 v2_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int s = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
  const int64_t group = blockIdx.x / static_cast<unsigned>(splits);
  const int64_t groups = gridDim.x / static_cast<unsigned>(splits);
  const int64_t tiles = (m + 15) / 16, tile_stride = groups * W;
  // This split's chunks [cb, cb + ns): the chunks divided as evenly as possible (ns >= 1).
  const int64_t cb = s * chunks / splits;
  const int ns = static_cast<int>((s + 1) * chunks / splits - cb);
  const int rounds = (ns + D - 1) / D;

  // The ring: warp w's stage d at byte (w * D + d) * 1 KB; in a stage, lane L's 16 codes of
  // feature row g at L * 16 and of row g + 8 at 512 + L * 16.
  const uint8_t* ring = reinterpret_cast<const uint8_t*>(v2_smem) +
                        static_cast<size_t>(warp) * D * kV2ChunkBytes + lane * 16;
  const uint32_t ring_s = shared_addr(ring);
  // Requests chunk (round, d) of `tile` into stage d (nothing for a chunk past the split or a
  // tile past the end; codes past m or k are zero-filled), then commits one group (maybe empty)
  // so that every step commits exactly one.
  auto request = [&](int64_t tile, int round, int d) {
    const int c = round * D + d;
    if (tile < tiles && c < ns) {
      const int64_t kk = (cb + c) * 64 + 16 * t, ra = tile * 16 + g, rb = ra + 8;
      const bool ok_a = kk < k && ra < m, ok_b = kk < k && rb < m;
      const uint32_t dst = ring_s + d * kV2ChunkBytes;
      cp_async16<true>(dst, ok_a ? q + ra * k + kk : q, ok_a ? 16 : 0);
      cp_async16<true>(dst + 512, ok_b ? q + rb * k + kk : q, ok_b ? 16 : 0);
    }
    cp_async_commit();
  };

  // The weights do not depend on the kernels before this one: request the first D chunks
  // before waiting for those kernels (programmatic dependent launch), then stage x.
  const int64_t first_tile = group * W + warp;
#pragma unroll
  for (int d = 0; d < D; ++d) request(first_tile, 0, d);
  griddep_wait();

  // x slab: rows 0 .. NT * 8 - 1 (zero from n on), this split's columns, FP16.
  uint16_t* xs = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(v2_smem) + kV2RingBytes);
  const int rs = slab_chunks * 64 + 8;  // halves per slab row (+16 bytes: no bank conflicts)
  {
    const int per_row = ns * 8;  // 16-byte groups of 8 values
    const int items = NT * 8 * per_row;
    constexpr int kBatch = 4;  // loads in flight per thread
    for (int base = threadIdx.x; base < items; base += kBatch * W * 32) {
      uint4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + b * W * 32, r = i / per_row, c8 = i - r * per_row;
        const int64_t kk = cb * 64 + c8 * 8;
        v[b] = make_uint4(0, 0, 0, 0);
        if (i < items && r < n && kk < k) {
          v[b] = __ldg(reinterpret_cast<const uint4*>(x + r * k + kk));
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + b * W * 32, r = i / per_row, c8 = i - r * per_row;
        if (i < items) {
          const uint4 h = make_uint4(bf16x2_to_f16x2(v[b].x), bf16x2_to_f16x2(v[b].y),
                                     bf16x2_to_f16x2(v[b].z), bf16x2_to_f16x2(v[b].w));
          *reinterpret_cast<uint4*>(xs + r * rs + c8 * 8) = h;
        }
      }
    }
  }
  __syncthreads();

  // y (+)= the tile's sums times the row scales. acc[nt][e]: feature tile * 16 + g (+ 8 for
  // e >= 2), x row nt * 8 + 2t (+ 1 for odd e).
  auto store_tile = [&](int64_t tile, const float(&acc)[NT][4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t j = tile * 16 + g + 8 * (e >> 1);
      if (j >= m) continue;
      const float sc = scale[j] * kFp8ToF16Scale;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int row = nt * 8 + 2 * t + (e & 1);
        if (row >= n) continue;
        const float v = __fmul_rn(acc[nt][e], sc);  // no FMA with the accumulation
        const int64_t o = static_cast<int64_t>(row) * m + j;
        store_f(y, o, accumulate ? load_f(y, o) + v : v);
      }
    }
  };

  for (int64_t tile = first_tile; tile < tiles; tile += tile_stride) {  // warp-uniform
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int r = 0; r < rounds; ++r) {
      // Stage d is refilled with the chunk D steps ahead: (r + 1, d), or (0, d) of the next tile.
      const bool last = r + 1 == rounds;
      const int64_t ahead_tile = last ? tile + tile_stride : tile;
      const int ahead_round = last ? 0 : r + 1;
#pragma unroll
      for (int d = 0; d < D; ++d) {
        cp_async_wait<D - 1>();  // this step's chunk (committed D steps ago) has landed
        const int c = r * D + d;
        if (c < ns) {
          const uint4 wa = *reinterpret_cast<const uint4*>(ring + d * kV2ChunkBytes);
          const uint4 wb = *reinterpret_cast<const uint4*>(ring + d * kV2ChunkBytes + 512);
          uint32_t ha[8], hb[8];
          unpack16(wa, ha);
          unpack16(wb, hb);
          // x rows g (+ 8 nt), the same 16 k as the codes: two 16-byte reads per row tile.
          const uint16_t* xr = xs + g * rs + c * 64 + 16 * t;
          uint4 xv[NT][2];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            xv[nt][0] = *reinterpret_cast<const uint4*>(xr + nt * 8 * rs);
            xv[nt][1] = *reinterpret_cast<const uint4*>(xr + nt * 8 * rs + 8);
          }
          // MMA i takes k 4i .. 4i + 3 of the thread's 16 (v1's order for every tile); the NT
          // accumulator chains are interleaved.
#pragma unroll
          for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint4& xq = xv[nt][i >> 1];
              const uint32_t b0 = (i & 1) ? xq.z : xq.x, b1 = (i & 1) ? xq.w : xq.y;
              mma_f16(acc[nt], ha[2 * i], hb[2 * i], ha[2 * i + 1], hb[2 * i + 1], b0, b1);
            }
          }
        }
        // After the MMAs (asm volatile, in order) that consumed this stage's codes: the copy
        // cannot overwrite the stage before its reads returned.
        request(ahead_tile, ahead_round, d);
      }
    }

    if (splits > 1) {
      // The tile's partial; counted and reduced after the stream (below), so that no fence
      // stalls this warp while its ring copies are in flight.
      float* mine = partials + (tile * splits + s) * kV2PartialFloats + lane * 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        __stcg(reinterpret_cast<float4*>(mine + nt * 4),
               make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]));
      }
    } else {
      store_tile(tile, acc);
    }
  }
  cp_async_wait<0>();  // no copy outlives the block
  // The stream is done: the next kernel may be scheduled now (once every block got here), so
  // that its launch and its own pre-wait work overlap this kernel's tail; it still waits for
  // this grid's completion in griddepcontrol.wait before it reads anything written here.
  launch_dependents();
  if (splits == 1 || first_tile >= tiles) return;

  __threadfence();  // every partial of this warp before the arrivals that count it
  __syncwarp();
  // Arrivals for up to 32 of this warp's tiles at once (lane i counts the i-th); the warp then
  // finishes each tile it arrived at last.
  for (int64_t base = first_tile; base < tiles; base += 32 * tile_stride) {
    const int64_t mine = base + lane * tile_stride;
    int arrived = -1;
    if (mine < tiles) arrived = atomicAdd(counters + mine, 1);
    __threadfence();
    unsigned last = __ballot_sync(0xffffffffu, arrived == splits - 1);
    __syncwarp();
    while (last != 0) {
      const int i = __ffs(last) - 1;
      last &= last - 1;
      const int64_t tile = base + i * tile_stride;
      // The partials of splits 0, 1, ..., S-1, added in that order (8 splits' loads at a time).
      const float* all = partials + tile * splits * kV2PartialFloats + lane * 8;
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 p0 = __ldcg(reinterpret_cast<const float4*>(all + nt * 4));
        acc[nt][0] = p0.x;
        acc[nt][1] = p0.y;
        acc[nt][2] = p0.z;
        acc[nt][3] = p0.w;
      }
      constexpr int kBatch = 8;
      for (int s0 = 1; s0 < splits; s0 += kBatch) {
        float4 p[kBatch][NT];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            p[u][nt] = s0 + u < splits ? __ldcg(reinterpret_cast<const float4*>(
                                             all + (s0 + u) * kV2PartialFloats + nt * 4))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (s0 + u >= splits) break;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            acc[nt][0] += p[u][nt].x;
            acc[nt][1] += p[u][nt].y;
            acc[nt][2] += p[u][nt].z;
            acc[nt][3] += p[u][nt].w;
          }
        }
      }
      if (lane == i) counters[tile] = 0;  // every arrival of this launch has been counted
      store_tile(tile, acc);
    }
  }
}

size_t v2_smem_bytes(int nt, int slab_chunks) {
  return kV2RingBytes + static_cast<size_t>(nt) * 8 * (slab_chunks * 64 + 8) * 2;
}

template <int NT, typename TY>
cudaError_t launch_v2_rows(TY* y, const uint16_t* x, const uint8_t* q, const float* scale, int rows,
                           int64_t m, int64_t k, bool accumulate, const Fp8V2Plan& p,
                           const Fp8V2Workspace& ws, cudaStream_t s) {
  static const cudaError_t configured = [] {
    const cudaError_t e = cudaFuncSetAttribute(
        fp8_matmul_v2_kernel<NT, TY>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(v2_smem_bytes(NT, kV2MaxSlabChunks)));
    if (e != cudaSuccess) return e;
    // All shared memory for the carveout, so that kV2BlocksPerSm blocks fit on an SM.
    return cudaFuncSetAttribute(fp8_matmul_v2_kernel<NT, TY>,
                                cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  }();
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned>(p.splits * p.groups)), block(kV2Warps * 32);
  return launch_pdl(fp8_matmul_v2_kernel<NT, TY>, grid, block, v2_smem_bytes(NT, p.slab_chunks), s,
                    y, x, q, scale, rows, m, k, accumulate, static_cast<int>(p.splits), p.chunks,
                    static_cast<int>(p.slab_chunks), ws.partials, ws.counters);
}

template <typename TY>
cudaError_t launch_fp8_matmul_v2(TY* y, const uint16_t* x, const uint8_t* q, const float* scale,
                                 int64_t n, int64_t m, int64_t k, bool accumulate,
                                 const Fp8V2Workspace& ws, cudaStream_t s) {
  const Fp8V2Plan p = fp8_v2_plan(m, k, ws.num_sms);
  if (p.splits > 1 && (ws.partials == nullptr || ws.counters == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // 16 rows per launch (the same plan for every launch); every launch streams the weights.
  for (int64_t r0 = 0; r0 < n; r0 += 16) {
    const int rows = static_cast<int>(n - r0 < 16 ? n - r0 : 16);
    TY* yr = y + r0 * m;
    const uint16_t* xr = x + r0 * k;
    const cudaError_t e =
        rows <= 8 ? launch_v2_rows<1>(yr, xr, q, scale, rows, m, k, accumulate, p, ws, s)
                  : launch_v2_rows<2>(yr, xr, q, scale, rows, m, k, accumulate, p, ws, s);
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

Fp8V2Plan fp8_v2_plan(int64_t m, int64_t k, int num_sms) {
  Fp8V2Plan best;
  const int64_t tiles = (m + 15) / 16, chunks = (k + 63) / 64;
  best.chunks = chunks;
  if (tiles <= 0 || chunks <= 0) return best;
  const int64_t wave = static_cast<int64_t>(kV2BlocksPerSm) * (num_sms > 0 ? num_sms : 1);
  const int64_t groups_max = (tiles + kV2Warps - 1) / kV2Warps;
  const int64_t need = (chunks + kV2MaxSlabChunks - 1) / kV2MaxSlabChunks;
  const int64_t s_max = std::min(chunks, std::max<int64_t>(kV2MaxPlanSplits, need));
  // Cost: chunks of the busiest warp, times 1 + 16 S / k for the split partials (at 16 rows a
  // tile's partial is 1 KB per split against 16 x 64 bytes per chunk). Ties keep fewer splits.
  int64_t best_cost = -1;
  for (int64_t sp = need; sp <= s_max; ++sp) {
    const int64_t per = (chunks + sp - 1) / sp;
    if (per > kV2MaxSlabChunks) continue;
    const int64_t groups = std::min(groups_max, std::max<int64_t>(1, wave / sp));
    const int64_t per_warp = (tiles + groups * kV2Warps - 1) / (groups * kV2Warps);
    const int64_t cost = per_warp * per * (k + (sp > 1 ? 16 * sp : 0));
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best.splits = sp;
      best.groups = groups;
      best.slab_chunks = per;
    }
  }
  if (best.splits > 1) {
    best.partial_floats = tiles * best.splits * kV2PartialFloats;
    best.counters = tiles;
  }
  return best;
}

cudaError_t fp8_matmul_v2(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                          int64_t m, int64_t k, bool accumulate, const Fp8V2Workspace& ws,
                          cudaStream_t s) {
  if (n <= 0 || m <= 0) return cudaSuccess;
  const auto* xb = static_cast<const uint16_t*>(x);
  if (y.t == Elem::kBF16) {
    return launch_fp8_matmul_v2(static_cast<__nv_bfloat16*>(y.p), xb, q, scale, n, m, k, accumulate,
                                ws, s);
  }
  if (y.t == Elem::kF32) {
    return launch_fp8_matmul_v2(static_cast<float*>(y.p), xb, q, scale, n, m, k, accumulate, ws, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bs::cuda
