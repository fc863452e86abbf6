// Fused kernels of the drafters' sequential modules (issue 14): DSpark's Markov chain
// (markov_row: bias GEMV + logits + argmax in one launch per row), the candidate walk shared by
// DFlash2's selector and DSpark's top-t chain (one block walks every row of a request: gathers,
// rank-r scores, argmax or the filtered draw), and a two-stage top-k for short k over long rows.
// Launch wrappers are declared in kernels.h; the rules are Backend::markov_row / candidate_walk /
// topk (backend.h). Nothing here allocates or synchronises: scratch comes from the caller.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace bs::cuda {
namespace {

__device__ __forceinline__ float ldw(In a, int64_t i) {
  switch (a.t) {
    case Elem::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(a.p)[i]);
    case Elem::kF32:
      return static_cast<const float*>(a.p)[i];
    case Elem::kF16:
      return __half2float(static_cast<const __half*>(a.p)[i]);
    default: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(a.p)[i];
      return static_cast<float>(v);
    }
  }
}

// (value, index) as one ordered key: a larger key is a larger value, then a smaller index.
__device__ __forceinline__ uint64_t order_key(float v, uint32_t idx) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xFFFFFFFFu - idx);
}
__device__ __forceinline__ int32_t key_index(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}
__device__ __forceinline__ uint64_t warp_max_key(uint64_t k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, k, o);
    k = other > k ? other : k;
  }
  return k;
}

// ---- markov_row ----
// Block: 8 warps; warp w of block b takes the 4 vocabulary rows from (b * 8 + w) * 4, then the
// 4 from there + gridDim.x * 32, and so on. The Markov embedding e = w1[prev] sits in shared
// memory (fp32). Each block leaves its best key in keys[blockIdx.x]; the last block to finish
// reduces them into *argmax and resets *counter.
constexpr int kRowWarps = 8, kRowsPerWarp = 4;

// acc[q] = w2[ids[q]] · e for the rows with has[q] (N rows' loads in flight): lane c sums its
// columns (c, c + 32, ...; 8 per 16-byte load when vec) with one fmaf chain, then warp_sum. Every
// lane of the warp calls it with the same ids and gets the same sums; a row's sum does not depend
// on N or on the other rows, so markov_row_kernel and markov_prune_row_kernel (both use it) give
// the same bits for it.
template <int N>
__device__ __forceinline__ void markov_dots(float (&acc)[N], const int64_t (&ids)[N],
                                            const bool (&has)[N], In w2, int64_t r, bool vec,
                                            const float* e) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int q = 0; q < N; ++q) acc[q] = 0.0f;
  if (vec) {
    const uint4* w = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w2.p));
    const int64_t r8 = r / 8;
    for (int64_t c = lane; c < r8; c += 32) {
      uint4 x[N];
#pragma unroll
      for (int q = 0; q < N; ++q)
        x[q] = has[q] ? ld_stream(w + ids[q] * r8 + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < N; ++q) {
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x[q]);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float2 f = __bfloat1622float2(h[t]);
          acc[q] = fmaf(f.x, e[c * 8 + 2 * t], acc[q]);
          acc[q] = fmaf(f.y, e[c * 8 + 2 * t + 1], acc[q]);
        }
      }
    }
  } else {
    for (int64_t c = lane; c < r; c += 32) {
#pragma unroll
      for (int q = 0; q < N; ++q) {
        if (has[q]) acc[q] = fmaf(ldw(w2, ids[q] * r + c), e[c], acc[q]);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < N; ++q) acc[q] = warp_sum(acc[q]);
}

__global__ void markov_row_kernel(float* z, int32_t* argmax, In u_in, const int32_t* prev, In w1,
                                  In w2, int64_t v, int64_t r, bool vec, uint64_t* keys,
                                  unsigned* counter) {
  extern __shared__ float e[];  // [r]
  __shared__ uint64_t warp_keys[kRowWarps];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t p = prev[0];
  const bool ok = p >= 0 && p < v;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x) e[i] = ok ? ldw(w1, p * r + i) : 0.0f;
  __syncthreads();
  // kRowsPerWarp rows per iteration: that many independent 16-byte loads in flight per lane
  // (one row at a time left the stream latency-bound). Each row's sum has the same order as with
  // one row per iteration: a chain of fmaf per lane over c, then the warp sum.
  uint64_t best = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowWarps * kRowsPerWarp;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kRowWarps + warp) * kRowsPerWarp;
       row0 < v; row0 += stride) {
    int64_t ids[kRowsPerWarp];
    bool has[kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
      ids[u] = row0 + u;
      has[u] = row0 + u < v;
    }
    float acc[kRowsPerWarp];
    markov_dots<kRowsPerWarp>(acc, ids, has, w2, r, vec, e);
    // Lane u finishes row row0 + u.
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
      const int64_t row = row0 + u;
      if (lane == u && row < v) {
        const float zv = ldw(u_in, row) + acc[u];
        if (z) z[row] = zv;
        const uint64_t k = order_key(zv, static_cast<uint32_t>(row));
        best = k > best ? k : best;
      }
    }
  }
  best = warp_max_key(best);
  if (!argmax) return;
  if (lane == 0) warp_keys[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t b = 0;
    for (int w = 0; w < kRowWarps; ++w) b = warp_keys[w] > b ? warp_keys[w] : b;
    keys[blockIdx.x] = b;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint64_t b = 0;
  for (int64_t i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    const uint64_t k = *(volatile const uint64_t*)(keys + i);
    b = k > b ? k : b;
  }
  b = warp_max_key(b);
  if (lane == 0) warp_keys[warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kRowWarps; ++w) b = warp_keys[w] > b ? warp_keys[w] : b;
    *argmax = b == 0 ? 0 : key_index(b);
    *counter = 0;  // ready for the next launch (graph replays included)
  }
}

// ---- markov_chain_pruned: the greedy chain, computing z only where it can win ----
// Per row j (e = w1[prev_j], z_v = u_j[v] + w2[v] · e, markov_row's arithmetic), with v* = the
// argmax of u_j and z* = z_{v*}: by Cauchy-Schwarz |w2[v] · e| <= ||w2[v]|| ||e||, so an id whose
// u_j[v] + ||w2[v]|| ||e|| stays below z* cannot reach the row's maximum. Each id's exact z is
// computed only for the ids that pass, by markov_dots (markov_row_kernel's own dot: the same
// bits) plus the same fp32 add of u; the maximum over them is markov_row's argmax, ties included.
//
// The test, with slack for every fp32 rounding (u = 2^-24; docs/DFLASH.md repeats it):
//  - the computed dot d_v (a chain of at most m <= r + 37 roundings per lane and warp sum) obeys
//    |d_v| <= (1 + gamma_m) sum_i |w2[v, i] e_i| + m 2^-150 <= (1 + gamma_m) n_v ||e|| + tiny,
//    gamma_m = m u / (1 - m u), n_v >= ||w2[v]|| (markov_norm_bounds: rounded up);
//  - ||e|| is taken as E = fl(sqrtf(ss) * F), ss the fp32 sum of squares (relative error <=
//    gamma_{r+5}), sqrtf correctly rounded, F = 1 + 4 (r + 40) u: F covers gamma_m, the sum's and
//    the square root's errors and the products' roundings twice over, so B_v = fmaf(n_v, E,
//    1e-30) >= |d_v| (the 1e-30 covers underflow);
//  - the computed z_v = fl(u_v + d_v) >= z* needs u_v + d_v > pred(z*) (rounding is monotone and
//    pred(z*), the next float below z*, is a float), hence u_v + B_v > pred(z*) and
//    fl(u_v + B_v) >= pred(z*). So an id with fl(u_v + B_v) < pred(z*) has z_v < z* and is
//    skipped; written as !(x < tau) the test keeps every id when anything is NaN or infinite.
// v* itself always passes, and v* need not be u's argmax for the test to hold (any computed
// z_{v*} is a lower bound of the maximum).
//
// Launches: markov_u_argmax_kernel (every row's u argmax at once, one key per block), then one
// markov_prune_row_kernel per row: each block reduces row j's keys to v*, computes e, ||e|| and
// z* itself (a 256-term dot), tests its ids (u and the norms were loaded first, before the
// dependent reads), computes the survivors' z four at a time per warp, and leaves its best key;
// the last block to finish writes drafts[j] (markov_row's counter protocol).
constexpr int kPruneThreads = 256, kPruneWarps = kPruneThreads / 32;
constexpr int kPruneArgmaxPer = 8;  // u argmax: ids per thread per pass (2048 per block)
constexpr int kPrunePer = 2;        // row kernel: ids per thread per pass (512 per block)
constexpr int kPruneDots = 4;       // survivors' rows in flight per warp

// The largest key of the block in every thread (kPruneThreads threads; red [kPruneWarps]).
__device__ __forceinline__ uint64_t prune_block_max(uint64_t k, uint64_t* red) {
  k = warp_max_key(k);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = k;
  __syncthreads();
  uint64_t b = 0;
#pragma unroll
  for (int w = 0; w < kPruneWarps; ++w) b = red[w] > b ? red[w] : b;
  __syncthreads();  // red may be rewritten after this
  return b;
}

// Block (b, j): the largest order_key(u[j, id], id) over its ids -> ukeys[j * gridDim.x + b].
__global__ void __launch_bounds__(kPruneThreads)
    markov_u_argmax_kernel(uint64_t* ukeys, In u, int64_t v) {
  __shared__ uint64_t red[kPruneWarps];
  const int64_t j = blockIdx.y, chunk = kPruneThreads * kPruneArgmaxPer;
  uint64_t best = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * chunk; base < v;
       base += static_cast<int64_t>(gridDim.x) * chunk) {
    float x[kPruneArgmaxPer];
#pragma unroll
    for (int m = 0; m < kPruneArgmaxPer; ++m) {
      const int64_t id = base + m * kPruneThreads + threadIdx.x;
      x[m] = id < v ? ldw(u, j * v + id) : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < kPruneArgmaxPer; ++m) {
      const int64_t id = base + m * kPruneThreads + threadIdx.x;
      const uint64_t key = order_key(x[m], static_cast<uint32_t>(id));
      if (id < v && key > best) best = key;
    }
  }
  best = prune_block_max(best, red);
  if (threadIdx.x == 0) ukeys[j * gridDim.x + blockIdx.x] = best;
}

struct PruneRowArgs {
  int32_t* drafts;        // [k]
  const int32_t* anchor;  // [1]
  In u, w1, w2;           // [k, v], [v, r], [v, r]
  const float* norms;     // [v]
  const uint64_t* ukeys;  // [k, nb]
  uint64_t* keys;         // [gridDim.x]
  unsigned* counter;
  int64_t v, r;
  int nb;
  bool vec;
  float factor;  // F = 1 + 4 (r + 40) 2^-24
};

__global__ void __launch_bounds__(kPruneThreads)
    markov_prune_row_kernel(PruneRowArgs a, int64_t j) {
  extern __shared__ float e[];  // [r]
  __shared__ uint64_t red[kPruneWarps];
  __shared__ float s_zstar, s_ss;
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t v = a.v, r = a.r, chunk = kPruneThreads * kPrunePer;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * chunk;
  const int64_t row = j * v;
  // The first pass's u and norms: they do not depend on the chain, so they load first.
  int64_t base = static_cast<int64_t>(blockIdx.x) * chunk;
  float uu[kPrunePer], nn[kPrunePer];
  auto load = [&](int64_t b0) {
#pragma unroll
    for (int m = 0; m < kPrunePer; ++m) {
      const int64_t id = b0 + m * kPruneThreads + threadIdx.x;
      uu[m] = id < v ? ldw(a.u, row + id) : 0.0f;
      nn[m] = id < v ? a.norms[id] : 0.0f;
    }
  };
  load(base);
  const int64_t p = j == 0 ? a.anchor[0] : a.drafts[j - 1];
  const bool ok = p >= 0 && p < v;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x) e[i] = ok ? ldw(a.w1, p * r + i) : 0.0f;
  uint64_t uk = 0;
  for (int i = threadIdx.x; i < a.nb; i += blockDim.x) {
    const uint64_t k = a.ukeys[j * a.nb + i];
    uk = k > uk ? k : uk;
  }
  const int64_t vstar = key_index(prune_block_max(uk, red));  // (the barrier also covers e)
  if (warp == 0) {
    const int64_t ids[1] = {vstar};
    const bool has[1] = {vstar >= 0 && vstar < v};
    float acc[1];
    markov_dots<1>(acc, ids, has, a.w2, r, a.vec, e);
    if (lane == 0) s_zstar = (has[0] ? ldw(a.u, row + vstar) : -INFINITY) + acc[0];
  } else if (warp == 1) {
    float ss = 0.0f;
    for (int64_t i = lane; i < r; i += 32) ss = fmaf(e[i], e[i], ss);
    ss = warp_sum(ss);
    if (lane == 0) s_ss = ss;
  }
  __syncthreads();
  const float tau = nextafterf(s_zstar, -INFINITY);
  const float en = sqrtf(s_ss) * a.factor;
  uint64_t best = 0;
  for (; base < v; base += stride) {
    bool keep[kPrunePer];
#pragma unroll
    for (int m = 0; m < kPrunePer; ++m) {
      const int64_t id = base + m * kPruneThreads + threadIdx.x;
      keep[m] = id < v && !(uu[m] + fmaf(nn[m], en, 1e-30f) < tau);
    }
#pragma unroll
    for (int m = 0; m < kPrunePer; ++m) {
      // The warp's survivors among ids wbase .. wbase + 31, kPruneDots at a time (lowest first).
      const int64_t wbase = base + m * kPruneThreads + warp * 32;
      unsigned mask = __ballot_sync(0xffffffffu, keep[m]);
      while (mask) {
        int64_t ids[kPruneDots];
        bool has[kPruneDots];
        int src[kPruneDots];
#pragma unroll
        for (int q = 0; q < kPruneDots; ++q) {
          has[q] = mask != 0;
          src[q] = has[q] ? __ffs(mask) - 1 : 0;
          ids[q] = wbase + src[q];
          mask &= mask - 1;
        }
        float acc[kPruneDots];
        markov_dots<kPruneDots>(acc, ids, has, a.w2, r, a.vec, e);
#pragma unroll
        for (int q = 0; q < kPruneDots; ++q) {
          const float uv = __shfl_sync(0xffffffffu, uu[m], src[q]);  // u[row + ids[q]]
          const uint64_t k = order_key(uv + acc[q], static_cast<uint32_t>(ids[q]));
          if (has[q] && k > best) best = k;
        }
      }
    }
    if (base + stride < v) load(base + stride);
  }
  best = prune_block_max(best, red);
  if (threadIdx.x == 0) {
    a.keys[blockIdx.x] = best;
    __threadfence();
    last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint64_t b = 0;
  for (int64_t i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    const uint64_t k = *(volatile const uint64_t*)(a.keys + i);
    b = k > b ? k : b;
  }
  b = prune_block_max(b, red);
  if (threadIdx.x == 0) {
    a.drafts[j] = b == 0 ? 0 : key_index(b);
    *a.counter = 0;  // ready for the next launch (graph replays included)
  }
}

// ---- candidate_walk ----
// One block of kWalkThreads threads walks all k rows; warp w scores candidates w, w + 8, ...
// Shared memory (walk_smem): av[r], sc[r] (scale row), s[t], w[t], q[t], ids[t], and when staged
// e[t, r] (the row's candidates' succ rows).
constexpr int kWalkThreads = 256;

// The greedy choice among t scored candidates: the first slot of the largest score, equal scores
// to the lower id (a NaN score never wins a comparison, so the scan order decides around it).
__device__ __forceinline__ int64_t greedy_slot(const float* s, const int32_t* ids, int64_t t) {
  int64_t b = 0;
  for (int64_t c = 1; c < t; ++c) {
    if (s[c] > s[b] || (s[c] == s[b] && ids[c] < ids[b])) b = c;
  }
  return b;
}

// The candidate term of every row j for every predecessor it can have: the dot of
// A[pred] ⊙ scale_j with the succ row of each candidate c of row j, for pred = the anchor (row 0)
// or pred = candidate p of row j - 1 (rows >= 1): table[(j * t + p) * t + c]. None of it depends
// on the walk's choices, so all of it runs in parallel here (block (j, p), warp w takes candidates
// w, w + 8, ...) and the walk only looks its row up. The arithmetic is the walk's own (the same
// products in the same lane order, the same warp sum), so a looked-up score equals the one the walk
// would compute. The blocks also fill `rows` with -inf (the walk's scatter target) on the way.
// best (t <= 32, else null): the greedy choice of row j after predecessor p, best[j * t + p] = the
// slot c of the largest vals[j, c] + table[(j * t + p) * t + c], equal scores to the lower id (the
// block walk's serial scan, NaN included), so that the greedy walk is a chase through best.
__global__ void walk_pairs_kernel(WalkArgs a, float* table, int32_t* best) {
  griddep_wait();  // launched with launch_pdl: the inputs come from the kernels before
  griddep_launch();
  extern __shared__ float sm[];
  float* av = sm;        // [r]: A[pred]
  float* sc = av + a.r;  // [r]: the scale row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t t = a.t, r = a.r, j = blockIdx.x / t, p = blockIdx.x % t;
  if (a.rows) {
    const int64_t n = a.k * a.v;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      a.rows[i] = -INFINITY;
    }
  }
  if (j == 0 && p > 0) return;  // row 0 has one predecessor: the anchor
  const int64_t prev = j == 0 ? a.anchor[0] : a.ids[(j - 1) * t + p];
  const bool ok_prev = prev >= 0 && prev < a.vocab;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x) {
    av[i] = ok_prev ? ldw(a.pred, prev * r + i) : 0.0f;
    sc[i] = a.scale.p ? ldw(a.scale, j * r + i) : 1.0f;
  }
  __syncthreads();
  __shared__ float scores[32];  // vals + term (best only)
  for (int64_t c = warp; c < t; c += warps) {
    const int64_t id = a.ids[j * t + c];
    const bool ok = id >= 0 && id < a.vocab;
    float dot = 0.0f;
    for (int64_t i = lane; i < r; i += 32) {
      const float b = ok ? ldw(a.succ, id * r + i) : 0.0f;
      dot += ok ? av[i] * b * sc[i] : 0.0f;
    }
    dot = warp_sum(dot);
    if (lane == 0) {
      table[(j * t + p) * t + c] = dot;
      if (best) scores[c] = a.vals[j * t + c] + dot;  // the walk's expression
    }
  }
  if (!best) return;
  __syncthreads();
  if (threadIdx.x == 0)
    best[j * t + p] = static_cast<int32_t>(greedy_slot(scores, a.ids + j * t, t));
}

// table: walk_pairs_kernel's (null: every row computes its own candidate terms). With it, the
// shared memory also holds every row's values and ids and the table itself (tab[k, t, t]): the
// sequential part then reads nothing from global memory but A[prev] / succ rows in the rare case
// that a predecessor is not among the previous row's candidates (a sampled row with no mass).
__global__ void candidate_walk_kernel(WalkArgs a, bool staged, const float* table) {
  griddep_wait();  // launched with launch_pdl: the inputs come from the kernels before
  griddep_launch();
  extern __shared__ float sm[];
  float* av = sm;                                      // [r]: A[prev]
  float* sc = av + a.r;                                // [r]: the scale row
  float* s = sc + a.r;                                 // [t] scores
  float* w = s + a.t;                                  // [t] weights
  float* q = w + a.t;                                  // [t] probabilities
  int32_t* ids = reinterpret_cast<int32_t*>(q + a.t);  // [t] this row's candidate ids
  float* e = q + 2 * a.t;                              // [t, r] succ rows (staged)
  // Tabled: all_vals [k, t], all_ids [k, t], tab [k, t, t] after e (or after ids, not staged).
  float* all_vals = e + (staged ? a.t * a.r : 0);
  int32_t* all_ids = reinterpret_cast<int32_t*>(all_vals + a.k * a.t);
  float* tab = reinterpret_cast<float*>(all_ids + a.k * a.t);
  __shared__ int32_t s_prev, s_slot;
  __shared__ float s_max, s_tp;
  __shared__ double s_zk, s_z;
  __shared__ int s_any;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const bool sampled = a.filter.temperature > 0.0f;
  const int64_t t = a.t, r = a.r;
  if (threadIdx.x == 0) s_prev = a.anchor[0];
  if (table) {  // one round of loads for the whole walk
    for (int64_t i = threadIdx.x; i < a.k * t; i += blockDim.x) {
      all_vals[i] = a.vals[i];
      all_ids[i] = a.ids[i];
    }
    for (int64_t i = threadIdx.x; i < a.k * t * t; i += blockDim.x) tab[i] = table[i];
  }
  __syncthreads();
  for (int64_t j = 0; j < a.k; ++j) {
    const int64_t prev = s_prev;
    if (table) {
      // The predecessor's slot among row j - 1's candidates (row 0: the anchor's, 0); the first
      // match (every matching slot holds the same terms: they depend on the id only).
      if (threadIdx.x == 0) s_slot = j == 0 ? 0 : INT_MAX;
      __syncthreads();
      if (j > 0) {
        for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
          if (all_ids[(j - 1) * t + c] == prev) atomicMin(&s_slot, static_cast<int32_t>(c));
        }
        __syncthreads();
      }
      const int32_t slot = s_slot;
      if (slot != INT_MAX) {
        for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
          ids[c] = all_ids[j * t + c];
          s[c] = all_vals[j * t + c] + tab[(j * t + slot) * t + c];
        }
        __syncthreads();
        goto scored;
      }
    }
    {
      // Round 1 (independent loads): A[prev], the scale row, the ids and the unary values.
      const bool ok_prev = prev >= 0 && prev < a.vocab;
      for (int64_t i = threadIdx.x; i < r; i += blockDim.x) {
        av[i] = ok_prev ? ldw(a.pred, prev * r + i) : 0.0f;
        sc[i] = a.scale.p ? ldw(a.scale, j * r + i) : 1.0f;
      }
      for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
        ids[c] = a.ids[j * t + c];
        s[c] = a.vals[j * t + c];
      }
      __syncthreads();
      if (staged && r > 0) {
        // Round 2: the candidates' succ rows into shared memory, 8 loads in flight per thread.
        const int64_t n = t * r, step = static_cast<int64_t>(blockDim.x);
        for (int64_t base = threadIdx.x; base < n; base += step * 8) {
          float v[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int64_t idx = base + u * step;
            float x = 0.0f;
            if (idx < n) {
              const int64_t id = ids[idx / r];
              if (id >= 0 && id < a.vocab) x = ldw(a.succ, id * r + idx % r);
            }
            v[u] = x;
          }
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            if (base + u * step < n) e[base + u * step] = v[u];
          }
        }
        __syncthreads();
      }
      for (int64_t c = warp; c < t; c += warps) {
        float dot = 0.0f;
        if (r > 0) {
          const int64_t id = ids[c];
          const bool ok = id >= 0 && id < a.vocab;
          for (int64_t i = lane; i < r; i += 32) {
            const float b = staged ? e[c * r + i] : (ok ? ldw(a.succ, id * r + i) : 0.0f);
            dot += ok ? av[i] * b * sc[i] : 0.0f;
          }
          dot = warp_sum(dot);
        }
        if (lane == 0) s[c] += dot;
      }
      __syncthreads();
    }
  scored:
    if (threadIdx.x == 0) {  // the maximum (greedy: the draft; ties to the lower id)
      const int64_t b = greedy_slot(s, ids, t);
      s_max = s[b];
      if (!sampled) s_prev = ids[b];
    }
    __syncthreads();
    if (a.rows) {
      for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
        const int64_t id = ids[c];
        if (id >= 0 && id < a.v) a.rows[j * a.v + id] = s[c];
      }
    }
    if (sampled) {
      // sampling::filtered_probs on the row (candidates at s, -inf elsewhere), per candidate.
      const float m = s_max, temp = a.filter.temperature;
      const bool top_k = a.filter.top_k > 0 && a.filter.top_k < a.v;
      for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
        bool keep = true;
        if (top_k) {  // kept iff fewer than top_k logits are larger (the k-th largest with ties)
          int64_t larger = 0;
          for (int64_t o = 0; o < t; ++o) larger += s[o] > s[c];
          keep = larger < a.filter.top_k;
        }
        w[c] = keep && m > -INFINITY ? expf(__fdiv_rn(s[c] - m, temp)) : 0.0f;
        q[c] = keep ? 1.0f : 0.0f;  // the top-k mask until the end
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        double zk = 0.0;
        for (int64_t c = 0; c < t; ++c) zk += q[c] > 0.0f ? w[c] : 0.0f;
        s_zk = zk;
        s_tp = -INFINITY;
        s_any = 0;
      }
      __syncthreads();
      float tp = -INFINITY;
      if (a.filter.top_p < 1.0f) {
        // t_p = the largest kept value whose kept mass at or above it reaches top_p * Z_k.
        const double target = static_cast<double>(a.filter.top_p) * s_zk;
        for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
          if (q[c] == 0.0f) continue;
          double mass = 0.0;
          for (int64_t o = 0; o < t; ++o) mass += q[o] > 0.0f && s[o] >= s[c] ? w[o] : 0.0f;
          if (mass >= target) {
            atomicMax(reinterpret_cast<int*>(&s_any), 1);
            // float max through the ordered int trick is overkill for t <= 1024: a CAS loop
            float old = s_tp;
            while (s[c] > old) {
              const int got = atomicCAS(reinterpret_cast<int*>(&s_tp), __float_as_int(old),
                                        __float_as_int(s[c]));
              if (got == __float_as_int(old)) break;
              old = __int_as_float(got);
            }
          }
        }
        __syncthreads();
        tp = s_any ? s_tp : -INFINITY;
      }
      if (threadIdx.x == 0) {
        double z = 0.0;
        for (int64_t c = 0; c < t; ++c) z += q[c] > 0.0f && s[c] >= tp ? w[c] : 0.0f;
        s_z = z;
      }
      __syncthreads();
      const float inv = static_cast<float>(1.0 / s_z);
      __syncthreads();
      for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
        q[c] = q[c] > 0.0f && s[c] >= tp ? w[c] * inv : 0.0f;
      }
      __syncthreads();
      for (int64_t c = threadIdx.x; c < t; c += blockDim.x) {
        const int64_t id = ids[c];
        if (id >= 0 && id < a.v) a.probs[j * a.v + id] = q[c];
      }
      if (threadIdx.x == 0) {
        // sampling::draw_index over the row: the CDF in token-id order.
        double total = 0.0;
        for (int64_t c = 0; c < t; ++c) total += q[c] > 0.0f ? q[c] : 0.0f;
        int32_t d = 0;
        if (total > 0.0) {
          const double target = static_cast<double>(a.uniforms[j]) * total;
          int32_t first = INT_MAX, last = -1;
          for (int64_t c = 0; c < t; ++c) {
            if (!(q[c] > 0.0f)) continue;
            double cum = 0.0;
            for (int64_t o = 0; o < t; ++o) cum += q[o] > 0.0f && ids[o] <= ids[c] ? q[o] : 0.0f;
            if (cum > target && ids[c] < first) first = ids[c];
            if (ids[c] > last) last = ids[c];
          }
          d = first != INT_MAX ? first : last;
        }
        s_prev = d;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) a.drafts[j] = s_prev;
    __syncthreads();
  }
}

// The greedy walk for t <= 32 (DFlash2: t = 16) over walk_pairs_kernel's choices: row j's draft is
// candidate best[j, slot_j] of row j, where slot_0 = 0 (the anchor) and slot_{j+1} is the first
// candidate of row j equal to that draft (a ballot; the block walk's predecessor slot). Warp 0
// chases the k rows through shared memory (one dependent lookup per row: 2.1 us a draft on the
// H200, where a walk that scored each row on the chain took 11.2 us), then the block scatters the
// chosen rows' scores into `rows` (over walk_pairs_kernel's -inf fill): the block walk's drafts
// and rows.
__global__ void candidate_chase_greedy_kernel(WalkArgs a, const float* table, const int32_t* best) {
  griddep_wait();  // launched with launch_pdl: the inputs come from the kernels before
  griddep_launch();
  extern __shared__ int32_t chase_sm[];
  const int k = static_cast<int>(a.k), t = static_cast<int>(a.t);
  int32_t* all_best = chase_sm;         // [k, t]
  int32_t* all_ids = all_best + k * t;  // [k, t]
  int32_t* slots = all_ids + k * t;     // [k]
  for (int i = threadIdx.x; i < k * t; i += blockDim.x) {
    all_best[i] = best[i];
    all_ids[i] = a.ids[i];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int slot = 0;
    for (int j = 0; j < k; ++j) {
      const int c = all_best[j * t + slot];
      const int32_t id = all_ids[j * t + c];
      if (lane == 0) {
        slots[j] = slot;
        a.drafts[j] = id;
      }
      const unsigned match = __ballot_sync(0xffffffffu, lane < t && all_ids[j * t + lane] == id);
      slot = __ffs(match) - 1;  // never -1: c matches
    }
  }
  if (!a.rows) return;
  __syncthreads();
  for (int i = threadIdx.x; i < k * t; i += blockDim.x) {
    const int j = i / t, c = i % t;
    const int32_t id = all_ids[i];
    if (id >= 0 && id < a.v) {
      a.rows[static_cast<int64_t>(j) * a.v + id] = a.vals[i] + table[(j * t + slots[j]) * t + c];
    }
  }
}

// ---- two-stage top-k (k <= kTopkFastK) ----
// Stage 1: block (chunk, row) takes the top k of kTopkChunk entries by k passes (the order: value
// descending, index ascending, as one key: order_key; each pass picks the largest key below the
// previous pick). Each thread holds its kTopkChunk / kTopkThreads keys in registers; entries past
// the row end are (-inf, INT_MAX): after every real one. Stage 2: one block per row does the same
// over the chunks' candidates (keys in shared memory).
constexpr int kTopkChunk = 4096, kTopkThreads = 256, kTopkPerThread = kTopkChunk / kTopkThreads;

// The largest of every thread's `best` (0: none), in every thread: one barrier per call (red is
// double-buffered by the caller's pass parity: a buffer is rewritten two passes later, after
// every thread has passed the barrier between).
__device__ __forceinline__ uint64_t block_max_key(uint64_t best, uint64_t (*red)[kTopkThreads / 32],
                                                  int parity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  best = warp_max_key(best);
  if (lane == 0) red[parity][warp] = best;
  __syncthreads();
  uint64_t b = 0;
#pragma unroll
  for (int w = 0; w < kTopkThreads / 32; ++w) b = red[parity][w] > b ? red[parity][w] : b;
  return b;
}

__device__ __forceinline__ void store_pick(uint64_t pick, float* out_val, int32_t* out_idx, int j) {
  const uint32_t ordered = static_cast<uint32_t>(pick >> 32);
  const uint32_t u = (ordered & 0x80000000u) ? (ordered & 0x7FFFFFFFu) : ~ordered;
  out_val[j] = __uint_as_float(u);
  out_idx[j] = key_index(pick);
}

// The 32 lanes' keys sorted descending across the lanes (lane 0 the largest): a bitonic network.
__device__ __forceinline__ uint64_t warp_sort_desc(uint64_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xffffffffu, v, stride);
      const uint64_t hi = o > v ? o : v, lo = o > v ? v : o;
      v = ((lane & stride) == 0) == ((lane & size) == 0) ? hi : lo;
    }
  }
  return v;
}

// The k largest of n distinct keys in descending order: thread i counts the keys above keys[i],
// its rank, and stores its key at that slot when the rank is below k; one pass, where picking
// them one at a time takes k dependent reductions.
__device__ __forceinline__ void rank_picks(const uint64_t* keys, int n, int k, float* out_val,
                                           int32_t* out_idx) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t mine = keys[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += keys[j] > mine;
    if (rank < k) store_pick(mine, out_val, out_idx, rank);
  }
}

// Stage 1's filter (k <= 32): a threshold key thr such that at least k keys of the chunk are >=
// thr, so the chunk's top k are all among the keys >= thr, whatever thr is: per warp the k-th
// largest of its 32 threads' maxima (k threads hold a key >= it each), thr = the largest over the
// warps. Those keys (~150 of 4096 for k = 16 and independent values) go to shared memory and one
// warp picks the k largest by k shuffle passes, no block barriers; the same rule as the block
// passes (the largest key below the previous pick), so the same picks. When fewer than k or more
// than kTopkCands keys pass, the block passes run as before. (The keys are distinct but for the
// padding past the row end, the smallest key: a threshold above it passes distinct keys only, one
// equal to it passes the whole chunk.)
constexpr int kTopkCands = 256;

__global__ void __launch_bounds__(kTopkThreads)
    topk_chunk_kernel(float* cand_val, int32_t* cand_idx, In x, int64_t v, int k) {
  griddep_wait();  // launched with launch_pdl: the inputs come from the kernels before
  griddep_launch();
  __shared__ uint64_t red[2][kTopkThreads / 32];
  __shared__ uint64_t cands[kTopkCands];
  __shared__ int s_count;
  const int64_t row = blockIdx.y, c0 = static_cast<int64_t>(blockIdx.x) * kTopkChunk;
  uint64_t keys[kTopkPerThread];
#pragma unroll
  for (int m = 0; m < kTopkPerThread; ++m) {
    const int64_t c = c0 + threadIdx.x + m * kTopkThreads;
    keys[m] = c < v ? order_key(ldw(x, row * v + c), static_cast<uint32_t>(c))
                    : order_key(-INFINITY, static_cast<uint32_t>(INT_MAX));
  }
  const int64_t o = (row * gridDim.x + blockIdx.x) * k;
  if (k <= 32) {
    if (threadIdx.x == 0) s_count = 0;
    uint64_t mx = 0;
#pragma unroll
    for (int m = 0; m < kTopkPerThread; ++m) mx = keys[m] > mx ? keys[m] : mx;
    const uint64_t kth = __shfl_sync(0xffffffffu, warp_sort_desc(mx), k - 1);
    const uint64_t thr = block_max_key(kth, red, 0);  // its barrier also orders s_count = 0
    int mine = 0;
#pragma unroll
    for (int m = 0; m < kTopkPerThread; ++m) mine += keys[m] >= thr;
    if (mine > 0) {
      int slot = atomicAdd(&s_count, mine);
#pragma unroll
      for (int m = 0; m < kTopkPerThread; ++m) {
        if (keys[m] >= thr) {
          if (slot < kTopkCands) cands[slot] = keys[m];
          ++slot;
        }
      }
    }
    __syncthreads();
    const int count = s_count;
    if (count >= k && count <= kTopkCands) {
      rank_picks(cands, count, k, cand_val + o, cand_idx + o);
      return;
    }
    // red[0] was read before the barrier above: the passes below may rewrite it.
  }
  uint64_t prev = ~0ull;  // keys below `prev` only
  for (int j = 0; j < k; ++j) {
    uint64_t best = 0;
#pragma unroll
    for (int m = 0; m < kTopkPerThread; ++m) {
      best = keys[m] < prev && keys[m] > best ? keys[m] : best;
    }
    prev = block_max_key(best, red, j & 1);
    if (threadIdx.x == 0) store_pick(prev, cand_val + o, cand_idx + o, j);
  }
}

// Stage 2, one block per row over the chunks' lists (each sorted descending, n = chunks * k keys).
// Filter: thr = the k-th largest chunk maximum. Exactly k chunks have a maximum >= thr (the maxima
// are real keys, distinct), so at least k keys are >= thr and the row's top k all are; and only
// those k chunks hold keys >= thr, at most k * k of them. When they fit in kTopkCands, ranks pick
// the k largest in one pass; else (k > 16, or fewer chunks than k) the block passes below.
__global__ void __launch_bounds__(kTopkThreads)
    topk_merge_kernel(float* values, int32_t* ids, const float* cand_val, const int32_t* cand_idx,
                      int n, int k) {
  griddep_wait();  // launched with launch_pdl: the inputs come from the kernels before
  griddep_launch();
  extern __shared__ uint64_t mk[];  // [n] keys
  __shared__ uint64_t red[2][kTopkThreads / 32];
  __shared__ uint64_t cands[kTopkCands];
  __shared__ uint64_t s_thr;
  __shared__ int s_count;
  const int64_t row = blockIdx.x;
  const int chunks = n / k;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    mk[i] = order_key(cand_val[row * n + i], static_cast<uint32_t>(cand_idx[row * n + i]));
  }
  if (threadIdx.x == 0) {
    s_thr = 0;
    s_count = 0;
  }
  __syncthreads();
  if (chunks >= k && k * k <= kTopkCands) {
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint64_t m = mk[c * k];
      int rank = 0;
      for (int o = 0; o < chunks; ++o) rank += mk[o * k] > m;
      if (rank == k - 1) s_thr = m;
    }
    __syncthreads();
    const uint64_t thr = s_thr;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (mk[i] >= thr) cands[atomicAdd(&s_count, 1)] = mk[i];
    }
    __syncthreads();
    rank_picks(cands, s_count, k, values + row * k, ids + row * k);
    return;
  }
  uint64_t prev = ~0ull;
  for (int j = 0; j < k; ++j) {
    uint64_t best = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      best = mk[i] < prev && mk[i] > best ? mk[i] : best;
    }
    prev = block_max_key(best, red, j & 1);
    if (threadIdx.x == 0) store_pick(prev, values + row * k, ids + row * k, j);
  }
}

}  // namespace

// markov_dots' 16-byte path: BF16 w2, r % 8 == 0, 16-byte aligned rows.
static bool markov_vec(In w2, int64_t r) {
  return w2.t == Elem::kBF16 && r % 8 == 0 && (reinterpret_cast<uintptr_t>(w2.p) & 15) == 0;
}

cudaError_t markov_row(float* z, int32_t* argmax, In u, const int32_t* prev, In w1, In w2,
                       int64_t v, int64_t r, uint64_t* keys, unsigned* counter, int num_sms,
                       cudaStream_t s) {
  if (v <= 0) return cudaSuccess;
  const int64_t per_block = kRowWarps * kRowsPerWarp * 4;  // >= 4 iterations per warp
  const int64_t want = (v + per_block - 1) / per_block;
  // One wave: as many blocks as fit on the device at once (a host query, no stream work).
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, markov_row_kernel, kRowWarps * 32,
                                                    static_cast<size_t>(r) * sizeof(float)) !=
          cudaSuccess ||
      per_sm < 1) {
    per_sm = 1;
  }
  const int64_t cap =
      std::min<int64_t>(kMarkovRowMaxBlocks, static_cast<int64_t>(num_sms) * per_sm);
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
  const bool vec = markov_vec(w2, r);
  markov_row_kernel<<<grid, kRowWarps * 32, static_cast<size_t>(r) * sizeof(float), s>>>(
      z, argmax, u, prev, w1, w2, v, r, vec, keys, counter);
  return cudaGetLastError();
}

static int64_t markov_u_argmax_blocks(int64_t v) {
  const int64_t chunk = kPruneThreads * kPruneArgmaxPer;
  return std::max<int64_t>(1, std::min<int64_t>((v + chunk - 1) / chunk, kMarkovRowMaxBlocks));
}

size_t markov_chain_workspace_bytes(int64_t k, int64_t v) {
  return static_cast<size_t>(k * markov_u_argmax_blocks(v)) * sizeof(uint64_t);
}

cudaError_t markov_chain_pruned(int32_t* drafts, const int32_t* anchor, In u, In w1, In w2,
                                const float* norms, int64_t k, int64_t v, int64_t r,
                                void* workspace, uint64_t* keys, unsigned* counter,
                                cudaStream_t s) {
  if (k <= 0 || v <= 0) return cudaSuccess;
  const int nb = static_cast<int>(markov_u_argmax_blocks(v));
  uint64_t* ukeys = static_cast<uint64_t*>(workspace);
  markov_u_argmax_kernel<<<dim3(static_cast<unsigned>(nb), static_cast<unsigned>(k)), kPruneThreads,
                           0, s>>>(ukeys, u, v);
  const int64_t chunk = kPruneThreads * kPrunePer;
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min((v + chunk - 1) / chunk, kMarkovRowMaxBlocks)));
  const PruneRowArgs a{.drafts = drafts,
                       .anchor = anchor,
                       .u = u,
                       .w1 = w1,
                       .w2 = w2,
                       .norms = norms,
                       .ukeys = ukeys,
                       .keys = keys,
                       .counter = counter,
                       .v = v,
                       .r = r,
                       .nb = nb,
                       .vec = markov_vec(w2, r),  // markov_row's choice: the same products
                       .factor = 1.0f + 4.0f * static_cast<float>(r + 40) * 0x1p-24f};
  for (int64_t j = 0; j < k; ++j) {
    markov_prune_row_kernel<<<grid, kPruneThreads, static_cast<size_t>(r) * sizeof(float), s>>>(a,
                                                                                                j);
  }
  return cudaGetLastError();
}

// Shared memory of the walk: av, sc [r], s, w, q, ids [t], and e [t, r] when staged.
static int64_t walk_smem(int64_t t, int64_t r, bool staged) {
  return (2 * r + 4 * t + (staged ? t * r : 0)) * static_cast<int64_t>(sizeof(float));
}
constexpr int64_t kWalkSmem = 48 * 1024;

bool candidate_walk_supported(int64_t t, int64_t r) {
  return t >= 1 && walk_smem(t, r, false) <= kWalkSmem;
}

// The table [k, t, t], then (t <= 32) the greedy choices best [k, t] (int32).
int64_t candidate_walk_table_floats(int64_t k, int64_t t, int64_t r) {
  return r > 0 ? k * t * t + (t <= 32 ? k * t : 0) : 0;
}

cudaError_t candidate_walk(const WalkArgs& a, float* table, cudaStream_t s) {
  if (a.k <= 0) return cudaSuccess;
  // Tabled (walk_pairs_kernel first) when a table is given and the walk's shared memory holds
  // every row's values, ids and terms besides its own arrays.
  const bool staged = walk_smem(a.t, a.r, true) <= kWalkSmem;
  const int64_t base_smem = walk_smem(a.t, a.r, staged);
  const int64_t tab_smem = (2 * a.k * a.t + a.k * a.t * a.t) * static_cast<int64_t>(sizeof(float));
  const bool tabled = table && a.r > 0 && a.t >= 1 && base_smem + tab_smem <= kWalkSmem;
  const bool sampled = a.filter.temperature > 0.0f;
  int32_t* best = tabled && !sampled && a.t <= 32
                      ? reinterpret_cast<int32_t*>(table + a.k * a.t * a.t)
                      : static_cast<int32_t*>(nullptr);
  if (tabled) {
    const cudaError_t e =
        launch_pdl(walk_pairs_kernel, dim3(static_cast<unsigned>(a.k * a.t)), dim3(kWalkThreads),
                   2 * static_cast<size_t>(a.r) * sizeof(float), s, a, table, best);
    if (e != cudaSuccess) return e;
  } else if (a.rows) {
    const cudaError_t e = fill(Out{a.rows, Elem::kF32}, a.k * a.v, -INFINITY, s);
    if (e != cudaSuccess) return e;
  }
  if (sampled) {
    const cudaError_t e = cudaMemsetAsync(a.probs, 0, a.k * a.v * sizeof(float), s);
    if (e != cudaSuccess) return e;
  }
  if (best) {
    return launch_pdl(candidate_chase_greedy_kernel, dim3(1), dim3(kWalkThreads),
                      static_cast<size_t>(2 * a.k * a.t + a.k) * sizeof(int32_t), s, a,
                      static_cast<const float*>(table), static_cast<const int32_t*>(best));
  }
  // Staged (the succ rows of a whole row of candidates in shared memory, loaded at once) when
  // they fit; else each warp reads them from global memory. Same arithmetic either way.
  const size_t smem = static_cast<size_t>(base_smem + (tabled ? tab_smem : 0));
  return launch_pdl(candidate_walk_kernel, dim3(1), dim3(kWalkThreads), smem, s, a, staged,
                    tabled ? table : static_cast<const float*>(nullptr));
}

bool topk_two_stage(int64_t v, int64_t k) {
  const int64_t chunks = (v + kTopkChunk - 1) / kTopkChunk;
  return k <= kTopkFastK && v > 2 * kTopkChunk && chunks * k * 8 <= 48 * 1024;
}
size_t topk_workspace_bytes(int64_t rows, int64_t v, int64_t k) {
  const int64_t chunks = (v + kTopkChunk - 1) / kTopkChunk;
  return static_cast<size_t>(rows * chunks * k) * (sizeof(float) + sizeof(int32_t));
}

cudaError_t topk_fast(float* values, int32_t* ids, In x, int64_t rows, int64_t v, int64_t k,
                      void* workspace, cudaStream_t s) {
  if (rows <= 0 || k <= 0) return cudaSuccess;
  const int64_t chunks = (v + kTopkChunk - 1) / kTopkChunk;
  float* cv = static_cast<float*>(workspace);
  int32_t* ci = reinterpret_cast<int32_t*>(cv + rows * chunks * k);
  const cudaError_t e = launch_pdl(topk_chunk_kernel,
                                   dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)),
                                   dim3(kTopkThreads), 0, s, cv, ci, x, v, static_cast<int>(k));
  if (e != cudaSuccess) return e;
  const int n = static_cast<int>(chunks * k);
  return launch_pdl(topk_merge_kernel, dim3(static_cast<unsigned>(rows)), dim3(kTopkThreads),
                    static_cast<size_t>(n) * sizeof(uint64_t), s, values, ids,
                    static_cast<const float*>(cv), static_cast<const int32_t*>(ci), n,
                    static_cast<int>(k));
}

}  // namespace bs::cuda
