// Weight-streaming skinny GEMMs with bulk copies (issue 17): stream_gemm.h variants 4-9 (BF16
// weights, y[r, j] (+)= sum_c x[r, c] w[j, c] (+ bias[j]), plain or with x's RMSNorm / SwiGLU
// fused) and the FP8 weight-only product's bulk kernel (kernels.h, fp8_bulk_matmul), the weights
// arriving through the Hopper bulk-copy engine instead of 16-byte loads per lane.
//
// Why: the per-lane kernels stream the large matrices at 3.5-3.6 TB/s (BF16) and 1.8-2.9 TB/s
// (FP8, 16 rows) where cuBLASLt's BF16 GEMMs reach 4.0-4.2 (docs/BENCHMARKS.md, sessions 10, 18).
// Here one producer warp keeps S stages in flight per block, each stage one bulk copy per weight
// row (KC k-elements, contiguous in memory) and per x row, all completing on one mbarrier
// (expected bytes); CW consumer warps read their mma.sync fragments from shared memory and
// release the stage on a second mbarrier. Persistent, one wave: block b streams tiles b, b + G,
// ... back to back, the ring running on across tile ends.
//
// A stage: 16 weight rows, then (x not resident) the x rows and (RMSNorm) the norm's F32 weights
// of the chunk; rows padded so that the 16-byte fragment reads of a quarter warp (rows g, g + 1,
// lanes t = 0..3) hit every bank once. Consumer warp w takes the sub-chunks w, w + CW, ... of each
// stage with the k permutation of stream_gemm.cu / fp8_matmul.cu (lane (g, t) holds consecutive
// k-elements of rows g and g + 8: 8 BF16 = two k16 steps, or 16 FP8 codes = four). A row's
// arithmetic depends on k, KC, CW and the warp order only, never on n (rows are mma columns,
// which never mix): a 1-row decode equals row 0 of a 16-row verify bit for bit. The sub-chunk
// split makes variants 4, 5 and 7 compute exactly what cp.async variant 1 does (4 warps, 32-wide
// chunks w, w + 4, ...), variant 6 (8 consumer warps) what variant 0 does, and the FP8 kernel
// exactly what fp8_matmul_kernel (v1) does (8 warps, 64-wide chunks w, w + 8, ...); the tests
// hold them to those bits. x rows n..NT*8-1 read as zero; rows past m and k-elements past k are
// masked, not copied.
//
// x resident: where n rows of k fit beside the ring (most of shared memory: 16 rows of k <= 4096,
// 5-6 rows of k = 12288), x's rows live in shared memory for the whole launch and the stages
// carry weights only, so L2 hands each block x once instead of once a tile (at 16 rows the
// per-stage copies move as many bytes as BF16 weights and twice as many as FP8 ones). The fused
// forms derive x there once, in a prologue of the consumer warps (x * g, silu(gate) * up; each
// row's sum of squares in an order fixed by k alone), instead of per stage, lane and mma column.
// Otherwise a stage carries x's chunk and, beyond 8 rows, 32 output features (two m16 tiles)
// that share it; SwiGLU has no such form. The consumers read the same values in the same order
// every way. A configuration's stage count is what fits in shared memory, up to its maximum.
//
// Variants 8 and 9 split k into spans (stream_gemm.h, StreamSplitSpace): a block per (tile,
// span), the tile's last block adding the spans' partial sums from global memory in span order;
// x resident a span at a time. Within a span the arithmetic is variant 1's (as 4, 5 and 7).
//
// PDL: the first S stages' weight copies are issued before griddep_wait (weights do not depend on
// the kernel before), x after it; a stage's barrier waits for both.
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/fp8_fragments.cuh"
#include "backend/cuda/stream_gemm.h"

namespace bs::cuda {
namespace {

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
// Waits until the barrier's phase with this parity has completed. A wait of this many polls
// (each may suspend the thread up to a hardware limit) means the pipeline's bookkeeping is
// broken, not a slow copy (a stage lands within microseconds; a kernel preempted by another
// process does not poll): trap, so that the launch fails with an error instead of hanging.
constexpr uint32_t kMaxPolls = 1u << 22;
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0, polls = 0;
  do {
    if (++polls == kMaxPolls) __trap();
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
// Asks L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) ahead; no completion to wait for.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// Synchronizes the CW consumer warps only (the producer never waits here).
template <int CW>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(CW * 32) : "memory");
}
// Named barriers between the consumers and the split variants' epilogue warp, a pair each (unit
// parity): part holds a unit's partials (the consumers arrive, the epilogue warp waits), part is
// free again (the other way round). Arrival does not wait; it orders the arriving threads'
// shared-memory writes before the waiting threads' reads.
constexpr int kFullBar = 2, kFreeBar = 4;
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
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

// set_stream_l2_prefetch's budget (bytes a launch), read when a kernel is launched (captured
// graphs keep the value they were captured with).
int64_t g_l2_prefetch_bytes = 0;
// set_stream_resident_rows: plain products (kRows) of fewer rows stream x with the weights.
int g_resident_rows = kStreamResidentRows;

// One kernel configuration and its shared-memory layout (bytes). KC k-elements of each weight
// row a stage; S_MAX stages (fewer where shared memory ends: S); MT m16 tiles (16 output features
// each) a stage; NT m16n8 column tiles (8 x rows each); CW consumer warps; FP8 or BF16 weights;
// the x form; x resident (XR: x's rows, derived, in shared memory for the whole launch, the
// stages carrying weights only) or a chunk a stage beside the weights; EW: units end in an
// epilogue warp of its own (the k-split layouts, x resident).
template <int KC_, int S_MAX, int MT_, int NT_, int CW_, bool FP8_, StreamX XS_, bool XR_,
          bool EW_ = false>
struct Bulk {
  static constexpr int KC = KC_, MT = MT_, NT = NT_, CW = CW_;
  static constexpr bool kFp8 = FP8_, kXR = XR_;
  static constexpr bool kNorm = XS_ == StreamX::kRmsNormed, kSwiglu = XS_ == StreamX::kSwiglu;
  static constexpr int kWBytes = kFp8 ? 1 : 2;  // bytes a weight
  static constexpr int kSub = kFp8 ? 64 : 32;   // k-elements a warp step: 4 lanes x 16 / x 8
  static constexpr int kWRows = 16 * MT;        // weight rows a stage (output features a tile)
  // Row paddings that spread a quarter warp's 16-byte fragment reads over all banks: rows g and
  // g + 1 half a bank line apart (lanes t 16 bytes apart), or, for x under FP8 weights (lanes t
  // 32 bytes apart, two reads each), 16 bytes apart.
  static constexpr int kXPad = kFp8 ? 16 : 64;
  static constexpr int kWRowBytes = KC * kWBytes + 64;
  static constexpr int kXRowBytes = KC * 2 + kXPad;
  static constexpr int kXRows = kXR ? 0 : NT * 8;       // x rows a stage
  static constexpr int kXOffset = kWRows * kWRowBytes;  // in a stage
  static constexpr int kNormOffset = kXOffset + kXRows * kXRowBytes;
  static constexpr bool kStageNorm = kNorm && !kXR;  // the norm's weights of the chunk
  static constexpr int kStageBytes = kNormOffset + (kStageNorm ? KC * 4 : 0);
  static constexpr int kRedFloats = 2 * CW * MT * NT * 128;  // two tiles' partials
  static constexpr int kSsFloats = kNorm ? NT * 8 : 0;       // each x row's sum of squares
  static constexpr size_t kFixedBytes =
      (kRedFloats + kSsFloats) * sizeof(float) + (2 * S_MAX + 2) * sizeof(uint64_t);
  static constexpr size_t kSmemLimit = 232448;  // one block's shared memory on sm_90
  static constexpr int kFit = static_cast<int>((kSmemLimit - kFixedBytes - 128) / kStageBytes);
  static constexpr int S = kXR || kFit >= S_MAX ? S_MAX : kFit;
  // [stages][partials][row sums of squares][barriers, flag][XR: x rows]: x last, so that a launch
  // asks for the shared memory its n rows need (kXResOffset + n * x_stride(k)), not all of it (a
  // smaller request leaves L1 its share and lets the next kernel's blocks start beside this one's).
  static constexpr size_t kRedOffset = size_t{S} * kStageBytes;
  static constexpr size_t kBarOffset = kRedOffset + (kRedFloats + kSsFloats) * sizeof(float);
  static constexpr size_t kXResOffset =
      (kBarOffset + (2 * S + 2) * sizeof(uint64_t) + 127) / 128 * 128;
  static constexpr size_t kXResBytes = kXR ? (kSmemLimit - kXResOffset) / 128 * 128 : 0;
  static constexpr size_t kBytes = kXResOffset + kXResBytes;  // the most a launch asks for
  // The split layouts finish their units in an epilogue warp of its own, so that the consumers
  // never wait for the split exchange (fence, counter, loads).
  static constexpr bool kEW = EW_ && kXR;
  // A split unit's slot (stream_gemm.h, StreamSplitSpace): its partial sums (kWRows features x
  // 16 rows, in the consumers' fragment order), then its span's 16 sums of squares.
  static constexpr int kSsOffset = kWRows * 16;
  static constexpr int kSlotFloats = kSsOffset + 16;
  static constexpr int kThreads = (CW + 1 + (kEW ? 1 : 0)) * 32;
  // Blocks an SM the registers must allow: two for the 16-feature BF16 layouts of four consumer
  // warps, whose shared memory lets two share an SM (the fused forms' prologue would take ~200
  // registers a thread, which leaves room for one block of 192 threads; without spills).
  static constexpr int kMinBlocks = MT == 1 && !kFp8 && CW == 4 ? 2 : 1;
  static_assert(KC % (kSub * CW) == 0, "a stage splits evenly over the consumer warps");
  static_assert(kStageBytes % 16 == 0 && kBarOffset % 8 == 0, "alignment");
  static_assert(S >= 2 && kBytes <= kSmemLimit, "at least two stages fit");
  static_assert(!kXR || kSmemLimit > kXResOffset, "room for resident rows");
  static_assert(kWRows <= 32, "one producer lane a weight row");
  static_assert(kXR || !kSwiglu, "SwiGLU is derived once, into resident rows");
  // Resident x rows' stride in bytes (a row of `span` k-elements: k, or a split variant's span):
  // rows g and g + 1 padded apart as in a stage.
  __host__ __device__ static constexpr int64_t x_stride(int64_t span) {
    return (span * 2 + 127) / 128 * 128 + kXPad;
  }
  // Whether n rows of `span` fit.
  static constexpr bool fits(int64_t n, int64_t span) {
    return kXR && n * x_stride(span) <= static_cast<int64_t>(kXResBytes);
  }
  // The shared memory a launch of n rows of `span` asks for.
  static size_t launch_bytes(int64_t n, int64_t span) {
    return kXR ? kXResOffset + static_cast<size_t>(n * x_stride(span)) : kXResOffset;
  }
};

__device__ __forceinline__ uint4 ld_shared16(const unsigned char* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void st_shared16(unsigned char* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}
// kRmsNormed: bf16(x * g) for 8 elements.
__device__ __forceinline__ uint4 scale_by_norm_weights(uint4 raw, const float* g) {
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    o[e] = pack_bf16(bf16_lo(in[e]) * g[2 * e], bf16_hi(in[e]) * g[2 * e + 1]);
  return make_uint4(o[0], o[1], o[2], o[3]);
}
// Adds the squares of 8 BF16 elements to ss, in element order.
__device__ __forceinline__ void add_squares(uint4 raw, float& ss) {
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float lo = bf16_lo(in[e]), hi = bf16_hi(in[e]);
    ss += lo * lo;
    ss += hi * hi;
  }
}
// kSwiglu: bf16(silu(gate) * up) for 8 elements, swiglu_kernel's arithmetic (the same bits).
__device__ __forceinline__ uint4 swiglu8(uint4 gate, uint4 up) {
  const uint32_t gs[4] = {gate.x, gate.y, gate.z, gate.w}, us[4] = {up.x, up.y, up.z, up.w};
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    o[e] = pack_bf16(swiglu_f(bf16_lo(gs[e]), bf16_lo(us[e])),
                     swiglu_f(bf16_hi(gs[e]), bf16_hi(us[e])));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The consumers' prologue, once a launch, over the block's k-elements [k_lo, k_lo + len) (all of
// k, or a split variant's span): each x row's sum of squares there (kRmsNormed) into row_ss, and,
// with x resident, the derived rows (x * g, or silu(gate) * up) into x_res. Consumer thread q takes
// the 8-element vectors q, q + T, ... of every row (T consumer threads) and sums its squares in
// that order; row r's T partials are then summed by one warp (lane l: partials l, l + 32, ...,
// then a butterfly). Neither depends on n or on the row's place in the launch. Loads go kBatch
// at a time so that their latencies overlap.
template <class C>
__device__ __forceinline__ void derive_x(const BulkX& x, int n, int64_t k, int64_t k_lo,
                                         int64_t len, int64_t xs, unsigned char* x_res,
                                         float* partials, float* row_ss) {
  constexpr int T = C::CW * 32, kBatch = 8;
  const int q = threadIdx.x, warp = q >> 5, lane = q & 31;
  const int64_t vecs = len / 8, per_row = (vecs + T - 1) / T, items = n * per_row;
  const int64_t x_cols = C::kSwiglu ? 2 * k : k;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float part = 0.0f;
  for (int64_t i0 = 0; i0 < items; i0 += kBatch) {
    uint4 a[kBatch], b[kBatch];
    float4 g0[kBatch], g1[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + u, r = i / per_row, v = q + (i % per_row) * T;
      const bool ok = i < items && v < vecs;
      const __nv_bfloat16* src = x.p + r * x_cols + k_lo + v * 8;
      a[u] = ok ? *reinterpret_cast<const uint4*>(src) : zero;
      if constexpr (C::kSwiglu) b[u] = ok ? *reinterpret_cast<const uint4*>(src + k) : zero;
      if constexpr (C::kNorm && C::kXR) {
        const float4* gp = reinterpret_cast<const float4*>(x.norm_w + k_lo + v * 8);
        g0[u] = ok ? gp[0] : make_float4(0, 0, 0, 0);
        g1[u] = ok ? gp[1] : make_float4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + u, r = i / per_row, v = q + (i % per_row) * T;
      if (i >= items) break;
      unsigned char* dst = x_res + r * xs + v * 16;
      if constexpr (C::kNorm) {
        add_squares(a[u], part);
        if constexpr (C::kXR) {
          const float g[8] = {g0[u].x, g0[u].y, g0[u].z, g0[u].w,
                              g1[u].x, g1[u].y, g1[u].z, g1[u].w};
          if (v < vecs) st_shared16(dst, scale_by_norm_weights(a[u], g));
        }
        if (i % per_row == per_row - 1) {  // the row's last item: its partial
          partials[r * T + q] = part;
          part = 0.0f;
        }
      }
      if constexpr (C::kSwiglu) {
        if (v < vecs) st_shared16(dst, swiglu8(a[u], b[u]));
      }
    }
  }
  if constexpr (C::kNorm) {
    consumers_sync<C::CW>();
    for (int r = warp; r < n; r += C::CW) {
      float s = 0.0f;
      for (int j = 0; j < T / 32; ++j) s += partials[r * T + j * 32 + lane];
      s = warp_sum(s);
      if (lane == 0) row_ss[r] = s;
    }
  }
  consumers_sync<C::CW>();  // x_res and row_ss complete; the partials free again
}

// Where a launch's k is split (variants 8, 9; stream_gemm.h): `splits` spans of `span`
// k-elements (the last one shorter), units of `unit_rows` output features, the slots and counters
// of StreamSplitSpace. splits == 1: span == k.
struct BulkSplit {
  int splits = 1;
  int64_t span = 0;
  int unit_rows = 0;
  float* partials = nullptr;
  unsigned* counters = nullptr;
  static BulkSplit whole(int64_t k) { return BulkSplit{1, k, 0, nullptr, nullptr}; }
};

// What finishing a unit needs: stream_bulk_kernel's operands and shared memory.
template <typename TY>
struct UnitEnd {
  TY* y;
  float eps;
  const float* w_scale;
  const float* bias;
  int n;
  int64_t m, k;
  bool accumulate;
  BulkSplit split;
  const float* row_ss;  // kRmsNormed: this block's (span's) sums of squares
  int* last_of_tile;    // split: whether this block adds the tile's spans
};

// Finishes unit `unit` (tile unit / splits, span unit % splits) from its consumer warps'
// partials part [CW][kTile], with T threads (this one: t; `sync` synchronizes them): each
// output's sum over the warps in warp order; then `release` (part may be overwritten); with a
// split, the sums (and the span's sums of squares) into the unit's slot, the arrival counted on
// the tile's counter, and only the tile's last block goes on, adding the slots in span order (a
// batch of spans' loads issued together: the L2 latency once a batch, not once a value; the
// fences: the slots written before the count, read after it); then the norm's row scale, bias,
// accumulation and y.
template <class C, int T, typename TY, class Sync, class Release>
__device__ __forceinline__ void finish_unit(const UnitEnd<TY>& u, int64_t unit, const float* part,
                                            int t, Sync sync, Release release) {
  constexpr int NT = C::NT, CW = C::CW, kTile = C::MT * NT * 128, kPer = (kTile + T - 1) / T;
  const int splits = u.split.splits;
  const int64_t tile = unit / splits, j0 = tile * C::kWRows;
  const auto col_of = [](int q) {  // x row of output q
    const int nt = (q / 128) % NT, e = (q / 32) % 4, l = q % 32;
    return nt * 8 + 2 * (l & 3) + (e & 1);
  };
  float sums[kPer], sss[kPer];  // sss: kRmsNormed, the row's sum of squares
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int q = t + e * T;
    sums[e] = sss[e] = 0.0f;
    if (q >= kTile) break;
#pragma unroll
    for (int wi = 0; wi < CW; ++wi) sums[e] += part[wi * kTile + q];
  }
  release();
  if (splits > 1) {
    float* mine = u.split.partials + unit * C::kSlotFloats;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      if (t + e * T < kTile) __stcg(mine + t + e * T, sums[e]);
    }
    if constexpr (C::kNorm) {
      for (int r = t; r < u.n; r += T) __stcg(mine + C::kSsOffset + r, u.row_ss[r]);
    }
    __threadfence();
    sync();
    if (t == 0) {
      const bool last = atomicAdd(u.split.counters + tile, 1u) + 1 == static_cast<unsigned>(splits);
      if (last) u.split.counters[tile] = 0;  // all spans counted: zero for the next launch
      __threadfence();
      *u.last_of_tile = last;
    }
    sync();
    if (!*u.last_of_tile) return;
    const float* tile_slots = u.split.partials + tile * splits * C::kSlotFloats;
    constexpr int kBatch = kPer >= 8 ? 2 : 4;
#pragma unroll
    for (int e = 0; e < kPer; ++e) sums[e] = 0.0f;
    for (int sp0 = 0; sp0 < splits; sp0 += kBatch) {
      float v[kBatch][kPer], vs[kBatch][kPer];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int q = t + e * T;
          const bool ok = sp0 + b < splits && q < kTile;
          const float* slot = tile_slots + (sp0 + b) * C::kSlotFloats;
          v[b][e] = ok ? __ldcg(slot + q) : 0.0f;
          vs[b][e] = C::kNorm && ok ? __ldcg(slot + C::kSsOffset + col_of(q)) : 0.0f;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (sp0 + b >= splits) break;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          sums[e] += v[b][e];
          sss[e] += vs[b][e];
        }
      }
    }
  } else if constexpr (C::kNorm) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      if (t + e * T < kTile) sss[e] = u.row_ss[col_of(t + e * T)];
    }
  }
#pragma unroll
  for (int ei = 0; ei < kPer; ++ei) {
    const int q = t + ei * T;
    if (q >= kTile) break;
    const int mt = q / (NT * 128), e = (q / 32) % 4, l = q % 32;
    const int col = col_of(q);                                 // x row
    const int64_t j = j0 + mt * 16 + (l >> 2) + 8 * (e >> 1);  // output feature
    if (col >= u.n || j >= u.m) continue;
    float sum = sums[ei];
    TY* o = u.y + static_cast<int64_t>(col) * u.m + j;
    // The products by __fmul_rn: nvcc contracts a product and a following add (bias,
    // accumulation) into an FMA as it sees fit per instantiation, which would make a row's bits
    // depend on the layout its row count picks.
    if constexpr (C::kNorm) {  // the RMSNorm's row scale, after the dot product
      sum = __fmul_rn(sum, 1.0f / sqrtf(sss[ei] / static_cast<float>(u.k) + u.eps));
    }
    if constexpr (C::kFp8) {  // fp8_matmul_kernel's epilogue
      const float v = __fmul_rn(sum, u.w_scale[j] * kFp8ToF16Scale);
      store(o, u.accumulate ? to_float(*o) + v : v);
      continue;
    }
    if (u.bias) sum += u.bias[j];
    store(o, (u.accumulate ? to_float(*o) : 0.0f) + sum);
  }
}

// w: BF16 [m, k] or FP8 codes [m, k] with w_scale [m] (y = w_scale[j] * sum, fp8_matmul_kernel's
// epilogue); bias F32 [m] or null (BF16 weights only). xs: resident x rows' stride (XR).
// A unit of work is a (tile, span) pair, unit u = tile * splits + span; the grid is a multiple of
// splits, so that a block's units all have its span (blockIdx.x % splits): x's span is resident,
// or derived, once a launch.
template <class C, typename TY>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    stream_bulk_kernel(TY* y, BulkX x, const unsigned char* w, const float* w_scale,
                       const float* bias, int n, int64_t m, int64_t k, int64_t tiles,
                       int64_t l2_stages, int64_t xs, bool accumulate, BulkSplit split) {
  constexpr int S = C::S, MT = C::MT, NT = C::NT, CW = C::CW, KC = C::KC;
  constexpr int kTile = MT * NT * 128;  // one consumer warp's accumulators (a unit's partials)
  // x rows the producer copies (kRows), or that the consumers derive into x_res (the others).
  constexpr bool kDerived = C::kNorm || C::kSwiglu;
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  unsigned char* stages = bulk_smem;                  // [S][kStageBytes]
  unsigned char* x_res = bulk_smem + C::kXResOffset;  // XR: [n][xs]
  float* red = reinterpret_cast<float*>(bulk_smem + C::kRedOffset);
  float* row_ss = red + C::kRedFloats;  // kRmsNormed: [x row] sums of squares
  uint64_t* full = reinterpret_cast<uint64_t*>(bulk_smem + C::kBarOffset);
  uint64_t* empty = full + S;
  uint64_t* x_ready = empty + S;                            // XR, kRows: x's rows have landed
  int* last_of_tile = reinterpret_cast<int*>(x_ready + 1);  // split: this block adds the spans
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t G = gridDim.x;  // a multiple of split.splits
  // launch_bulk_typed splits only the resident layouts with an epilogue warp; a unit's partial
  // sums fit its slot in every layout.
  static_assert(kTile <= C::kSsOffset, "a split slot holds a unit's sums");
  const int splits = split.splits;
  const int64_t k_lo = (blockIdx.x % splits) * split.span;  // this block's k-elements
  const int64_t k_len = min64(split.span, k - k_lo);
  const int64_t chunks = (k_len + KC - 1) / KC;
  const int64_t units = tiles * splits;
  const int64_t my_units = (units - 1 - blockIdx.x) / G + 1;  // grid <= units
  const int64_t total = my_units * chunks;                    // stages this block streams
  // What finish_unit needs of the operands and shared memory.
  const UnitEnd<TY> ue{y, x.eps, w_scale, bias, n, m, k, accumulate, split, row_ss, last_of_tile};

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CW);
    }
    mbar_init(x_ready, 1);
    mbar_init_fence();
  }
  // A stage's x rows n.. are never copied: zero, so their (discarded) columns are finite.
  // (Resident rows past n are never read.)
  if constexpr (!C::kXR) {
    constexpr int kVecs = C::kXRowBytes / 16;
    const int per_stage = (NT * 8 - n) * kVecs;
    for (int i = threadIdx.x; i < S * per_stage; i += blockDim.x) {
      const int s = i / per_stage, rest = i % per_stage;
      reinterpret_cast<uint4*>(stages + s * C::kStageBytes + C::kXOffset +
                               (n + rest / kVecs) * C::kXRowBytes)[rest % kVecs] =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  if (warp == CW) {
    // ---- producer: stage i = chunk i % chunks of unit blockIdx.x + (i / chunks) G ----
    struct Stage {
      int64_t tile, k0;
      uint32_t len;  // k-elements of the chunk
    };
    const auto stage = [&](int64_t i) {
      const int64_t k0 = k_lo + (i % chunks) * KC;
      return Stage{(blockIdx.x + (i / chunks) * G) / splits, k0,
                   static_cast<uint32_t>(min64(KC, k_lo + k_len - k0))};
    };
    const auto announce = [&](int64_t i) {
      const Stage st = stage(i);
      const int64_t w_rows = min64(C::kWRows, m - st.tile * C::kWRows);
      const int64_t x_rows = C::kXR ? 0 : n;
      const uint32_t bytes = static_cast<uint32_t>(w_rows) * st.len * C::kWBytes +
                             static_cast<uint32_t>(x_rows) * st.len * 2 +
                             (C::kStageNorm ? st.len * 4 : 0);
      if (lane == 0) mbar_arrive_expect(&full[i % S], bytes);
      __syncwarp();
    };
    // Weights (and the norm's weights) before griddep_wait, x after it.
    const auto issue = [&](int64_t i, bool weights, bool xs_too) {
      const Stage st = stage(i);
      unsigned char* dst = stages + (i % S) * C::kStageBytes;
      uint64_t* bar = &full[i % S];
      const int64_t r = st.tile * C::kWRows + lane;
      if (weights && lane < C::kWRows && r < m) {
        bulk_copy(dst + lane * C::kWRowBytes, w + (r * k + st.k0) * C::kWBytes, st.len * C::kWBytes,
                  bar);
      }
      if (C::kStageNorm && weights && lane == 31) {
        bulk_copy(dst + C::kNormOffset, x.norm_w + st.k0, st.len * 4, bar);
      }
      if (!C::kXR && xs_too && lane < n) {
        bulk_copy(dst + C::kXOffset + lane * C::kXRowBytes, x.p + lane * k + st.k0, st.len * 2,
                  bar);
      }
    };
    const int64_t first = min64(S, total);
    for (int64_t i = 0; i < first; ++i) {
      announce(i);
      issue(i, true, false);
    }
    // The next l2_stages stages' weights into L2 while the kernels before still run (their DRAM
    // time is mostly idle: attention reads a few MB), so the ring later refills from L2.
    for (int64_t i = first; i < min64(total, first + l2_stages); ++i) {
      const Stage st = stage(i);
      const int64_t r = st.tile * C::kWRows + lane;
      if (lane < C::kWRows && r < m) {
        prefetch_l2(w + (r * k + st.k0) * C::kWBytes, st.len * C::kWBytes);
      }
    }
    griddep_wait();                       // x comes from the kernels before
    if constexpr (C::kXR && !kDerived) {  // x's rows (of the block's span) whole, once
      if (lane == 0) mbar_arrive_expect(x_ready, static_cast<uint32_t>(n * k_len * 2));
      __syncwarp();
      if (lane < n) {
        bulk_copy(x_res + lane * xs, x.p + lane * k + k_lo, static_cast<uint32_t>(k_len * 2),
                  x_ready);
      }
    } else if constexpr (!C::kXR) {
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

  if constexpr (C::kEW) {
    if (warp == CW + 1) {
      // ---- epilogue warp: finishes unit tt once the consumers have left its partials ----
      griddep_wait();  // y, when accumulating, comes from the kernels before
      for (int64_t tt = 0; tt < my_units; ++tt) {
        named_sync(kFullBar + (tt & 1), (CW + 1) * 32);
        finish_unit<C, 32>(
            ue, blockIdx.x + tt * G, red + (tt & 1) * CW * kTile, lane, [] { __syncwarp(); },
            [&] {  // the consumers write part again at unit tt + 2
              if (tt + 2 < my_units) named_arrive(kFreeBar + (tt & 1), (CW + 1) * 32);
            });
      }
      return;
    }
  }

  // ---- consumers ----
  const int g = lane >> 2, t = lane & 3;
  griddep_wait();  // x, and y when accumulating, come from the kernels before
  griddep_launch();
  if constexpr (kDerived) derive_x<C>(x, n, k, k_lo, k_len, xs, x_res, red, row_ss);
  if constexpr (C::kXR && !kDerived) mbar_wait(x_ready, 0);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[MT][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
  }
  int64_t i = 0;
  for (int64_t tt = 0; tt < my_units; ++tt) {
    for (int64_t c = 0; c < chunks; ++c, ++i) {
      const int slot = static_cast<int>(i % S);
      mbar_wait(&full[slot], static_cast<uint32_t>((i / S) & 1));
      const unsigned char* st = stages + slot * C::kStageBytes;
      const int kc_len = static_cast<int>(min64(KC, k_len - c * KC));
#pragma unroll
      for (int u = 0; u < KC / (C::kSub * CW); ++u) {
        const int sub = u * CW + warp;
        if (sub * C::kSub >= kc_len) break;  // warp-uniform
        // This lane's k-elements: e0.. of the chunk (8 BF16 or 16 FP8 codes).
        const int e0 = sub * C::kSub + (C::kSub / 4) * t;
        const bool live = e0 < kc_len;  // k % 8 == 0 (BF16), k % 16 == 0 (FP8)
        uint4 wa[MT], wb[MT];           // weight rows mt * 16 + g and + 8
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const unsigned char* wp = st + (mt * 16 + g) * C::kWRowBytes + e0 * C::kWBytes;
          wa[mt] = live ? ld_shared16(wp) : zero;
          wb[mt] = live ? ld_shared16(wp + 8 * C::kWRowBytes) : zero;
        }
        // The norm's weights of this lane's k-elements (kRmsNormed, x a chunk a stage).
        constexpr int kPer = C::kSub / 4;  // k-elements a lane: 8 (BF16 weights) or 16 (FP8)
        float gw[kPer];
        if constexpr (C::kStageNorm) {
          const float4* src = reinterpret_cast<const float4*>(st + C::kNormOffset + e0 * 4);
#pragma unroll
          for (int q = 0; q < kPer / 4; ++q) {
            const float4 v = live ? src[q] : make_float4(0, 0, 0, 0);
            gw[4 * q] = v.x, gw[4 * q + 1] = v.y, gw[4 * q + 2] = v.z, gw[4 * q + 3] = v.w;
          }
        }
        // x's operand: 8 k-elements (BF16 pairs) of x row `row` from the lane's element e0 + e:
        // resident (as derived), or from the stage (scaled by the norm's weights here).
        const auto x_piece = [&](int row, int e) {
          if constexpr (C::kXR) {
            return live && row < n ? ld_shared16(x_res + row * xs + (c * KC + e0 + e) * 2) : zero;
          } else {
            const uint4 xr =
                live ? ld_shared16(st + C::kXOffset + row * C::kXRowBytes + (e0 + e) * 2) : zero;
            if constexpr (C::kStageNorm) return scale_by_norm_weights(xr, gw + e);
            return xr;
          }
        };
        uint32_t ha[MT][8], hb[MT][8];  // FP8: the weight codes as FP16 pairs
        if constexpr (C::kFp8) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            unpack16(wa[mt], ha[mt]);
            unpack16(wb[mt], hb[mt]);
          }
        }
        // Each x piece once, for every m16 tile of the stage (the tiles' sums never mix).
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (C::kFp8) {
            const uint4 x0 = x_piece(g + 8 * nt, 0), x1 = x_piece(g + 8 * nt, 8);
            uint32_t hx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int q = 0; q < 8; ++q) hx[q] = bf16x2_to_f16x2(hx[q]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                mma_f16(acc[mt][nt], ha[mt][2 * q], hb[mt][2 * q], ha[mt][2 * q + 1],
                        hb[mt][2 * q + 1], hx[2 * q], hx[2 * q + 1]);
              }
            }
          } else {
            const uint4 xr = x_piece(g + 8 * nt, 0);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma16816(acc[mt][nt], wa[mt].x, wb[mt].x, wa[mt].y, wb[mt].y, xr.x, xr.y);
              mma16816(acc[mt][nt], wa[mt].z, wb[mt].z, wa[mt].w, wb[mt].w, xr.z, xr.w);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
    // The unit's end: the consumer warps' partials into part (double-buffered by unit parity),
    // then summed and stored by finish_unit: by the consumers themselves (one barrier a unit
    // suffices), or, in the split layouts, by the epilogue warp while they go on.
    float* part = red + (tt & 1) * CW * kTile;
    if constexpr (C::kEW) {  // the epilogue warp has read part's unit tt - 2
      if (tt >= 2) named_sync(kFreeBar + (tt & 1), (CW + 1) * 32);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          part[warp * kTile + (mt * NT + nt) * 128 + e * 32 + lane] = acc[mt][nt][e];
          acc[mt][nt][e] = 0.0f;
        }
      }
    }
    if constexpr (C::kEW) {
      named_arrive(kFullBar + (tt & 1), (CW + 1) * 32);
    } else {
      consumers_sync<CW>();
      finish_unit<C, CW * 32>(
          ue, blockIdx.x + tt * G, part, threadIdx.x, [] { consumers_sync<CW>(); }, [] {});
    }
  }
}

template <class C, typename TY>
cudaError_t launch_bulk_typed(TY* y, BulkX x, const void* w, const float* w_scale,
                              const float* bias, int n, int64_t m, int64_t k, bool accumulate,
                              cudaStream_t s, BulkSplit split) {
  auto* kernel = stream_bulk_kernel<C, TY>;
  // Per instantiation, once: the shared-memory opt-in and the SM count.
  static const int sms = [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(C::kBytes));
    int dev = 0, count = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
    return std::max(1, count);
  }();
  // Only the resident layouts with an epilogue warp split, with the units split_for counted.
  if (split.splits > 1 && (C::kWRows != split.unit_rows || !C::kEW)) return cudaErrorInvalidValue;
  // One wave: the blocks resident at this launch's shared memory (x resident asks for its rows'
  // bytes only, so few rows let two blocks share an SM: twice the weight stages in flight),
  // remembered per size.
  const size_t bytes = C::launch_bytes(n, split.span);
  static std::mutex wave_mutex;
  static std::map<size_t, int> waves;  // launch bytes -> blocks
  int wave = 0;
  {
    const std::lock_guard<std::mutex> lock(wave_mutex);
    auto it = waves.find(bytes);
    if (it == waves.end()) {
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, bytes);
      it = waves.emplace(bytes, std::max(1, per_sm) * sms).first;
    }
    wave = it->second;
  }
  const int64_t tiles = (m + C::kWRows - 1) / C::kWRows;
  // A multiple of splits (a block's units share its span); blocks past the wave wait their turn
  // (no block waits for another).
  const int64_t per_wave = std::max<int64_t>(1, wave / split.splits) * split.splits;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles * split.splits, per_wave)));
  // The L2 prefetch budget (set_stream_l2_prefetch) split over the blocks, in stages.
  const int64_t stage_weight_bytes = int64_t{C::kWRows} * C::KC * C::kWBytes;
  const int64_t l2_stages = g_l2_prefetch_bytes / static_cast<int64_t>(grid.x) / stage_weight_bytes;
  return launch_pdl(kernel, grid, dim3(C::kThreads), bytes, s, y, x,
                    static_cast<const unsigned char*>(w), w_scale, bias, n, m, k, tiles, l2_stages,
                    C::x_stride(split.span), accumulate, split);
}

template <class C>
cudaError_t launch_bulk(Out y, BulkX x, const void* w, const float* w_scale, const float* bias,
                        int n, int64_t m, int64_t k, bool accumulate, cudaStream_t s,
                        BulkSplit split) {
  if (y.t == Elem::kF32) {
    return launch_bulk_typed<C>(static_cast<float*>(y.p), x, w, w_scale, bias, n, m, k, accumulate,
                                s, split);
  }
  return launch_bulk_typed<C>(static_cast<__nv_bfloat16*>(y.p), x, w, w_scale, bias, n, m, k,
                              accumulate, s, split);
}

// A split variant's split of an [m, k] product with this space (stream_gemm.h,
// stream_split_count): `splits` spans of a 64-element multiple, as even as that allows, none
// longer than `span_max`, over units of `unit_rows` features (slots of 16 floats a feature and 16
// more); {1, k} where k is one span or the space is too small for m.
BulkSplit split_for(int64_t m, int64_t k, int unit_rows, int64_t span_max,
                    const StreamSplitSpace& space) {
  int64_t splits = (k + span_max - 1) / span_max;
  const int64_t units = (m + unit_rows - 1) / unit_rows;
  const int64_t slot_floats = int64_t{unit_rows} * 16 + 16;
  if (splits <= 1 || space.partials == nullptr || space.counters == nullptr ||
      units > space.counter_count ||
      static_cast<size_t>(units * splits * slot_floats) * sizeof(float) > space.partial_bytes) {
    return BulkSplit::whole(k);
  }
  const int64_t span = ((k + splits - 1) / splits + 63) / 64 * 64;
  splits = (k + span - 1) / span;  // rounding up the span may leave the last one empty
  return BulkSplit{static_cast<int>(splits), span, unit_rows, space.partials, space.counters};
}

// x resident where its rows fit beside the ring (most of shared memory: 16 rows of k <= 4096,
// 5-6 rows of k = 12288) and, for plain rows, from set_stream_resident_rows rows up; NT = 1 up
// to 8 rows, 2 beyond. Else x a chunk a stage: 16 output features a stage up to 8 rows (x adds
// n / 16 of BF16 weights' bytes), 32 beyond (sharing each x chunk); SwiGLU, whose operand is
// derived once a launch into resident rows, then has no kernel (cudaErrorNotSupported: swiglu
// then the plain product gives the same bits). The same arithmetic every way: a row's bits
// never depend on the choice. The split variants (EW: an epilogue warp): resident wherever their
// rows fit; their k split only so (launch_bulk_typed).
template <int KC, int S, int MT, int CW, bool FP8, StreamX XS, int NT, bool EW = false>
using Resident = Bulk<KC, S, MT, NT, CW, FP8, XS, true, EW>;

template <int KC, int S, int MT, int CW, bool FP8, bool EW = false>
bool resident_fits(int64_t n, int64_t k) {
  return n <= 8 ? Resident<KC, S, MT, CW, FP8, StreamX::kSwiglu, 1, EW>::fits(n, k)
                : Resident<KC, S, MT, CW, FP8, StreamX::kSwiglu, 2, EW>::fits(n, k);
}

template <int KC, int S, int MT, int CW, bool FP8, StreamX XS, bool EW = false>
cudaError_t launch_rows(Out y, BulkX x, const void* w, const float* w_scale, const float* bias,
                        int n, int64_t m, int64_t k, bool accumulate, cudaStream_t s,
                        BulkSplit split) {
  using R1 = Resident<KC, S, MT, CW, FP8, XS, 1, EW>;
  using R2 = Resident<KC, S, MT, CW, FP8, XS, 2, EW>;
  // set_stream_resident_rows; the split variants always.
  const bool resident = XS != StreamX::kRows || n >= g_resident_rows || EW;
  if (resident && n <= 8 && R1::fits(n, split.span)) {
    return launch_bulk<R1>(y, x, w, w_scale, bias, n, m, k, accumulate, s, split);
  }
  if (resident && n > 8 && R2::fits(n, split.span)) {
    return launch_bulk<R2>(y, x, w, w_scale, bias, n, m, k, accumulate, s, split);
  }
  if constexpr (XS == StreamX::kSwiglu) {
    return cudaErrorNotSupported;
  } else if (n <= 8) {
    return launch_bulk<Bulk<KC, S, 1, 1, CW, FP8, XS, false>>(y, x, w, w_scale, bias, n, m, k,
                                                              accumulate, s, split);
  } else {
    return launch_bulk<Bulk<KC, S, 2, 2, CW, FP8, XS, false>>(y, x, w, w_scale, bias, n, m, k,
                                                              accumulate, s, split);
  }
}

// The BF16 bulk variants (stream_gemm.h): k-elements of a weight row a stage, ring depth,
// consumer warps; the split variants' m16 tiles a resident stage (its unit) and longest span.
// with_variant calls f with variant v's as a BulkVariant (4-9; others: 7).
template <int KC_, int S_, int CW_, int kSplitMT_ = 0, int64_t kSpanMax_ = 0>
struct BulkVariant {
  static constexpr int KC = KC_, S = S_, CW = CW_;
  static constexpr bool kSplit = kSplitMT_ > 0;
  static constexpr int kResidentMT = kSplit ? kSplitMT_ : 1;
  static constexpr int64_t kSpanMax = kSpanMax_;
  static BulkSplit split(int64_t m, int64_t k, const StreamSplitSpace& space) {
    return kSplit ? split_for(m, k, 16 * kResidentMT, kSpanMax, space) : BulkSplit::whole(k);
  }
};
template <class F>
auto with_variant(int variant, F&& f) {
  switch (variant) {
    case 4:
      return f(BulkVariant<256, 8, 4>{});
    case 5:
      return f(BulkVariant<512, 4, 4>{});
    case 6:
      return f(BulkVariant<512, 4, 8>{});
    case 8:
      return f(BulkVariant<512, 4, 4, 2, 2048>{});
    case 9:
      return f(BulkVariant<512, 4, 4, 1, 1024>{});
    default:
      return f(BulkVariant<512, 8, 4>{});
  }
}

template <StreamX XS>
cudaError_t launch_variant(Out y, BulkX x, const void* w, const float* bias, int n, int64_t m,
                           int64_t k, bool accumulate, cudaStream_t s, int variant,
                           const StreamSplitSpace& space) {
  return with_variant(variant, [&](auto v) {
    using V = decltype(v);
    return launch_rows<V::KC, V::S, V::kResidentMT, V::CW, false, XS, V::kSplit>(
        y, x, w, nullptr, bias, n, m, k, accumulate, s, V::split(m, k, space));
  });
}

}  // namespace

bool stream_fuses(int variant) { return variant >= 4 && variant <= 9; }

bool stream_splits(int variant) {
  return stream_fuses(variant) && with_variant(variant, [](auto v) { return decltype(v)::kSplit; });
}

int stream_split_count(int64_t m, int64_t k, int variant, const StreamSplitSpace& space) {
  if (!stream_splits(variant)) return 1;
  return with_variant(variant, [&](auto v) { return decltype(v)::split(m, k, space).splits; });
}

bool stream_swiglu_fuses(int64_t n, int64_t m, int64_t k, int variant,
                         const StreamSplitSpace& space) {
  return stream_fuses(variant) && with_variant(variant, [&](auto v) {
           using V = decltype(v);
           return resident_fits<V::KC, V::S, V::kResidentMT, V::CW, false, V::kSplit>(
               n, V::split(m, k, space).span);
         });
}

bool fp8_bulk_swiglu_fuses(int64_t n, int64_t k) { return resident_fits<512, 8, 1, 8, true>(n, k); }

void set_stream_l2_prefetch(int64_t bytes) { g_l2_prefetch_bytes = std::max<int64_t>(0, bytes); }

void set_stream_resident_rows(int rows) { g_resident_rows = rows > 0 ? rows : kStreamResidentRows; }

cudaError_t stream_gemm_fused(Out y, StreamX kind, const void* x, const float* norm_w, float eps,
                              const void* w, const float* bias, int64_t n, int64_t m, int64_t k,
                              bool accumulate, cudaStream_t s, int variant,
                              const StreamSplitSpace& space) {
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
      return launch_variant<StreamX::kRmsNormed>(y, bx, w, bias, ni, m, k, accumulate, s, variant,
                                                 space);
    case StreamX::kSwiglu:
      return launch_variant<StreamX::kSwiglu>(y, bx, w, bias, ni, m, k, accumulate, s, variant,
                                              space);
    default:
      return launch_variant<StreamX::kRows>(y, bx, w, bias, ni, m, k, accumulate, s, variant,
                                            space);
  }
}

// 512 codes of a weight row a stage (8 sub-chunks of 64: one for each of the 8 consumer warps,
// fp8_matmul_kernel's warp split), up to 8 stages (as many as fit beside the rest).
cudaError_t fp8_bulk_matmul(Out y, const void* x, const uint8_t* q, const float* scale, int64_t n,
                            int64_t m, int64_t k, bool accumulate, cudaStream_t s, StreamX kind,
                            const float* norm_w, float eps) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (n > kSkinnyMaxRows || (y.t != Elem::kF32 && y.t != Elem::kBF16) ||
      (kind == StreamX::kRmsNormed &&
       (norm_w == nullptr || reinterpret_cast<uintptr_t>(norm_w) % 16 != 0))) {
    return cudaErrorInvalidValue;
  }
  const BulkX bx{static_cast<const __nv_bfloat16*>(x), norm_w, eps};
  const int ni = static_cast<int>(n);
  const BulkSplit whole = BulkSplit::whole(k);
  switch (kind) {
    case StreamX::kRmsNormed:
      return launch_rows<512, 8, 1, 8, true, StreamX::kRmsNormed>(y, bx, q, scale, nullptr, ni, m,
                                                                  k, accumulate, s, whole);
    case StreamX::kSwiglu:
      return launch_rows<512, 8, 1, 8, true, StreamX::kSwiglu>(y, bx, q, scale, nullptr, ni, m, k,
                                                               accumulate, s, whole);
    default:
      return launch_rows<512, 8, 1, 8, true, StreamX::kRows>(y, bx, q, scale, nullptr, ni, m, k,
                                                             accumulate, s, whole);
  }
}
}  // namespace bs::cuda
