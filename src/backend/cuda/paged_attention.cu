// Split-KV paged attention and the fused decoder-layer prologue (kernels.h).
//
// Paged attention works in two launches. The split pass gives each thread block one kv head, one
// chunk of kSplitKeys consecutive key positions, one sequence and a tile of up to kTileQueries
// query vectors of it (query rows x the heads that share the kv head, GQA), so a K/V chunk is
// read once per tile and not once per query head. Each block writes an unnormalised partial
// result with its running maximum and sum; the combine pass merges the splits of a (row, head) in
// split order. A batch of sequences (AttentionArgs::num_seqs) shares both launches; a sequence
// only picks its own rows, block table and length, so its blocks run exactly the single-sequence
// work.
//
// Row invariance: the chunk boundaries are absolute key positions, every (query, key) score and
// every per-query reduction runs the same instruction sequence whichever tile slot the query
// has, and a split that a query cannot see contributes exactly nothing to the combine. So a
// query row's output does not depend on how many rows share the launch, on the launch's key
// count bound, or on the split count: a 16-row verify reproduces the decode of each position, and
// a batched call reproduces the call of each sequence alone.
//
// Fused prologue (prologue_attention): the decoder layer's q/k norm + RoPE + KV write can run
// inside the split pass instead of as a launch of its own. Each block then computes its query
// vectors from the projection, and the blocks whose chunk holds the call's own positions compute
// those keys and values too (the tile-0 block also writes them to the pools), with the
// arithmetic of the prologue kernel, so the results are the same bits.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_tiles.cuh"

namespace bs::cuda {
namespace {

constexpr int kSplitKeys = 64;      // keys per split (absolute chunks [s*64, s*64+64))
constexpr int kTileQueries = 16;    // most query vectors per block
constexpr int kSplitThreads = 128;  // 4 warps: two groups of 64 threads (one per key / column pair)

// Keys sequence `seq` attends over.
__device__ __forceinline__ int64_t kv_length(const AttentionArgs& a, const int32_t* kv_len_dev,
                                             int64_t seq) {
  return kv_len_dev ? static_cast<int64_t>(kv_len_dev[seq]) : a.kv_len;
}

__device__ __forceinline__ bool key_visible(bool causal, int64_t window, int64_t qpos, int64_t j) {
  bool vis = !(causal && j > qpos);
  if (window > 0) vis = vis && qpos - j < window && (causal || j - qpos < window);
  return vis;
}

// Shared memory of one split block, for head dim hd (even): K with a 2-element pad per row
// (32-bit reads by key are bank-conflict free), V, the query tile in fp32, and the scores.
__host__ __device__ inline size_t split_smem_bytes(int64_t hd) {
  return static_cast<size_t>(kSplitKeys) * (hd + 2) * 2 + static_cast<size_t>(kSplitKeys) * hd * 2 +
         static_cast<size_t>(kTileQueries) * hd * 4 +
         static_cast<size_t>(kTileQueries) * kSplitKeys * 4;
}

// rope(rms_norm(x)) of one head vector x[hd] (hd = 64 P) by one warp: the lane holds the
// rotate-half pairs (i, i + hd/2), i = lane + 32 u for u < P. The sum of squares adds a lane's
// pairs in u order, then over the lanes (warp_sum), so a vector gets the same bits in the
// prologue kernel and in the fused attention. norm null: no normalisation.
template <int P>
__device__ __forceinline__ void rope_norm_warp(const __nv_bfloat16* x, const float* norm, float eps,
                                               int32_t pos, const float* inv_freq, float scaling,
                                               float (&y0)[P], float (&y1)[P]) {
  const int lane = threadIdx.x & 31, half = 32 * P;
  float x0[P], x1[P];
#pragma unroll
  for (int u = 0; u < P; ++u) {
    x0[u] = __bfloat162float(x[lane + 32 * u]);
    x1[u] = __bfloat162float(x[lane + 32 * u + half]);
  }
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < P; ++u) ss += x0[u] * x0[u] + x1[u] * x1[u];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(2 * half) + eps);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      x0[u] = x0[u] * inv * norm[lane + 32 * u];
      x1[u] = x1[u] * inv * norm[lane + 32 * u + half];
    }
  }
#pragma unroll
  for (int u = 0; u < P; ++u) {
    const float angle = static_cast<float>(pos) * inv_freq[lane + 32 * u];
    float sn, cs;
    sincosf(angle, &sn, &cs);
    cs *= scaling;
    sn *= scaling;
    y0[u] = x0[u] * cs - x1[u] * sn;
    y1[u] = x1[u] * cs + x0[u] * sn;
  }
}

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// ---- Split pass ----
// The pieces below are shared by both split kernels (v1: a block per chunk; v2: a block runs
// consecutive chunks with the next chunk's K / V loads in flight), so every query vector, score,
// reduction and partial result is the same instruction sequence in both.

// One block's tile of query vectors: what the block works on, and where its rows are.
struct SplitTile {
  int64_t seq = 0, tile = 0, kv_len = 0, q_begin = 0, seq_row0 = 0, first_new = 0, width = 0;
  int kvh = 0, group = 0, nq = 0, hd = 0, half = 0;
};

template <int QPT>
__device__ __forceinline__ SplitTile split_tile(const AttentionArgs& a, const int32_t* kv_len_dev) {
  SplitTile t;
  const int64_t tiles = gridDim.z / a.num_seqs;
  t.seq = blockIdx.z / tiles;
  t.tile = blockIdx.z - t.seq * tiles;
  t.kv_len = kv_length(a, kv_len_dev, t.seq);
  t.kvh = blockIdx.y;
  t.group = static_cast<int>(a.heads / a.kv_heads);
  constexpr int kTile = 2 * QPT;
  const int64_t total_q = a.n * t.group;
  t.q_begin = t.tile * kTile;
  t.seq_row0 = t.seq * a.n;  // the sequence's first row of q / out / the partials
  t.nq = static_cast<int>(total_q - t.q_begin < kTile ? total_q - t.q_begin : kTile);
  t.first_new = t.kv_len - a.n;                 // the call's own rows' positions start here
  t.width = (a.heads + 2 * a.kv_heads) * a.hd;  // a p.qkv row
  t.hd = static_cast<int>(a.hd);
  t.half = t.hd / 2;
  return t;
}

// The pool slot of key position `key` of the tile's sequence; -1 past its length and, with the
// prologue fused (P > 0), for the call's own positions (computed in the block instead).
template <int P>
__device__ __forceinline__ int64_t key_slot(const AttentionArgs& a, const SplitTile& t,
                                            int64_t key) {
  if (key >= t.kv_len || (P > 0 && key >= t.first_new)) return -1;
  const int bs = static_cast<int>(a.block_size), k = static_cast<int>(key);
  const int blk = k / bs, in_blk = k - blk * bs;
  return static_cast<int64_t>(a.block_table[t.seq * a.table_stride + blk]) * bs + in_blk;
}

// Tile slot t's query vector q_begin + t: its row of q / out (over all sequences) and its head.
struct QueryOf {
  int64_t row, head;
};
__device__ __forceinline__ QueryOf query_of(const SplitTile& st, int t) {
  const int64_t qi = st.q_begin + t;
  return {st.seq_row0 + qi / st.group, st.kvh * st.group + qi % st.group};
}

// rope(norm(q)) of tile slot t from the projection (fused prologue), before its BF16 rounding.
template <int P>
__device__ __forceinline__ void fused_query(const PrologueArgs& p, const SplitTile& st, int t,
                                            float (&y0)[P], float (&y1)[P]) {
  const QueryOf q = query_of(st, t);
  rope_norm_warp<P>(p.qkv + q.row * st.width + q.head * st.hd, p.q_norm, p.eps, p.positions[q.row],
                    p.inv_freq, p.attention_scaling, y0, y1);
}

// Query tile -> Qs [16][hd] fp32 (tile slot t is query vector q_begin + t = (row, g)).
template <int P>
__device__ __forceinline__ void load_query_tile(const AttentionArgs& a, const PrologueArgs& p,
                                                const SplitTile& st, float* Qs) {
  const int tid = threadIdx.x, hd = st.hd, half = st.half;
  if constexpr (P > 0) {  // rope(norm(q)) rounded to BF16, a warp per vector
    const int warp = tid >> 5, lane = tid & 31;
    for (int t = warp; t < st.nq; t += kSplitThreads / 32) {
      float y0[P], y1[P];
      fused_query<P>(p, st, t, y0, y1);
#pragma unroll
      for (int u = 0; u < P; ++u) {
        Qs[t * hd + lane + 32 * u] = round_bf16(y0[u]);
        Qs[t * hd + lane + 32 * u + half] = round_bf16(y1[u]);
      }
    }
  } else {
    // 16-byte loads all issued before the first store. At most 16 * 256 / 8 / 128 = 4 per thread.
    const __nv_bfloat16* Q = static_cast<const __nv_bfloat16*>(a.q);
    const int vec_per_q = hd / 8, total = st.nq * vec_per_q;
    uint4 qw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = tid + u * kSplitThreads;
      if (i < total) {
        const int t = i / vec_per_q, c8 = i - t * vec_per_q;
        const int64_t qi = st.q_begin + t, row = qi / st.group,
                      h = st.kvh * st.group + qi % st.group;
        qw[u] = __ldg(
            reinterpret_cast<const uint4*>(Q + ((st.seq_row0 + row) * a.heads + h) * a.hd) + c8);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = tid + u * kSplitThreads;
      if (i < total) {
        const int t = i / vec_per_q, c8 = i - t * vec_per_q;
        const uint32_t w[4] = {qw[u].x, qw[u].y, qw[u].z, qw[u].w};
        float* dst = Qs + t * hd + c8 * 8;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dst[2 * e] = bf16_lo(w[e]);
          dst[2 * e + 1] = bf16_hi(w[e]);
        }
      }
    }
  }
}

// K / V of one chunk move in batches of kBatch 16-byte vectors per thread (vector i = key i /
// (hd / 8), column block i % (hd / 8)); a batch's loads are all issued before any is stored.
constexpr int kBatch = 8;

// Issues the loads of the batch starting at vector `base` (a thread's first: tid) of the chunk
// whose key j has the slot slot_of(j); rows without a slot (-1) are zero.
template <typename SlotOf>
__device__ __forceinline__ void load_kv_batch(const AttentionArgs& a, int kvh, SlotOf slot_of,
                                              int base, uint4 (&kw)[kBatch], uint4 (&vw)[kBatch]) {
  const int vec_per_row = static_cast<int>(a.hd / 8), total_vec = kSplitKeys * vec_per_row;
  const __nv_bfloat16* Kg = static_cast<const __nv_bfloat16*>(a.k);
  const __nv_bfloat16* Vg = static_cast<const __nv_bfloat16*>(a.v);
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int i = base + u * kSplitThreads;
    kw[u] = vw[u] = make_uint4(0, 0, 0, 0);
    if (i < total_vec) {
      const int j = i / vec_per_row, c8 = i - j * vec_per_row;
      const int64_t slot = slot_of(j);
      if (slot >= 0) {
        const int64_t off = (slot * a.kv_heads + kvh) * a.hd + c8 * 8;
        kw[u] = __ldg(reinterpret_cast<const uint4*>(Kg + off));
        vw[u] = __ldg(reinterpret_cast<const uint4*>(Vg + off));
      }
    }
  }
}

// Stores a batch of load_kv_batch into Ks [64][hd/2 + 1] and Vs [64][hd/2] (32-bit words).
__device__ __forceinline__ void store_kv_batch(int hd, int base, const uint4 (&kw)[kBatch],
                                               const uint4 (&vw)[kBatch], uint32_t* Ks,
                                               uint32_t* Vs) {
  const int half = hd / 2, kstride = half + 1, vec_per_row = hd / 8;
  const int total_vec = kSplitKeys * vec_per_row;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int i = base + u * kSplitThreads;
    if (i < total_vec) {
      const int j = i / vec_per_row, c8 = i - j * vec_per_row;
      uint32_t* kr = Ks + j * kstride + c8 * 4;
      kr[0] = kw[u].x, kr[1] = kw[u].y, kr[2] = kw[u].z, kr[3] = kw[u].w;
      *reinterpret_cast<uint4*>(Vs + j * half + c8 * 4) = vw[u];
    }
  }
}

// Element addresses of v1 / v2's shared K [64][hd/2 + 1] and V [64][hd/2] (32-bit words).
__device__ __forceinline__ auto v1_k_at(uint32_t* Ks, int kstride) {
  return [=](int j, int i) { return reinterpret_cast<__nv_bfloat16*>(Ks + j * kstride) + i; };
}
__device__ __forceinline__ auto v1_v_at(uint32_t* Vs, int half) {
  return [=](int j, int i) { return reinterpret_cast<__nv_bfloat16*>(Vs + j * half) + i; };
}

// P > 0: the call's own keys (rope(norm(k))) and values of chunk [j0, j0 + 64), a warp per key,
// into Ks / Vs and (tile-0 block) the pools.
// k_at(j, i) / v_at(j, i): where element i of key j goes in shared memory (the split kernels lay
// K out differently).
template <int P, typename KAt, typename VAt>
__device__ __forceinline__ void own_keys(const AttentionArgs& a, const PrologueArgs& p,
                                         const SplitTile& st, int64_t j0, KAt k_at, VAt v_at) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int hd = st.hd, half = st.half;
  const int64_t key_end = j0 + kSplitKeys < st.kv_len ? j0 + kSplitKeys : st.kv_len;
  const bool write_pools = st.tile == 0;
  for (int64_t key = (j0 > st.first_new ? j0 : st.first_new) + warp; key < key_end;
       key += kSplitThreads / 32) {
    const int j = static_cast<int>(key - j0);
    const int64_t r = st.seq_row0 + (key - st.first_new);
    const __nv_bfloat16* kx = p.qkv + r * st.width + (a.heads + st.kvh) * hd;
    const __nv_bfloat16* vx = kx + a.kv_heads * hd;
    float y0[P], y1[P];
    rope_norm_warp<P>(kx, p.k_norm, p.eps, p.positions[r], p.inv_freq, p.attention_scaling, y0, y1);
    const int64_t slot = p.slots[r];
    const bool in_pool = slot >= 0 && slot < p.capacity;
    const bool to_pool = write_pools && in_pool;
    if (write_pools && !in_pool && lane == 0) {
      report_slot_fault(p.fault, FaultOp::kPrologueAttention, slot, p.capacity);
    }
    const int64_t pool_off = (slot * a.kv_heads + st.kvh) * hd;
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const int i = lane + 32 * u;
      const __nv_bfloat16 k0 = __float2bfloat16_rn(y0[u]), k1 = __float2bfloat16_rn(y1[u]);
      const __nv_bfloat16 v0 = vx[i], v1 = vx[i + half];
      *k_at(j, i) = k0, *k_at(j, i + half) = k1, *v_at(j, i) = v0, *v_at(j, i + half) = v1;
      if (to_pool) {
        p.k_pool[pool_off + i] = k0, p.k_pool[pool_off + i + half] = k1;
        p.v_pool[pool_off + i] = v0, p.v_pool[pool_off + i + half] = v1;
      }
    }
  }
}

// Per-query max and sum over a chunk's scores S [nq][64] (warp w takes queries w, w + 4, ...);
// S becomes p = exp(s - max) (0 for a key not seen).
__device__ __forceinline__ void chunk_softmax(int nq, float* S, float* sm_max, float* sm_sum) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t = warp; t < nq; t += kSplitThreads / 32) {
    float* s = S + t * kSplitKeys;
    const float a0 = s[lane], a1 = s[lane + 32];
    const float m = warp_max(fmaxf(a0, a1));
    float p0 = 0.0f, p1 = 0.0f;
    if (m != -INFINITY) {
      p0 = a0 == -INFINITY ? 0.0f : __expf(a0 - m);
      p1 = a1 == -INFINITY ? 0.0f : __expf(a1 - m);
    }
    s[lane] = p0;
    s[lane + 32] = p1;
    const float l = warp_sum(p0 + p1);
    if (lane == 0) sm_max[t] = m, sm_sum[t] = l;
  }
}

// The attention of the tile over chunk `split` (keys [64 split, 64 split + 64), in Ks / Vs):
// scores -> per-query max and sum -> P . V, written as the split's partial result. Starts and
// ends without a barrier of its own (the caller syncs before Ks / Vs / S are written again).
template <int QPT>
__device__ __forceinline__ void chunk_attention(const AttentionArgs& a, const SplitTile& st,
                                                int64_t split, const uint32_t* Ks,
                                                const uint32_t* Vs, const float* Qs, float* S,
                                                float* sm_max, float* sm_sum, float* part_o,
                                                float* part_ml) {
  const int tid = threadIdx.x, hd = st.hd, half = st.half, kstride = half + 1, nq = st.nq;
  const int64_t j0 = split * kSplitKeys, kv_len = st.kv_len;
  // Scores: thread = (key j, half of the tile's queries).
  {
    const int j = tid % kSplitKeys, t0 = (tid / kSplitKeys) * QPT;
    float acc[QPT];
    const int mine = nq - t0;  // valid queries of this thread (may be <= 0)
#pragma unroll
    for (int u = 0; u < QPT; ++u) acc[u] = 0.0f;
    const uint32_t* kr = Ks + j * kstride;
#pragma unroll 4
    for (int w = 0; w < (mine > 0 ? half : 0); ++w) {
      const uint32_t kw = kr[w];
      const float k0 = bf16_lo(kw), k1 = bf16_hi(kw);
#pragma unroll
      for (int u = 0; u < QPT; ++u) {
        const float2 qv = *reinterpret_cast<const float2*>(Qs + (t0 + u) * hd + 2 * w);
        acc[u] = fmaf(qv.x, k0, acc[u]);
        acc[u] = fmaf(qv.y, k1, acc[u]);
      }
    }
    const int64_t key = j0 + j;
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
      const int t = t0 + u;
      if (t >= nq) break;
      const int64_t row = (st.q_begin + t) / st.group, qpos = kv_len - a.n + row;
      const bool vis = key < kv_len && key_visible(a.causal, a.window, qpos, key);
      S[t * kSplitKeys + j] = vis ? acc[u] * a.scale : -INFINITY;
    }
  }
  __syncthreads();

  chunk_softmax(nq, S, sm_max, sm_sum);
  __syncthreads();

  // P . V: thread = (pair of head-dim columns, half of the queries).
  const int t0 = (tid / kSplitKeys) * QPT;
  for (int w = tid % kSplitKeys; w < half && t0 < nq; w += kSplitKeys) {
    float acc0[QPT], acc1[QPT];
#pragma unroll
    for (int u = 0; u < QPT; ++u) acc0[u] = acc1[u] = 0.0f;
#pragma unroll 4
    for (int j = 0; j < kSplitKeys; ++j) {
      const uint32_t vw = Vs[j * half + w];
      const float v0 = bf16_lo(vw), v1 = bf16_hi(vw);
#pragma unroll
      for (int u = 0; u < QPT; ++u) {
        const float p = S[(t0 + u) * kSplitKeys + j];
        acc0[u] = fmaf(p, v0, acc0[u]);
        acc1[u] = fmaf(p, v1, acc1[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
      const int t = t0 + u;
      if (t >= nq) break;
      const int64_t qi = st.q_begin + t, row = qi / st.group, h = st.kvh * st.group + qi % st.group;
      const int64_t idx = (split * a.num_seqs * a.n + st.seq_row0 + row) * a.heads + h;
      *reinterpret_cast<float2*>(part_o + idx * a.hd + 2 * w) = make_float2(acc0[u], acc1[u]);
      if (w == 0) {
        part_ml[idx * 2] = sm_max[t];
        part_ml[idx * 2 + 1] = sm_sum[t];
      }
    }
  }
}

// v1. grid (splits, kv_heads, num_seqs * query tiles per sequence), kSplitThreads threads; a tile
// holds 2 * QPT query vectors of one sequence, each thread QPT of them (QPT only sets how the
// work is spread: every query's arithmetic is the same sequence for any QPT).
// part_o [splits, num_seqs * n, heads, hd] fp32, part_ml [splits, num_seqs * n, heads, 2] fp32
// (max, sum).
//
// P > 0: the layer prologue is fused in (head dim 64 P): q comes from the projection p.qkv, each
// block normalising and rotating its tile's query vectors itself; the keys and values of the
// call's own rows (the last n positions) come from p.qkv too, and the tile-0 block of their chunk
// writes them to the pools (p.slots). Every value is the prologue kernel's to the bit.
template <int QPT, int P>
__global__ void __launch_bounds__(kSplitThreads)
    split_kernel(AttentionArgs a, PrologueArgs p, const int32_t* kv_len_dev, float* part_o,
                 float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int hd = static_cast<int>(a.hd), half = hd / 2, kstride = half + 1;  // 32-bit words
  uint32_t* Ks = reinterpret_cast<uint32_t*>(smem);                          // [64][hd/2 + 1]
  uint32_t* Vs = Ks + kSplitKeys * kstride;                                  // [64][hd/2]
  float* Qs = reinterpret_cast<float*>(Vs + kSplitKeys * half);              // [16][hd]
  float* S = Qs + kTileQueries * hd;                                         // [16][64]
  __shared__ int64_t slot_of[kSplitKeys];
  __shared__ float sm_max[kTileQueries], sm_sum[kTileQueries];
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();

  const SplitTile st = split_tile<QPT>(a, kv_len_dev);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kSplitKeys;
  if (j0 >= st.kv_len) return;  // beyond the sequence: the combine never reads this split
  const int tid = threadIdx.x;
  // The block-table reads of the chunk's keys (so that the K / V loads below do not each wait
  // on a dependent table read) and the query loads are in flight together.
  const int64_t my_slot = tid < kSplitKeys ? key_slot<P>(a, st, j0 + tid) : -1;
  load_query_tile<P>(a, p, st, Qs);
  if (tid < kSplitKeys) slot_of[tid] = my_slot;
  __syncthreads();
  // K / V chunk -> shared memory; rows past kv_len are zero.
  for (int base = tid; base < kSplitKeys * (hd / 8); base += kBatch * kSplitThreads) {
    uint4 kw[kBatch], vw[kBatch];
    load_kv_batch(
        a, st.kvh, [&](int j) { return slot_of[j]; }, base, kw, vw);
    store_kv_batch(hd, base, kw, vw, Ks, Vs);
  }
  __syncthreads();
  if constexpr (P > 0) {
    own_keys<P>(a, p, st, j0, v1_k_at(Ks, kstride), v1_v_at(Vs, half));
    __syncthreads();
  }
  chunk_attention<QPT>(a, st, blockIdx.x, Ks, Vs, Qs, S, sm_max, sm_sum, part_o, part_ml);
}

// v2: the same per-chunk work, a block running up to kMaxGroupChunks consecutive chunks of its
// (sequence, kv head, tile) and writing each chunk's partial result as the v1 block of that chunk
// would. Why: a v1 block's chain (table read -> query tile -> K / V loads -> scores -> softmax ->
// P . V) leaves the memory idle for most of its life, so a decode batch streamed the KV at about
// a quarter of the H200's bandwidth. A v2 block reads its chunks' table entries and its query
// tile once, and issues the next chunk's K / V loads (a thread's first batch: the whole chunk for
// head dim <= 128) before computing the current one.
// grid (ceil(splits / chunks), kv_heads, num_seqs * tiles); dynamic shared memory
// split_smem_bytes_v2(hd, QPT).
constexpr int kMaxGroupChunks = 8;   // shared memory holds the key slots of this many chunks
constexpr int kAutoGroupChunks = 4;  // most chunks per block chosen by the launch size

__host__ __device__ inline size_t split_smem_bytes_v2(int64_t hd, int qpt) {
  return static_cast<size_t>(kSplitKeys) * (hd + 2) * 2 + static_cast<size_t>(kSplitKeys) * hd * 2 +
         static_cast<size_t>(2 * qpt) * hd * 4 + static_cast<size_t>(2 * qpt) * kSplitKeys * 4 +
         static_cast<size_t>(kMaxGroupChunks) * kSplitKeys * sizeof(int64_t);
}

template <int QPT, int P>
__global__ void __launch_bounds__(kSplitThreads)
    split_kernel_v2(AttentionArgs a, PrologueArgs p, const int32_t* kv_len_dev, int chunks,
                    float* part_o, float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kTile = 2 * QPT;
  const int hd = static_cast<int>(a.hd), half = hd / 2, kstride = half + 1;  // 32-bit words
  uint32_t* Ks = reinterpret_cast<uint32_t*>(smem);                          // [64][hd/2 + 1]
  uint32_t* Vs = Ks + kSplitKeys * kstride;                                  // [64][hd/2]
  float* Qs = reinterpret_cast<float*>(Vs + kSplitKeys * half);              // [kTile][hd]
  float* S = Qs + kTile * hd;                                                // [kTile][64]
  int64_t* slot_of = reinterpret_cast<int64_t*>(S + kTile * kSplitKeys);     // [chunks][64]
  __shared__ float sm_max[kTile], sm_sum[kTile];
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();

  const SplitTile st = split_tile<QPT>(a, kv_len_dev);
  // The block's chunks [c_begin, c_end): within the sequence and the launch's splits.
  const int64_t launch_splits = (a.kv_len + kSplitKeys - 1) / kSplitKeys;
  const int64_t seq_splits = (st.kv_len + kSplitKeys - 1) / kSplitKeys;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.x) * chunks;
  int64_t c_end = c_begin + chunks;
  if (c_end > seq_splits) c_end = seq_splits;
  if (c_end > launch_splits) c_end = launch_splits;
  if (c_begin >= c_end) return;  // beyond the sequence: the combine never reads these splits
  const int tid = threadIdx.x;
  // The first chunk's first batch (its table reads by the loading threads themselves), the table
  // reads of all the block's keys and the query tile's loads are in flight together.
  const int total_vec = kSplitKeys * (hd / 8);
  uint4 kw[kBatch], vw[kBatch];
  load_kv_batch(
      a, st.kvh, [&](int j) { return key_slot<P>(a, st, c_begin * kSplitKeys + j); }, tid, kw, vw);
  const int keys = static_cast<int>(c_end - c_begin) * kSplitKeys;
  for (int i = tid; i < keys; i += kSplitThreads) {
    slot_of[i] = key_slot<P>(a, st, c_begin * kSplitKeys + i);
  }
  load_query_tile<P>(a, p, st, Qs);
  __syncthreads();

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t* chunk_slots = slot_of + (c - c_begin) * kSplitKeys;
    const auto chunk_slot = [&](int j) { return chunk_slots[j]; };
    const auto next_slot = [&](int j) { return chunk_slots[kSplitKeys + j]; };
    store_kv_batch(hd, tid, kw, vw, Ks, Vs);
    for (int base = tid + kBatch * kSplitThreads; base < total_vec;
         base += kBatch * kSplitThreads) {  // head dim > 128: the chunk's further batches
      load_kv_batch(a, st.kvh, chunk_slot, base, kw, vw);
      store_kv_batch(hd, base, kw, vw, Ks, Vs);
    }
    __syncthreads();
    // The next chunk's first batch: in flight while this one is computed.
    if (c + 1 < c_end) load_kv_batch(a, st.kvh, next_slot, tid, kw, vw);
    if constexpr (P > 0) {
      own_keys<P>(a, p, st, c * kSplitKeys, v1_k_at(Ks, kstride), v1_v_at(Vs, half));
      __syncthreads();
    }
    chunk_attention<QPT>(a, st, c, Ks, Vs, Qs, S, sm_max, sm_sum, part_o, part_ml);
    __syncthreads();  // Ks / Vs / S / sm_max are rewritten by the next chunk
  }
}

// ---- Split pass v3 ----
// v1's blocks (one 64-key chunk of one (sequence, kv head, query tile)) and v1's arithmetic to
// the bit: every score is the same fmaf chain over the head dims in order, the softmax is
// chunk_softmax, every P . V column the same fmaf chain over the chunk's keys in order. What
// changes is how the data reaches those instructions, for batched decode, where a block has only
// 4 query vectors for its 32 KiB of K / V and v1 spent more shared-memory instructions than FMAs:
// - K / V go from global to shared memory by cp.async (no staging registers); the table reads of
//   a thread's keys are all issued first, and the query tile (the fused prologue included) is
//   computed while the chunk is in flight;
// - K rows are unpadded, 16-byte vector c of key j at position c ^ (j & 7) (conflict-free 16-byte
//   reads by key), so a score step reads 8 dims of K and of each query with three 16-byte loads;
// - P . V gives a thread 4 columns: a 64-bit V read per key, the p of 4 keys in one 16-byte read;
// - shared memory is sized for the tile (2 QPT queries), not for 16: at decode ~36 KB instead of
//   ~45 KB, 6 resident blocks per SM instead of 4.
// Head dims 64 / 128 / 256 (HD, compile time); others stay on v1.
// grid as v1; dynamic shared memory split_smem_bytes_v3(HD, 2 QPT).
__host__ __device__ inline size_t split_smem_bytes_v3(int64_t hd, int tile) {
  return static_cast<size_t>(kSplitKeys) * hd * 2 * 2 + static_cast<size_t>(tile) * hd * 4 +
         static_cast<size_t>(tile) * kSplitKeys * 4;
}

// Diagnostic switches of v3 (set_split_diag, tests and microbenchmarks only): kDiagNoLoads skips
// the K / V loads, kDiagNoCompute the scores / softmax / P . V, kDiagNoCombine the combine pass.
constexpr int kDiagNoLoads = 1, kDiagNoCompute = 2, kDiagNoCombine = 4;

template <int QPT, int HD, bool FUSED>
__global__ void __launch_bounds__(kSplitThreads, 4)
    split_kernel_v3(AttentionArgs a, PrologueArgs p, const int32_t* kv_len_dev, int diag,
                    float* part_o, float* part_ml) {
  constexpr int P = FUSED ? HD / 64 : 0;
  constexpr int kTile = 2 * QPT, kHalf = HD / 2, kVec = HD / 8;  // kVec: 16-byte vectors per row
  constexpr int kLoads = kSplitKeys * kVec / kSplitThreads;      // K (and V) vectors per thread
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* Ks = reinterpret_cast<uint4*>(smem);                          // [64][kVec], swizzled
  uint32_t* Vs = reinterpret_cast<uint32_t*>(Ks + kSplitKeys * kVec);  // [64][HD/2]
  float* Qs = reinterpret_cast<float*>(Vs + kSplitKeys * kHalf);       // [kTile][HD]
  float* S = Qs + kTile * HD;                                          // [kTile][64]
  __shared__ float sm_max[kTile], sm_sum[kTile];
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();

  const SplitTile st = split_tile<QPT>(a, kv_len_dev);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kSplitKeys;
  if (j0 >= st.kv_len) return;  // beyond the sequence: the combine never reads this split
  const int tid = threadIdx.x, nq = st.nq;
  // Thread's vectors i = tid + 128 u: key i / kVec, column vector i % kVec. Slots -1 (past the
  // length, or the call's own keys when fused) are zero-filled.
  if (!(diag & kDiagNoLoads)) {
    int64_t slot[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      slot[u] = key_slot<P>(a, st, j0 + (tid + u * kSplitThreads) / kVec);
    const __nv_bfloat16* Kg = static_cast<const __nv_bfloat16*>(a.k);
    const __nv_bfloat16* Vg = static_cast<const __nv_bfloat16*>(a.v);
    const uint32_t ks0 = static_cast<uint32_t>(__cvta_generic_to_shared(Ks));
    const uint32_t vs0 = static_cast<uint32_t>(__cvta_generic_to_shared(Vs));
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = tid + u * kSplitThreads, j = i / kVec, c = i % kVec;
      const int64_t off = ((slot[u] >= 0 ? slot[u] : 0) * a.kv_heads + st.kvh) * HD + c * 8;
      const int bytes = slot[u] >= 0 ? 16 : 0;
      cp_async16(ks0 + static_cast<uint32_t>(j * kVec + (c ^ (j & 7))) * 16, Kg + off, bytes);
      cp_async16(vs0 + static_cast<uint32_t>(i) * 16, Vg + off, bytes);
    }
    cp_async_commit();
  }
  load_query_tile<P>(a, p, st, Qs);
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (FUSED) {
    own_keys<P>(
        a, p, st, j0,
        [&](int j, int i) {
          return reinterpret_cast<__nv_bfloat16*>(Ks + j * kVec + ((i >> 3) ^ (j & 7))) + (i & 7);
        },
        [&](int j, int i) { return reinterpret_cast<__nv_bfloat16*>(Vs + j * kHalf) + i; });
    __syncthreads();
  }
  if (diag & kDiagNoCompute) return;

  // Scores: thread = (key j, QPT queries), the same fmaf chain as v1 (dims in order).
  {
    const int j = tid % kSplitKeys, t0 = (tid / kSplitKeys) * QPT;
    float acc[QPT];
#pragma unroll
    for (int u = 0; u < QPT; ++u) acc[u] = 0.0f;
    if (t0 < nq) {
      const uint4* kr = Ks + j * kVec;
#pragma unroll 4
      for (int c = 0; c < kVec; ++c) {
        const uint4 kw = kr[c ^ (j & 7)];
        const float k[8] = {bf16_lo(kw.x), bf16_hi(kw.x), bf16_lo(kw.y), bf16_hi(kw.y),
                            bf16_lo(kw.z), bf16_hi(kw.z), bf16_lo(kw.w), bf16_hi(kw.w)};
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
          const float4 q0 = *reinterpret_cast<const float4*>(Qs + (t0 + u) * HD + 8 * c);
          const float4 q1 = *reinterpret_cast<const float4*>(Qs + (t0 + u) * HD + 8 * c + 4);
          acc[u] = fmaf(q0.x, k[0], acc[u]);
          acc[u] = fmaf(q0.y, k[1], acc[u]);
          acc[u] = fmaf(q0.z, k[2], acc[u]);
          acc[u] = fmaf(q0.w, k[3], acc[u]);
          acc[u] = fmaf(q1.x, k[4], acc[u]);
          acc[u] = fmaf(q1.y, k[5], acc[u]);
          acc[u] = fmaf(q1.z, k[6], acc[u]);
          acc[u] = fmaf(q1.w, k[7], acc[u]);
        }
      }
    }
    const int64_t key = j0 + j;
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
      const int t = t0 + u;
      if (t >= nq) break;
      const int64_t row = (st.q_begin + t) / st.group, qpos = st.kv_len - a.n + row;
      const bool vis = key < st.kv_len && key_visible(a.causal, a.window, qpos, key);
      S[t * kSplitKeys + j] = vis ? acc[u] * a.scale : -INFINITY;
    }
  }
  __syncthreads();
  chunk_softmax(nq, S, sm_max, sm_sum);
  __syncthreads();

  // P . V: thread = (4 columns cq, kQpv queries), each column v1's fmaf chain over the keys.
  constexpr int kQuads = HD / 4, kGroups = kSplitThreads / kQuads;
  constexpr int kQpv = kTile / kGroups > 0 ? kTile / kGroups : 1;
  const int cq = tid % kQuads, tq0 = (tid / kQuads) * kQpv;
  if (tq0 >= nq) return;
  float acc[kQpv][4];
#pragma unroll
  for (int u = 0; u < kQpv; ++u) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.0f;
#pragma unroll 2
  for (int j = 0; j < kSplitKeys; j += 4) {
    float4 pr[kQpv];
#pragma unroll
    for (int u = 0; u < kQpv; ++u) {
      pr[u] = *reinterpret_cast<const float4*>(S + (tq0 + u) * kSplitKeys + j);
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const uint2 vw = *reinterpret_cast<const uint2*>(Vs + (j + jj) * kHalf + 2 * cq);
      const float v0 = bf16_lo(vw.x), v1 = bf16_hi(vw.x), v2 = bf16_lo(vw.y), v3 = bf16_hi(vw.y);
#pragma unroll
      for (int u = 0; u < kQpv; ++u) {
        const float pj = jj == 0 ? pr[u].x : jj == 1 ? pr[u].y : jj == 2 ? pr[u].z : pr[u].w;
        acc[u][0] = fmaf(pj, v0, acc[u][0]);
        acc[u][1] = fmaf(pj, v1, acc[u][1]);
        acc[u][2] = fmaf(pj, v2, acc[u][2]);
        acc[u][3] = fmaf(pj, v3, acc[u][3]);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kQpv; ++u) {
    const int t = tq0 + u;
    if (t >= nq) break;
    const int64_t qi = st.q_begin + t, row = qi / st.group, h = st.kvh * st.group + qi % st.group;
    const int64_t idx = (blockIdx.x * a.num_seqs * a.n + st.seq_row0 + row) * a.heads + h;
    *reinterpret_cast<float4*>(part_o + idx * HD + 4 * cq) =
        make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
    if (cq == 0) {
      part_ml[idx * 2] = sm_max[t];
      part_ml[idx * 2 + 1] = sm_sum[t];
    }
  }
}

// ---- Split pass v4: tensor cores ----
// One block per (64-key chunk, kv head, tile of up to 64 query vectors of one sequence: 1-4
// mma.sync m-tiles of 16). Scores: warp w computes keys 16 w .. 16 w + 15 of every m-tile with
// mma.sync m16n8k16 (BF16 q and K, fp32 accumulate, k-steps over the head dim in order); v1's
// scale, mask and softmax in fp32 (exp(s - max) with the chunk max from the four warps' maxima, 0
// for keys not seen; the sum adds each warp's part, then the warps in order); P rounded to BF16
// (as the flash prefill) into shared memory; P . V: warp w computes columns HD / 4 w .. of every
// m-tile, k-steps over the chunk's keys in order. The partial results are v1-v3's, so the
// combine pass is shared.
// Why: v1-v3 spend a thread's fmaf chain per (query, key) and per (query, column); a 16-row
// verify (64 query vectors per kv head at GQA 4) ran four 16-vector tiles, each reading the same
// K / V chunk, at 2.6x the decode attention's time (24.9 vs 9.6 µs per layer, docs/BENCHMARKS.md
// session 12). Here one block reads a chunk once for up to 64 query vectors, the arithmetic is a
// few dozen MMAs per warp, and the work splits over the four warps the same way for a 4-vector
// decode tile as for a 64-vector verify tile.
// Row invariance: mma.sync rows never mix and a query's scores, max, sum and P . V run the same
// instruction sequence whichever m-tile and row it has and however many m-tiles the block has,
// so a verify row reproduces the decode of its position and a batch each sequence alone, bit for
// bit. The rounding differs from v1-v3 (MMA sums, BF16 P): the version follows the head dim only
// (64 / 128; others keep v3), never the row count. TILE (16 / 32 / 64, set_split_mma_tile) caps
// the query vectors of a block: it only decides which block a query is in, not its arithmetic,
// so every tile gives the same bits. grid (splits, kv_heads, num_seqs * ceil(vectors / TILE));
// dynamic shared memory split_smem_bytes_mma(HD, m-tiles).
constexpr int kMmaTile = 16;  // query vectors per v4 block (one m-tile) by default

__host__ __device__ inline size_t split_smem_bytes_mma(int64_t hd, int m_tiles) {
  const size_t rows = static_cast<size_t>(16 * m_tiles);
  return (2 * kSplitKeys + rows) * hd * 2 + rows * 8 * sizeof(float) + rows * kSplitKeys * 2;
}

template <int HD, bool FUSED, int TILE>
__global__ void __launch_bounds__(kSplitThreads, 4)
    split_kernel_mma(AttentionArgs a, PrologueArgs p, const int32_t* kv_len_dev, float* part_o,
                     float* part_ml) {
  constexpr int P = FUSED ? HD / 64 : 0;
  constexpr int kMaxMt = TILE / 16;                             // m-tiles of a full tile
  constexpr int kChunks = HD / 8;                               // 16-byte chunks per row
  constexpr int kDK = HD / 16;                                  // k-steps of S = Q K^T
  constexpr int kDN = HD / 8;                                   // n-tiles of O = P V
  constexpr int kLoads = kSplitKeys * kChunks / kSplitThreads;  // K (and V) chunks per thread
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [64][HD], tile_at swizzle
  __nv_bfloat16* Vs = Ks + kSplitKeys * HD;                    // [64][HD]
  __nv_bfloat16* Qs = Vs + kSplitKeys * HD;                    // [16 m-tiles][HD]
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();

  const SplitTile st = split_tile<TILE / 2>(a, kv_len_dev);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kSplitKeys;
  if (j0 >= st.kv_len) return;  // beyond the sequence: the combine never reads this split
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rows = (st.nq + 15) / 16 * 16;  // query rows of the m-tiles in use (zero past nq)
  {
    int64_t slot[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      slot[u] = key_slot<P>(a, st, j0 + (tid + u * kSplitThreads) / kChunks);
    const auto* Kg = static_cast<const __nv_bfloat16*>(a.k);
    const auto* Vg = static_cast<const __nv_bfloat16*>(a.v);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = tid + u * kSplitThreads, j = i / kChunks, c = i % kChunks;
      const int64_t off = ((slot[u] >= 0 ? slot[u] : 0) * a.kv_heads + st.kvh) * HD + c * 8;
      const int bytes = slot[u] >= 0 ? 16 : 0;
      cp_async16(smem_addr(tile_at<HD>(Ks, j, c)), Kg + off, bytes);
      cp_async16(smem_addr(tile_at<HD>(Vs, j, c)), Vg + off, bytes);
    }
    if constexpr (!FUSED) {
      const auto* Q = static_cast<const __nv_bfloat16*>(a.q);
      for (int i = tid; i < rows * kChunks; i += kSplitThreads) {
        const int t = i / kChunks, c = i % kChunks;
        const QueryOf q = query_of(st, t < st.nq ? t : 0);
        cp_async16(smem_addr(tile_at<HD>(Qs, t, c)), Q + (q.row * a.heads + q.head) * HD + c * 8,
                   t < st.nq ? 16 : 0);
      }
    }
    cp_async_commit();
  }
  if constexpr (FUSED) {  // rope(norm(q)) rounded to BF16, a warp per vector, while K / V land
    for (int t = warp; t < rows; t += kSplitThreads / 32) {
      float y0[P], y1[P];
      if (t < st.nq) fused_query<P>(p, st, t, y0, y1);
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const int i0 = lane + 32 * u, i1 = i0 + HD / 2;
        tile_at<HD>(Qs, t, i0 >> 3)[i0 & 7] = __float2bfloat16_rn(t < st.nq ? y0[u] : 0.0f);
        tile_at<HD>(Qs, t, i1 >> 3)[i1 & 7] = __float2bfloat16_rn(t < st.nq ? y1[u] : 0.0f);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (FUSED) {
    own_keys<P>(
        a, p, st, j0, [&](int j, int i) { return tile_at<HD>(Ks, j, i >> 3) + (i & 7); },
        [&](int j, int i) { return tile_at<HD>(Vs, j, i >> 3) + (i & 7); });
    __syncthreads();
  }
  // S = Q K^T: warp w takes keys 16 w .. 16 w + 15 (n-tiles 2 w, 2 w + 1) of every m-tile, the
  // K fragments of a k-step loaded once for all m-tiles.
  const int g = lane >> 2, tq = lane & 3, m_tiles = rows / 16;
  float s[kMaxMt][2][4];
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt)
#pragma unroll
    for (int n = 0; n < 2; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kDK; ++kk) {
    uint32_t b[4];
    ldmatrix_x4(
        b, tile_at<HD>(Ks, warp * 16 + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
    for (int mt = 0; mt < kMaxMt; ++mt) {
      if (mt >= m_tiles) break;
      uint32_t qf[4];
      ldmatrix_x4(
          qf, tile_at<HD>(Qs, mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, kk * 2 + (lane >> 4)));
      mma_bf16(s[mt][0], qf, b[0], b[1]);
      mma_bf16(s[mt][1], qf, b[2], b[3]);
    }
  }

  // Scale and mask (v1's), then each query vector's chunk max and sum: this thread holds vectors
  // 16 mt + g (s[mt][.][0..1]) and 16 mt + g + 8 (s[mt][.][2..3]) at keys 16 w + 8 n + 2 tq (+ 1);
  // the four warps' maxima and sums meet in shared memory (sums added in warp order).
  float* warp_max = reinterpret_cast<float*>(Qs + rows * HD);                 // [4][rows]
  float* warp_sum = warp_max + 4 * rows;                                      // [4][rows]
  __nv_bfloat16* Ps = reinterpret_cast<__nv_bfloat16*>(warp_sum + 4 * rows);  // [rows][64]
  float m[kMaxMt][2];
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt) {
    if (mt >= m_tiles) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = mt * 16 + g + 8 * h;
      const int64_t qpos = st.kv_len - a.n + (st.q_begin + t) / st.group;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t key = j0 + warp * 16 + n * 8 + 2 * tq + e;
          const bool vis = key < st.kv_len && key_visible(a.causal, a.window, qpos, key);
          float& v = s[mt][n][2 * h + e];
          v = vis ? v * a.scale : -INFINITY;
          mx = fmaxf(mx, v);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (tq == 0) warp_max[warp * rows + t] = mx;
    }
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt) {
    if (mt >= m_tiles) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = mt * 16 + g + 8 * h;
      const float mx = fmaxf(fmaxf(warp_max[t], warp_max[rows + t]),
                             fmaxf(warp_max[2 * rows + t], warp_max[3 * rows + t]));
      m[mt][h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = s[mt][n][2 * h + e];
          p[e] = mx == -INFINITY || v == -INFINITY ? 0.0f : __expf(v - mx);
          sum += p[e];
        }
        *reinterpret_cast<uint32_t*>(tile_at<kSplitKeys>(Ps, t, warp * 2 + n) + 2 * tq) =
            pack_bf16(p[0], p[1]);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (tq == 0) warp_sum[warp * rows + t] = sum;
    }
  }
  __syncthreads();

  // O = P V: warp w takes columns HD / 4 * w .. (kDN / 4 n-tiles) of every m-tile, k-steps over
  // the chunk's keys in order; P's A fragments come from Ps, V's B fragments transposed from Vs.
  constexpr int kWN = kDN / 4;  // n-tiles per warp
  float o[kMaxMt][kWN][4];
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt)
#pragma unroll
    for (int n = 0; n < kWN; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kSplitKeys / 16; ++kk) {
    uint32_t b[kWN / 2][4];
#pragma unroll
    for (int np = 0; np < kWN / 2; ++np) {  // column n-tiles 2 np, 2 np + 1 of the warp's
      ldmatrix_x4_trans(b[np], tile_at<HD>(Vs, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                           warp * kWN + np * 2 + (lane >> 4)));
    }
#pragma unroll
    for (int mt = 0; mt < kMaxMt; ++mt) {
      if (mt >= m_tiles) break;
      uint32_t pa[4];
      ldmatrix_x4(pa, tile_at<kSplitKeys>(Ps, mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                          kk * 2 + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < kWN / 2; ++np) {
        mma_bf16(o[mt][2 * np], pa, b[np][0], b[np][1]);
        mma_bf16(o[mt][2 * np + 1], pa, b[np][2], b[np][3]);
      }
    }
  }

  // The partial results of the vectors below nq: the warp's columns, and (warp 0) the statistics.
  const int64_t stride = a.num_seqs * a.n;  // rows per split
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt) {
    if (mt >= m_tiles) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = mt * 16 + g + 8 * h;
      if (t >= st.nq) continue;
      const QueryOf q = query_of(st, t);
      const int64_t idx = (blockIdx.x * stride + q.row) * a.heads + q.head;
#pragma unroll
      for (int n = 0; n < kWN; ++n) {
        *reinterpret_cast<float2*>(part_o + idx * HD + (warp * kWN + n) * 8 + 2 * tq) =
            make_float2(o[mt][n][2 * h], o[mt][n][2 * h + 1]);
      }
      if (warp == 0 && tq == 0) {
        part_ml[idx * 2] = m[mt][h];
        part_ml[idx * 2 + 1] =
            ((warp_sum[t] + warp_sum[rows + t]) + warp_sum[2 * rows + t]) + warp_sum[3 * rows + t];
      }
    }
  }
}

// Floats of each of the combine kernel's two shared arrays for a launch bound of kv_len keys: the
// launch's split count rounded up to a multiple of 4. The compiled combine loop reads the weights
// of a row's last (splits % 4) splits with one wide shared load (a 12-byte read at the tail's
// first weight, compute-sanitizer memcheck on the H200); with arrays of exactly `splits` floats
// that load ran past the end of the allocation when the tail reached the launch's last split (a
// launch of 1 split: 8 bytes allocated, 12 read). Whole groups of 4 keep every such read inside
// the allocation and start both arrays 16-byte aligned.
__host__ __device__ inline int64_t combine_array_floats(int64_t kv_len) {
  const int64_t splits = (kv_len + kSplitKeys - 1) / kSplitKeys;
  return (splits + 3) / 4 * 4;
}

// grid (num_seqs * n * heads), threads over hd, dynamic shared memory 2 x
// combine_array_floats(a.kv_len) floats: merges the splits of one (row, head) in split order. The
// split statistics are loaded into shared memory together (one memory latency, not one per split);
// the per-split weights f_s = exp(m_s - M) are computed once.
__global__ void combine_kernel(AttentionArgs a, const int32_t* kv_len_dev, const float* part_o,
                               const float* part_ml) {
  extern __shared__ __align__(16) float weight_of[];  // [splits]: f_s (0: a split not seen)
  const int64_t array_floats = combine_array_floats(a.kv_len);
  float* sum_of = weight_of + array_floats;  // [splits]: l_s
  __shared__ float inv_den;
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();
  const int64_t rh = blockIdx.x;  // row * heads + head, row over all sequences
  const int64_t kv_len = kv_length(a, kv_len_dev, rh / (a.n * a.heads));
  // A row's splits (its own length); never more than the launch's (the contract kv_len_dev[s] <=
  // a.kv_len; the split pass computes only the launch's splits, so a longer length would read
  // partial results that were never written and run past both shared arrays).
  const int launch_splits = static_cast<int>((a.kv_len + kSplitKeys - 1) / kSplitKeys);
  const int splits = min(static_cast<int>((kv_len + kSplitKeys - 1) / kSplitKeys), launch_splits);
  const int64_t stride = a.num_seqs * a.n * a.heads;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    weight_of[s] = part_ml[(s * stride + rh) * 2];
    sum_of[s] = part_ml[(s * stride + rh) * 2 + 1];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < splits; ++s) M = fmaxf(M, weight_of[s]);
    float den = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float f = weight_of[s] == -INFINITY ? 0.0f : __expf(weight_of[s] - M);
      weight_of[s] = f;
      den += f * sum_of[s];
    }
    inv_den = den > 0.0f ? 1.0f / den : 0.0f;
  }
  __syncthreads();
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out) + rh * a.hd;
  for (int64_t c = threadIdx.x; c < a.hd; c += blockDim.x) {
    float num = 0.0f;
    int s = 0;
    for (; s + 4 <= splits; s += 4) {  // four independent loads in flight
      float o[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) o[u] = part_o[((s + u) * stride + rh) * a.hd + c];
#pragma unroll
      for (int u = 0; u < 4; ++u) num += weight_of[s + u] * o[u];
    }
    for (; s < splits; ++s) num += weight_of[s] * part_o[(s * stride + rh) * a.hd + c];
    out[c] = __float2bfloat16_rn(num * inv_den);
  }
}

// ---- Attention prologue ----
// Head dims 64 / 128 / 256: 4 warps per block, a warp per (row, head) vector (rope_norm_warp, the
// arithmetic the fused attention repeats).
template <int P>
__global__ void __launch_bounds__(128) prologue_warp_kernel(PrologueArgs a) {
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();
  const int lane = threadIdx.x & 31, half = 32 * P;
  const int64_t width_heads = a.heads + 2 * a.kv_heads;
  const int64_t vector = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (vector >= a.n * width_heads) return;
  const int64_t t = vector / width_heads, h = vector - t * width_heads;
  const __nv_bfloat16* src = a.qkv + t * width_heads * a.hd + h * a.hd;
  const int64_t slot = a.slots[t];
  const bool capacity_ok = slot >= 0 && slot < a.capacity;
  if (h >= a.heads + a.kv_heads) {  // v: straight into the pool
    if (!capacity_ok) {
      if (lane == 0) report_slot_fault(a.fault, FaultOp::kAttentionPrologue, slot, a.capacity);
      return;
    }
    __nv_bfloat16* dst = a.v_pool + (slot * a.kv_heads + (h - a.heads - a.kv_heads)) * a.hd;
#pragma unroll
    for (int u = 0; u < 2 * P; ++u) dst[lane + 32 * u] = src[lane + 32 * u];
    return;
  }
  const bool is_q = h < a.heads;
  if (!is_q && !capacity_ok) return;
  float y0[P], y1[P];
  rope_norm_warp<P>(src, is_q ? a.q_norm : a.k_norm, a.eps, a.positions[t], a.inv_freq,
                    a.attention_scaling, y0, y1);
  __nv_bfloat16* dst = is_q ? a.q_out + (t * a.heads + h) * a.hd
                            : a.k_pool + (slot * a.kv_heads + (h - a.heads)) * a.hd;
#pragma unroll
  for (int u = 0; u < P; ++u) {
    dst[lane + 32 * u] = __float2bfloat16_rn(y0[u]);
    dst[lane + 32 * u + half] = __float2bfloat16_rn(y1[u]);
  }
}

// Other head dims:
// grid (n, heads + 2 kv_heads), hd / 2 threads: block = one head of one row; thread i holds
// the rotate-half pair (i, i + hd/2).
__global__ void prologue_kernel(PrologueArgs a) {
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, half = static_cast<int>(a.hd / 2), i = threadIdx.x;
  const int64_t width = (a.heads + 2 * a.kv_heads) * a.hd;
  const __nv_bfloat16* src = a.qkv + t * width + h * a.hd;
  float x0 = __bfloat162float(src[i]), x1 = __bfloat162float(src[i + half]);
  const int64_t slot = a.slots[t];
  const int64_t capacity_ok = slot >= 0 && slot < a.capacity;
  if (h >= a.heads + a.kv_heads) {  // v: straight into the pool
    if (!capacity_ok) {
      if (i == 0) report_slot_fault(a.fault, FaultOp::kAttentionPrologue, slot, a.capacity);
      return;
    }
    __nv_bfloat16* dst = a.v_pool + (slot * a.kv_heads + (h - a.heads - a.kv_heads)) * a.hd;
    dst[i] = src[i];
    dst[i + half] = src[i + half];
    return;
  }
  const bool is_q = h < a.heads;
  const float* norm = is_q ? a.q_norm : a.k_norm;
  if (norm) {
    __shared__ float partial[8];
    float ss = x0 * x0 + x1 * x1;
    ss = warp_sum(ss);
    const int warp = i >> 5, nw = (half + 31) >> 5;
    if ((i & 31) == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < nw; ++w) total += partial[w];
    const float inv = 1.0f / sqrtf(total / static_cast<float>(a.hd) + a.eps);
    x0 = x0 * inv * norm[i];
    x1 = x1 * inv * norm[i + half];
  }
  const float angle = static_cast<float>(a.positions[t]) * a.inv_freq[i];
  float sn, cs;
  sincosf(angle, &sn, &cs);
  cs *= a.attention_scaling;
  sn *= a.attention_scaling;
  const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
  __nv_bfloat16* dst;
  if (is_q) {
    dst = a.q_out + (t * a.heads + h) * a.hd;
  } else {
    if (!capacity_ok) return;
    dst = a.k_pool + (slot * a.kv_heads + (h - a.heads)) * a.hd;
  }
  dst[i] = __float2bfloat16_rn(y0);
  dst[i + half] = __float2bfloat16_rn(y1);
}

// y[r, c] = silu(gu[r, c]) * gu[r, i + c].
__global__ void swiglu_kernel(__nv_bfloat16* y, const __nv_bfloat16* gu, int64_t rows,
                              int64_t i_dim) {
  griddep_launch();  // the next kernel (a GEMM) may start streaming its weights
  griddep_wait();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < rows * i_dim;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / i_dim, c = e - r * i_dim;
    const float g = __bfloat162float(gu[r * 2 * i_dim + c]);
    const float u = __bfloat162float(gu[r * 2 * i_dim + i_dim + c]);
    y[e] = __float2bfloat16_rn(swiglu_f(g, u));
  }
}

}  // namespace

bool split_attention_supported(const AttentionArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.t == Elem::kBF16 && a.block_table != nullptr && a.hd % 8 == 0 && a.hd <= 256 &&
         a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.num_seqs >= 1 && aligned(a.q) &&
         aligned(a.k) && aligned(a.v);
}

size_t split_attention_workspace(int64_t rows, int64_t heads, int64_t hd, int64_t max_kv_len) {
  const int64_t splits = (max_kv_len + kSplitKeys - 1) / kSplitKeys;
  return static_cast<size_t>(splits * rows * heads) * (hd + 2) * sizeof(float);
}

namespace {

// The split kernel of the launches (set_split_kernel): 1 to 4, and v2's forced chunks per block
// (0: chosen by occupancy). v4 (tensor cores) with 16-vector tiles by default since session 23:
// at 16 verify rows it takes about half of v3's time and brings the verify step to issue 17's
// 1.08x of decode, decode and the batch-32 step unchanged (docs/BENCHMARKS.md, session 23); with
// 64-vector tiles it was slower inside the steps (sessions 10-12). v2 is slower than v1 / v3.
std::atomic<int> g_split_version{kDefaultSplitVersion};
std::atomic<int> g_split_chunks{0};
std::atomic<int> g_split_diag{0};             // kDiag* bits (set_split_diag)
std::atomic<int> g_split_qpt{0};              // set_split_qpt: 0 picks by the launch
std::atomic<int> g_split_mma_tile{kMmaTile};  // set_split_mma_tile: v4's query vectors a block

// Chunks per v2 block: enough blocks to fill the device once (resident blocks by occupancy),
// each running the fewest chunks that takes, at most kAutoGroupChunks (the launch bound may be
// far above the actual lengths, which only the device knows: a cap keeps the blocks of short
// sequences spread over the SMs); forced (set_split_kernel): up to kMaxGroupChunks.
template <typename Kernel>
int64_t group_chunks(Kernel kernel, size_t smem, std::atomic<int>& cached, int64_t splits,
                     int64_t blocks_per_split) {
  int64_t chunks = g_split_chunks.load(std::memory_order_relaxed);
  if (chunks <= 0) {
    static const int sms = [] {
      int device = 0, count = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return 1;
      }
      return count > 0 ? count : 1;
    }();
    // Resident blocks per SM, asked once (`cached`: per kernel and head dim).
    int per_sm = cached.load(std::memory_order_relaxed);
    if (per_sm <= 0) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kSplitThreads, smem) !=
              cudaSuccess ||
          per_sm < 1) {
        per_sm = 1;
      }
      cached.store(per_sm, std::memory_order_relaxed);
    }
    const int64_t resident = static_cast<int64_t>(sms) * per_sm;
    chunks = (splits * blocks_per_split + resident - 1) / resident;
    if (chunks > kAutoGroupChunks) chunks = kAutoGroupChunks;
  }
  const int64_t most = splits < kMaxGroupChunks ? splits : kMaxGroupChunks;
  return chunks < 1 ? 1 : (chunks > most ? most : chunks);
}

// Launches split_kernel<QPT, P> over grid (splits, y, z), or split_kernel_v2<QPT, P> over the
// same chunks grouped (setting the shared-memory limit on first use).
template <int QPT, int HD, bool FUSED>
cudaError_t launch_split_v3(dim3 grid, cudaStream_t s, const AttentionArgs& a,
                            const PrologueArgs& p, const int32_t* kv_len_dev, float* part_o,
                            float* part_ml) {
  const size_t smem = split_smem_bytes_v3(HD, 2 * QPT);
  static const cudaError_t configured =
      cudaFuncSetAttribute(split_kernel_v3<QPT, HD, FUSED>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (configured != cudaSuccess) return configured;
  return launch_pdl(split_kernel_v3<QPT, HD, FUSED>, grid, dim3(kSplitThreads), smem, s, a, p,
                    kv_len_dev, g_split_diag.load(std::memory_order_relaxed), part_o, part_ml);
}

// v4 over grid (splits, kv_heads, num_seqs * tiles of TILE query vectors), shared memory for the
// m-tiles the launch's tiles use (setting the limit for a full tile on first use).
template <int HD, int TILE>
cudaError_t launch_split_mma(cudaStream_t s, const AttentionArgs& a, const PrologueArgs& p,
                             bool fused, const int32_t* kv_len_dev, float* part_o, float* part_ml) {
  const int64_t vectors = a.n * (a.heads / a.kv_heads);
  const int64_t tiles = (vectors + TILE - 1) / TILE;
  if (tiles * a.num_seqs > 65535) return cudaErrorInvalidValue;  // gridDim.z limit
  const int m_tiles = static_cast<int>(std::min<int64_t>(vectors, TILE) + 15) / 16;
  const dim3 grid(static_cast<unsigned>((a.kv_len + kSplitKeys - 1) / kSplitKeys),
                  static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(a.num_seqs * tiles));
  const size_t smem = split_smem_bytes_mma(HD, m_tiles);
  const int most = static_cast<int>(split_smem_bytes_mma(HD, TILE / 16));
  static const cudaError_t configured_unfused = cudaFuncSetAttribute(
      split_kernel_mma<HD, false, TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
  static const cudaError_t configured_fused = cudaFuncSetAttribute(
      split_kernel_mma<HD, true, TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
  if (configured_unfused != cudaSuccess) return configured_unfused;
  if (configured_fused != cudaSuccess) return configured_fused;
  return fused ? launch_pdl(split_kernel_mma<HD, true, TILE>, grid, dim3(kSplitThreads), smem, s, a,
                            p, kv_len_dev, part_o, part_ml)
               : launch_pdl(split_kernel_mma<HD, false, TILE>, grid, dim3(kSplitThreads), smem, s,
                            a, p, kv_len_dev, part_o, part_ml);
}

// v4 for head dim HD with the tile set_split_mma_tile chose.
template <int HD>
cudaError_t launch_split_mma(cudaStream_t s, const AttentionArgs& a, const PrologueArgs& p,
                             bool fused, const int32_t* kv_len_dev, float* part_o, float* part_ml) {
  switch (g_split_mma_tile.load(std::memory_order_relaxed)) {
    case 32:
      return launch_split_mma<HD, 32>(s, a, p, fused, kv_len_dev, part_o, part_ml);
    case 64:
      return launch_split_mma<HD, 64>(s, a, p, fused, kv_len_dev, part_o, part_ml);
    default:
      return launch_split_mma<HD, kMmaTile>(s, a, p, fused, kv_len_dev, part_o, part_ml);
  }
}

template <int QPT, int P>
cudaError_t launch_split(dim3 grid, size_t smem, cudaStream_t s, const AttentionArgs& a,
                         const PrologueArgs& p, const int32_t* kv_len_dev, float* part_o,
                         float* part_ml) {
  const int version = g_split_version.load(std::memory_order_relaxed);
  // v4's head dims other than 64 / 128 run v3 (here; v4 took 64 and 128 before).
  if (version >= 3 && (a.hd == 64 || a.hd == 128 || a.hd == 256)) {
    constexpr bool kFused = P > 0;
    if (a.hd == 64 && (!kFused || P == 1)) {
      return launch_split_v3<QPT, 64, kFused>(grid, s, a, p, kv_len_dev, part_o, part_ml);
    }
    if (a.hd == 128 && (!kFused || P == 2)) {
      return launch_split_v3<QPT, 128, kFused>(grid, s, a, p, kv_len_dev, part_o, part_ml);
    }
    if (a.hd == 256 && (!kFused || P == 4)) {
      return launch_split_v3<QPT, 256, kFused>(grid, s, a, p, kv_len_dev, part_o, part_ml);
    }
  }
  if (version != 2) {
    static const cudaError_t configured =
        cudaFuncSetAttribute(split_kernel<QPT, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(split_smem_bytes(256)));
    if (configured != cudaSuccess) return configured;
    return launch_pdl(split_kernel<QPT, P>, grid, dim3(kSplitThreads), smem, s, a, p, kv_len_dev,
                      part_o, part_ml);
  }
  static const cudaError_t configured =
      cudaFuncSetAttribute(split_kernel_v2<QPT, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(split_smem_bytes_v2(256, QPT)));
  if (configured != cudaSuccess) return configured;
  const size_t smem_v2 = split_smem_bytes_v2(a.hd, QPT);
  const int64_t splits = grid.x;
  static std::atomic<int> per_sm_of[256 / 8 + 1] = {};  // by head dim / 8 (<= 256)
  const int64_t chunks = group_chunks(split_kernel_v2<QPT, P>, smem_v2, per_sm_of[a.hd / 8], splits,
                                      static_cast<int64_t>(grid.y) * grid.z);
  const dim3 groups(static_cast<unsigned>((splits + chunks - 1) / chunks), grid.y, grid.z);
  return launch_pdl(split_kernel_v2<QPT, P>, groups, dim3(kSplitThreads), smem_v2, s, a, p,
                    kv_len_dev, static_cast<int>(chunks), part_o, part_ml);
}

template <int QPT>
cudaError_t launch_split(int P, dim3 grid, size_t smem, cudaStream_t s, const AttentionArgs& a,
                         const PrologueArgs& p, const int32_t* kv_len_dev, float* part_o,
                         float* part_ml) {
  switch (P) {
    case 1:
      return launch_split<QPT, 1>(grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
    case 2:
      return launch_split<QPT, 2>(grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
    case 4:
      return launch_split<QPT, 4>(grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
    default:
      return launch_split<QPT, 0>(grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
  }
}

// Pairs per lane of the warp prologue (rope_norm_warp) for head dim hd; 0 where it does not apply.
int warp_prologue_pairs(int64_t hd) {
  return hd == 64 || hd == 128 || hd == 256 ? static_cast<int>(hd / 64) : 0;
}

cudaError_t run_split_attention(const AttentionArgs& a, const PrologueArgs* prologue,
                                const int32_t* kv_len_dev, void* workspace, cudaStream_t s) {
  if (a.n <= 0 || a.heads <= 0) return cudaSuccess;
  if (!split_attention_supported(a)) return cudaErrorInvalidValue;
  const int64_t splits = (a.kv_len + kSplitKeys - 1) / kSplitKeys;
  if (splits <= 0) return cudaSuccess;
  const int64_t group = a.heads / a.kv_heads;
  // Queries per thread: small tiles (more blocks, shorter chains) for decode and verify rows.
  const int64_t total_q = a.n * group;
  const int forced_qpt = g_split_qpt.load(std::memory_order_relaxed);
  const int qpt = forced_qpt > 0 ? forced_qpt : (total_q <= 4 ? 2 : (total_q <= 16 ? 4 : 8));
  const int64_t tiles = (total_q + 2 * qpt - 1) / (2 * qpt);
  if (tiles * a.num_seqs > 65535) return cudaErrorInvalidValue;  // gridDim.z limit
  const int64_t rows = a.num_seqs * a.n;
  float* part_o = static_cast<float*>(workspace);
  float* part_ml = part_o + splits * rows * a.heads * a.hd;
  const size_t smem = split_smem_bytes(a.hd);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.kv_heads),
                  static_cast<unsigned>(a.num_seqs * tiles));
  const PrologueArgs p = prologue ? *prologue : PrologueArgs{};
  const int P = prologue ? warp_prologue_pairs(a.hd) : 0;
  cudaError_t err;
  if (g_split_version.load(std::memory_order_relaxed) == 4 && (a.hd == 64 || a.hd == 128)) {
    err = a.hd == 64 ? launch_split_mma<64>(s, a, p, P > 0, kv_len_dev, part_o, part_ml)
                     : launch_split_mma<128>(s, a, p, P > 0, kv_len_dev, part_o, part_ml);
  } else if (qpt == 2) {
    err = launch_split<2>(P, grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
  } else if (qpt == 4) {
    err = launch_split<4>(P, grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
  } else {
    err = launch_split<8>(P, grid, smem, s, a, p, kv_len_dev, part_o, part_ml);
  }
  if (err != cudaSuccess) return err;
  if (g_split_diag.load(std::memory_order_relaxed) & kDiagNoCombine) return cudaSuccess;
  const size_t combine_smem =
      static_cast<size_t>(combine_array_floats(a.kv_len)) * 2 * sizeof(float);
  const int threads = a.hd >= 128 ? 128 : 64;
  return launch_pdl(combine_kernel, dim3(static_cast<unsigned>(rows * a.heads)), dim3(threads),
                    combine_smem, s, a, kv_len_dev, part_o, part_ml);
}

}  // namespace

void set_split_kernel(int version, int chunks_per_block) {
  g_split_version.store(version >= 2 && version <= 4 ? version : 1, std::memory_order_relaxed);
  g_split_chunks.store(chunks_per_block > 0 ? chunks_per_block : 0, std::memory_order_relaxed);
}

void set_split_diag(int bits) { g_split_diag.store(bits, std::memory_order_relaxed); }

void set_split_mma_tile(int vectors) {
  const bool listed = vectors == 16 || vectors == 32 || vectors == 64;
  g_split_mma_tile.store(listed ? vectors : kMmaTile, std::memory_order_relaxed);
}

void set_split_qpt(int queries_per_thread) {
  const int q = queries_per_thread;
  g_split_qpt.store(q == 2 || q == 4 || q == 8 ? q : 0, std::memory_order_relaxed);
}

cudaError_t split_attention(const AttentionArgs& a, const int32_t* kv_len_dev, void* workspace,
                            cudaStream_t s) {
  return run_split_attention(a, nullptr, kv_len_dev, workspace, s);
}

bool prologue_attention_supported(const AttentionArgs& a, const PrologueArgs& p) {
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return split_attention_supported(a) && warp_prologue_pairs(a.hd) > 0 && p.hd == a.hd &&
         p.heads == a.heads && p.kv_heads == a.kv_heads && p.n == a.num_seqs * a.n &&
         a.k == p.k_pool && a.v == p.v_pool && aligned(p.qkv);
}

cudaError_t prologue_attention(const AttentionArgs& a, const PrologueArgs& p,
                               const int32_t* kv_len_dev, void* workspace, cudaStream_t s) {
  if (!prologue_attention_supported(a, p)) return cudaErrorInvalidValue;
  return run_split_attention(a, &p, kv_len_dev, workspace, s);
}

cudaError_t attention_prologue(const PrologueArgs& a, cudaStream_t s) {
  if (a.n <= 0) return cudaSuccess;
  if (const int pairs = warp_prologue_pairs(a.hd); pairs > 0) {
    const int64_t vectors = a.n * (a.heads + 2 * a.kv_heads);
    const dim3 grid(static_cast<unsigned>((vectors + 3) / 4));
    switch (pairs) {
      case 1:
        return launch_pdl(prologue_warp_kernel<1>, grid, dim3(128), 0, s, a);
      case 2:
        return launch_pdl(prologue_warp_kernel<2>, grid, dim3(128), 0, s, a);
      default:
        return launch_pdl(prologue_warp_kernel<4>, grid, dim3(128), 0, s, a);
    }
  }
  if (a.hd % 2 != 0 || a.hd / 2 > 256 || a.hd / 2 < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads + 2 * a.kv_heads));
  return launch_pdl(prologue_kernel, grid, dim3(static_cast<unsigned>(a.hd / 2)), 0, s, a);
}

cudaError_t swiglu(void* y, const void* gate_up, int64_t rows, int64_t i_dim, cudaStream_t s) {
  const int64_t total = rows * i_dim;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256 < 65536 ? (total + 255) / 256 : 65536;
  return launch_pdl(swiglu_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, s,
                    static_cast<__nv_bfloat16*>(y), static_cast<const __nv_bfloat16*>(gate_up),
                    rows, i_dim);
}

}  // namespace bs::cuda
