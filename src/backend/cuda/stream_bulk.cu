// Weight-streaming skinny GEMM with bulk copies (stream_gemm.h variants 4 and 5; issue 17): the
// same product as stream_gemm.cu, y[r, j] (+)= sum_c x[r, c] w[j, c] (+ bias[j]), but the weights
// arrive through the Hopper bulk-copy engine instead of 16-byte cp.async per lane.
//
// Why: the cp.async kernels stream the large matrices at 3.5-3.6 TB/s where cuBLASLt reaches
// 4.0-4.2 (docs/BENCHMARKS.md, session 10), and every lane spends instructions and registers on
// address arithmetic and waits. Here one producer warp keeps S stages in flight per block, each
// stage one bulk copy per weight row (KC k-elements, contiguous in memory) and per x row, all
// completing on one mbarrier (expected bytes); four consumer warps read their mma.sync fragments
// from shared memory and release the stage on a second mbarrier. One block per SM, persistent:
// block b streams tiles b, b + G, ... back to back, the ring running on across tile ends.
//
// Layout of a stage: 16 weight rows, then NT * 8 x rows, each KC * 2 bytes padded by 64 so that
// the 16-byte fragment reads of a quarter warp (rows g, g + 1; lanes t = 0..3) hit every bank once.
// Consumer warp w takes the 32-wide sub-chunks w, w + 4, ... of each stage with the k permutation
// of stream_gemm.cu (lane (g, t) holds k-elements 8t..8t+7 of rows g and g + 8: two k16 steps).
// A row's arithmetic depends on k, KC and the warp order only, never on n (rows are mma columns,
// which never mix): a 1-row decode equals row 0 of a 16-row verify bit for bit. x rows n..NT*8-1
// are zero in every stage; rows past m and k-elements past k are masked, not copied.
//
// More than 8 rows with k <= kMaxResidentK (not SwiGLU): x's rows are copied whole, once, into
// shared memory (x resident) and the stages carry weights only, so L2 hands each block x once
// instead of once a tile; the consumers read the same values in the same order (the same bits).
//
// PDL: the first S stages' weight copies are issued before griddep_wait (weights do not depend on
// the kernel before), their x copies after it; the stage's barrier waits for both.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/stream_gemm.h"

namespace bs::cuda {
namespace {

constexpr int kConsumers = 4;  // consumer warps; one producer warp more
constexpr int kSub = 32;       // k-elements a consumer warp takes per step (4 lanes x 8)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// Makes the barriers' initialization visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The producer's arrival, announcing `bytes` of copies that complete on this barrier.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// bulk-copy engine; completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// Synchronizes the consumer warps only (the producer never waits here).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

// The x operand as the kernel reads it: plain rows (kRows), rows whose RMSNorm the kernel applies
// (kRmsNormed: x [n, k] and the norm's F32 weights), or the SwiGLU of a fused gate/up projection
// (kSwiglu: x = gate_up [n, 2k], the operand silu(gate) * up).
struct BulkX {
  const __nv_bfloat16* p = nullptr;
  const float* norm_w = nullptr;
  float eps = 0.0f;
};

// x resident (XR): the block copies x's rows once, whole, into shared memory instead of a chunk
// of them with every stage: at 16 rows the per-stage copies move as many bytes from L2 as the
// weights do, which is what held every earlier 16-row stream kernel back. For k up to this.
constexpr int kMaxResidentK = 4096;

template <int KC, int S, int NT, StreamX XS, bool XR>
struct BulkLayout {
  static constexpr int kRowBytes = KC * 2 + 64;
  static constexpr int kXRows = XR ? 0 : NT * 8 * (XS == StreamX::kSwiglu ? 2 : 1);  // gate, up
  static constexpr int kNormOffset = (16 + kXRows) * kRowBytes;                      // in a stage
  static constexpr int kNormBytes = XS == StreamX::kRmsNormed ? KC * 4 : 0;  // F32 norm weights
  static constexpr int kStageBytes = kNormOffset + kNormBytes;
  static constexpr int kXResRowBytes = kMaxResidentK * 2 + 64;  // padded as kRowBytes
  static constexpr size_t kXResBytes = XR ? size_t{NT} * 8 * kXResRowBytes : 0;
  static constexpr size_t kXResOffset = size_t{S} * kStageBytes;
  static constexpr int kRedFloats = 2 * kConsumers * NT * 4 * 32;  // two tiles' partials
  static constexpr int kSsFloats = XS == StreamX::kRmsNormed ? kConsumers * NT * 8 : 0;
  static constexpr size_t kBarOffset =
      kXResOffset + kXResBytes + (kRedFloats + kSsFloats) * sizeof(float);
  static constexpr size_t kBytes = kBarOffset + (2 * S + 1) * sizeof(uint64_t);
  static_assert(!XR || XS != StreamX::kSwiglu, "gate and up rows are never resident");
  static_assert(KC % (kSub * kConsumers) == 0, "a stage splits evenly over the consumer warps");
  static_assert(kStageBytes % 16 == 0 && kBarOffset % 8 == 0, "alignment");
  static_assert(kBytes <= 232448, "one block's shared memory on sm_90");
};

// 8 k-elements of x as one mma operand piece (4 words of two BF16 each).
__device__ __forceinline__ uint4 ld_shared16(const unsigned char* p) {
  return *reinterpret_cast<const uint4*>(p);
}
// kRmsNormed: bf16(x * g) for 8 elements, and their squares added to ss (in element order).
__device__ __forceinline__ uint4 scale_by_norm_weights(uint4 raw, const float* g, float& ss) {
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float lo = bf16_lo(in[e]), hi = bf16_hi(in[e]);
    ss += lo * lo;
    ss += hi * hi;
    o[e] = pack_bf16(lo * g[2 * e], hi * g[2 * e + 1]);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}
// kSwiglu: bf16(silu(gate) * up) for 8 elements, swiglu_kernel's arithmetic (the same bits).
__device__ __forceinline__ uint4 swiglu8(uint4 gate, uint4 up) {
  const uint32_t gs[4] = {gate.x, gate.y, gate.z, gate.w}, us[4] = {up.x, up.y, up.z, up.w};
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float g0 = bf16_lo(gs[e]), g1 = bf16_hi(gs[e]);
    o[e] = pack_bf16(g0 / (1.0f + __expf(-g0)) * bf16_lo(us[e]),
                     g1 / (1.0f + __expf(-g1)) * bf16_hi(us[e]));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

template <int KC, int S, int NT, StreamX XS, bool XR, typename TY>
__global__ void __launch_bounds__((kConsumers + 1) * 32)
    stream_bulk_kernel(TY* y, BulkX x, const __nv_bfloat16* w, const float* bias, int n, int64_t m,
                       int64_t k, int64_t tiles, bool accumulate) {
  using L = BulkLayout<KC, S, NT, XS, XR>;
  constexpr bool kNorm = XS == StreamX::kRmsNormed, kSwiglu = XS == StreamX::kSwiglu;
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  unsigned char* stages = bulk_smem;  // [S][16 + kXRows][kRowBytes] (+ [KC] F32 norm weights)
  unsigned char* x_res = bulk_smem + L::kXResOffset;  // XR: [NT * 8][kXResRowBytes]
  float* red = reinterpret_cast<float*>(x_res + L::kXResBytes);
  float* ss_part = red + L::kRedFloats;  // kRmsNormed: [warp][x row] sums of squares
  uint64_t* full = reinterpret_cast<uint64_t*>(bulk_smem + L::kBarOffset);
  uint64_t* empty = full + S;
  uint64_t* x_ready = empty + S;  // XR: x's rows have landed
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t G = gridDim.x;
  const int64_t chunks = (k + KC - 1) / KC;
  const int64_t my_tiles = (tiles - 1 - blockIdx.x) / G + 1;  // grid <= tiles
  const int64_t total = my_tiles * chunks;                    // stages this block streams
  const int64_t x_stride = kSwiglu ? 2 * k : k;               // elements between x rows

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    mbar_init(x_ready, 1);
    mbar_init_fence();
  }
  // x rows n.. (of each x block) are never copied: zero in every stage, so their (discarded)
  // mma columns are finite.
  const int unused = NT * 8 - n;
  if constexpr (XR) {
    constexpr int kVecs = L::kXResRowBytes / 16;
    for (int i = threadIdx.x; i < unused * kVecs; i += blockDim.x) {
      reinterpret_cast<uint4*>(x_res + (n + i / kVecs) * L::kXResRowBytes)[i % kVecs] =
          make_uint4(0, 0, 0, 0);
    }
  } else {
    constexpr int kRowVecs = L::kRowBytes / 16;
    const int per_stage = unused * kRowVecs * (kSwiglu ? 2 : 1);
    for (int i = threadIdx.x; i < S * per_stage; i += blockDim.x) {
      const int s = i / per_stage, rest = i % per_stage, r = rest / kRowVecs;
      const int row = 16 + (r < unused ? n + r : NT * 8 + n + (r - unused));
      reinterpret_cast<uint4*>(stages + s * L::kStageBytes + row * L::kRowBytes)[rest % kRowVecs] =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  if (warp == kConsumers) {
    // ---- producer: stage i = chunk i % chunks of tile blockIdx.x + (i / chunks) G ----
    const auto stage_rows = [&](int64_t i, int64_t& tile, int64_t& k0, uint32_t& row_bytes) {
      tile = blockIdx.x + (i / chunks) * G;
      k0 = (i % chunks) * KC;
      row_bytes = static_cast<uint32_t>(min64(KC, k - k0) * 2);
    };
    const auto announce = [&](int64_t i) {
      int64_t tile, k0;
      uint32_t row_bytes;
      stage_rows(i, tile, k0, row_bytes);
      const int64_t w_rows = min64(16, m - tile * 16);
      const int64_t x_rows = XR ? 0 : static_cast<int64_t>(n) * (kSwiglu ? 2 : 1);
      const uint32_t norm_bytes = kNorm ? 2 * row_bytes : 0;
      if (lane == 0) {
        mbar_arrive_expect(&full[i % S],
                           static_cast<uint32_t>(w_rows + x_rows) * row_bytes + norm_bytes);
      }
      __syncwarp();
    };
    // Weights (and the norm's weights) before griddep_wait, x after it.
    const auto issue = [&](int64_t i, bool weights, bool xs) {
      int64_t tile, k0;
      uint32_t row_bytes;
      stage_rows(i, tile, k0, row_bytes);
      unsigned char* st = stages + (i % S) * L::kStageBytes;
      uint64_t* bar = &full[i % S];
      const int64_t r = tile * 16 + lane;
      if (weights && lane < 16 && r < m) {
        bulk_copy(st + lane * L::kRowBytes, w + r * k + k0, row_bytes, bar);
      }
      if (kNorm && weights && lane == 31) {
        bulk_copy(st + L::kNormOffset, x.norm_w + k0, 2 * row_bytes, bar);
      }
      if (!XR && xs && lane < n) {
        const __nv_bfloat16* src = x.p + lane * x_stride + k0;
        bulk_copy(st + (16 + lane) * L::kRowBytes, src, row_bytes, bar);
        if (kSwiglu) bulk_copy(st + (16 + NT * 8 + lane) * L::kRowBytes, src + k, row_bytes, bar);
      }
    };
    const int64_t first = min64(S, total);
    for (int64_t i = 0; i < first; ++i) {
      announce(i);
      issue(i, true, false);
    }
    griddep_wait();      // x comes from the kernels before
    if constexpr (XR) {  // x's rows whole, once
      if (lane == 0) mbar_arrive_expect(x_ready, static_cast<uint32_t>(n * k * 2));
      __syncwarp();
      if (lane < n) {
        bulk_copy(x_res + lane * L::kXResRowBytes, x.p + lane * x_stride,
                  static_cast<uint32_t>(k * 2), x_ready);
      }
    } else {
      for (int64_t i = 0; i < first; ++i) issue(i, false, true);
    }
    griddep_launch();
    for (int64_t i = first; i < total; ++i) {
      mbar_wait(&empty[i % S], static_cast<uint32_t>((i / S - 1) & 1));  // lap i / S - 1 released
      announce(i);
      issue(i, true, true);
    }
    return;
  }

  // ---- consumers ----
  const int g = lane >> 2, t = lane & 3;
  griddep_wait();  // y (when accumulating) comes from the kernels before
  griddep_launch();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[NT][4], ss[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    ss[nt] = 0.0f;
  }
  if constexpr (XR) mbar_wait(x_ready, 0);
  int64_t i = 0;
  for (int64_t tt = 0; tt < my_tiles; ++tt) {
    for (int64_t c = 0; c < chunks; ++c, ++i) {
      const int slot = static_cast<int>(i % S);
      mbar_wait(&full[slot], static_cast<uint32_t>((i / S) & 1));
      const unsigned char* st = stages + slot * L::kStageBytes;
      const int kc_len = static_cast<int>(min64(KC, k - c * KC));
#pragma unroll
      for (int u = 0; u < KC / (kSub * kConsumers); ++u) {
        const int sub = u * kConsumers + warp;
        if (sub * kSub >= kc_len) break;  // warp-uniform
        const int e0 = sub * kSub + 8 * t, off = e0 * 2;
        const bool live = e0 < kc_len;  // k % 8 == 0
        const uint4 wa = live ? ld_shared16(st + g * L::kRowBytes + off) : zero;
        const uint4 wb = live ? ld_shared16(st + (g + 8) * L::kRowBytes + off) : zero;
        float gw[8];  // kRmsNormed: the norm's weights of these 8 k-elements
        if constexpr (kNorm) {
          const float4* src = reinterpret_cast<const float4*>(st + L::kNormOffset + e0 * 4);
          const float4 g0 = live ? src[0] : make_float4(0, 0, 0, 0);
          const float4 g1 = live ? src[1] : make_float4(0, 0, 0, 0);
          gw[0] = g0.x, gw[1] = g0.y, gw[2] = g0.z, gw[3] = g0.w;
          gw[4] = g1.x, gw[5] = g1.y, gw[6] = g1.z, gw[7] = g1.w;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const unsigned char* xp = XR ? x_res + (g + 8 * nt) * L::kXResRowBytes + (c * KC + e0) * 2
                                       : st + (16 + g + 8 * nt) * L::kRowBytes + off;
          uint4 xr = live ? ld_shared16(xp) : zero;
          if constexpr (kNorm) {
            float sq = 0.0f;
            xr = scale_by_norm_weights(xr, gw, sq);
            if (tt == 0) ss[nt] += sq;  // the sums of squares come from the first tile only
          }
          if constexpr (kSwiglu) {
            const uint4 up =
                live ? ld_shared16(st + (16 + NT * 8 + g + 8 * nt) * L::kRowBytes + off) : zero;
            xr = swiglu8(xr, up);
          }
          mma16816(acc[nt], wa.x, wb.x, wa.y, wb.y, xr.x, xr.y);
          mma16816(acc[nt], wa.z, wb.z, wa.w, wb.w, xr.z, xr.w);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
    // The tile's end: the consumer warps' partials summed in warp order (double-buffered by tile
    // parity, so one barrier a tile suffices), then stored.
    float* part = red + (tt & 1) * kConsumers * NT * 128;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(warp * NT + nt) * 128 + e * 32 + lane] = acc[nt][e];
      acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    }
    if (kNorm && tt == 0) {  // row g + 8 nt's sum of squares over this warp's k: lanes t, in order
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float v = ss[nt];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) ss_part[warp * NT * 8 + nt * 8 + g] = v;
      }
    }
    consumers_sync();
    const int64_t j0 = (blockIdx.x + tt * G) * 16;
    for (int q = threadIdx.x; q < NT * 128; q += kConsumers * 32) {
      const int nt = q / 128, e = (q / 32) % 4, l = q % 32;
      const int col = nt * 8 + 2 * (l & 3) + (e & 1);  // x row
      const int64_t j = j0 + (l >> 2) + 8 * (e >> 1);  // output feature
      if (col >= n || j >= m) continue;
      float sum = 0.0f;
#pragma unroll
      for (int wi = 0; wi < kConsumers; ++wi) sum += part[(wi * NT + nt) * 128 + e * 32 + l];
      if constexpr (kNorm) {  // the RMSNorm's row scale, after the dot product
        float sq = 0.0f;
#pragma unroll
        for (int wi = 0; wi < kConsumers; ++wi) sq += ss_part[wi * NT * 8 + col];
        sum *= 1.0f / sqrtf(sq / static_cast<float>(k) + x.eps);
      }
      if (bias) sum += bias[j];
      TY* o = y + static_cast<int64_t>(col) * m + j;
      store(o, (accumulate ? to_float(*o) : 0.0f) + sum);
    }
  }
}

template <int KC, int S, int NT, StreamX XS, bool XR, typename TY>
cudaError_t launch_bulk_typed(TY* y, BulkX x, const __nv_bfloat16* w, const float* bias, int n,
                              int64_t m, int64_t k, bool accumulate, cudaStream_t s) {
  constexpr size_t smem = BulkLayout<KC, S, NT, XS, XR>::kBytes;
  auto* kernel = stream_bulk_kernel<KC, S, NT, XS, XR, TY>;
  // Per instantiation, once: the shared-memory opt-in and one wave (resident blocks).
  static const int wave = [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kConsumers + 1) * 32, smem);
    return std::max(1, per_sm) * std::max(1, sms);
  }();
  const int64_t tiles = (m + 15) / 16;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, wave)));
  return launch_pdl(kernel, grid, dim3((kConsumers + 1) * 32), smem, s, y, x, w, bias, n, m, k,
                    tiles, accumulate);
}

template <int KC, int S, int NT, StreamX XS, bool XR = false>
cudaError_t launch_bulk(Out y, BulkX x, const void* w, const float* bias, int n, int64_t m,
                        int64_t k, bool accumulate, cudaStream_t s) {
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  if (y.t == Elem::kF32) {
    return launch_bulk_typed<KC, S, NT, XS, XR>(static_cast<float*>(y.p), x, wb, bias, n, m, k,
                                                accumulate, s);
  }
  return launch_bulk_typed<KC, S, NT, XS, XR>(static_cast<__nv_bfloat16*>(y.p), x, wb, bias, n, m,
                                              k, accumulate, s);
}

// Up to 8 rows: x a chunk a stage (as many x bytes as n / 16 of the weights'); more: x resident
// where it fits (not for SwiGLU's two rows a row). The same arithmetic either way.
template <int KC, int S, StreamX XS>
cudaError_t launch_rows(Out y, BulkX x, const void* w, const float* bias, int n, int64_t m,
                        int64_t k, bool accumulate, cudaStream_t s) {
  if (n <= 8) return launch_bulk<KC, S, 1, XS>(y, x, w, bias, n, m, k, accumulate, s);
  if constexpr (XS != StreamX::kSwiglu) {
    if (k <= kMaxResidentK) {
      return launch_bulk<KC, S, 2, XS, true>(y, x, w, bias, n, m, k, accumulate, s);
    }
  }
  return launch_bulk<KC, S, 2, XS>(y, x, w, bias, n, m, k, accumulate, s);
}

template <StreamX XS>
cudaError_t launch_variant(Out y, BulkX x, const void* w, const float* bias, int n, int64_t m,
                           int64_t k, bool accumulate, cudaStream_t s, int variant) {
  if (variant == 5) {  // 1 KiB of a weight row a stage, 4 stages
    return launch_rows<512, 4, XS>(y, x, w, bias, n, m, k, accumulate, s);
  }
  // 512 bytes of a weight row a stage, 8 stages
  return launch_rows<256, 8, XS>(y, x, w, bias, n, m, k, accumulate, s);
}

}  // namespace

cudaError_t stream_bulk_gemm(Out y, const void* x, const void* w, const float* bias, int n,
                             int64_t m, int64_t k, bool accumulate, cudaStream_t s, int variant) {
  return launch_variant<StreamX::kRows>(y, {static_cast<const __nv_bfloat16*>(x)}, w, bias, n, m, k,
                                        accumulate, s, variant);
}

bool stream_fuses(int variant) { return variant == 4 || variant == 5; }

cudaError_t stream_gemm_fused(Out y, StreamX kind, const void* x, const float* norm_w, float eps,
                              const void* w, const float* bias, int64_t n, int64_t m, int64_t k,
                              bool accumulate, cudaStream_t s, int variant) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const bool norm_ok = kind != StreamX::kRmsNormed ||
                       (norm_w != nullptr && reinterpret_cast<uintptr_t>(norm_w) % 16 == 0);
  if (!stream_fuses(variant) || !stream_gemm_supported(n, k, x, w) || !norm_ok ||
      (y.t != Elem::kF32 && y.t != Elem::kBF16)) {
    return cudaErrorInvalidValue;
  }
  const BulkX bx{static_cast<const __nv_bfloat16*>(x), norm_w, eps};
  const int ni = static_cast<int>(n);
  switch (kind) {
    case StreamX::kRmsNormed:
      return launch_variant<StreamX::kRmsNormed>(y, bx, w, bias, ni, m, k, accumulate, s, variant);
    case StreamX::kSwiglu:
      return launch_variant<StreamX::kSwiglu>(y, bx, w, bias, ni, m, k, accumulate, s, variant);
    default:
      return launch_variant<StreamX::kRows>(y, bx, w, bias, ni, m, k, accumulate, s, variant);
  }
}

}  // namespace bs::cuda
