// Causal flash-attention prefill over the paged KV cache (kernels.h, flash_prefill).
//
// One thread block per (tile of 64 query rows, query head, sequence); 4 warps, 16 query rows
// each. The block walks the key positions in absolute 64-key tiles from 0 to the tile holding
// its last query, staging each tile's K and V (gathered from the block table with 16-byte
// cp.async copies, double-buffered) in shared memory. Per tile a warp computes its 16 x 64
// scores with mma.sync m16n8k16 (BF16 in, fp32 accumulate), applies the causal / window mask,
// updates an online softmax in fp32 (running max and sum per row, exp2 with the scale folded
// in), rounds the probabilities to BF16 and accumulates P V with the same MMA. GQA: a query head
// reads kv head h / (heads / kv_heads); the group's blocks read the same K/V tiles, mostly from
// L2.
//
// Row invariance: a query row's arithmetic is the same instruction sequence whichever tile slot
// it has and however many rows the call has (key tiles are absolute, a tile the row cannot see
// adds exactly zero and rescales by exactly 1), so a prompt row's output does not depend on the
// other rows of the call. It differs in rounding from the split-KV kernel, which keeps serving
// decode, verify and draft rows (<= 16 per sequence).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_tiles.cuh"

namespace bs::cuda {
namespace {

constexpr int kQTile = 64;  // query rows per block (16 per warp)
constexpr int kKTile = 64;  // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// 16-byte async copy global -> shared; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Copies 64 key (or value) rows [k0, k0 + 64) of kv head `kvh` from the paged pool into `dst`
// (swizzled); rows at or past kv_len are zero-filled (their table entries may be garbage).
template <int HD>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* dst, const __nv_bfloat16* pool,
                                             const int32_t* table, int64_t block_size,
                                             int64_t kv_heads, int kvh, int64_t k0,
                                             int64_t kv_len) {
  constexpr int kChunks = HD / 8;
  for (int i = threadIdx.x; i < kKTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t key = k0 + r;
    const __nv_bfloat16* src = pool;
    int bytes = 0;
    if (key < kv_len) {
      const int64_t slot =
          static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size;
      src = pool + (slot * kv_heads + kvh) * HD + c * 8;
      bytes = 16;
    }
    cp_async16(tile_at<HD>(dst, r, c), src, bytes);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_prefill_kernel(AttentionArgs a, const int32_t* kv_len_dev) {
  constexpr int kDK = HD / 16;  // k-steps over the head dim (S = Q K^T)
  constexpr int kDN = HD / 8;   // n-tiles over the head dim (O = P V)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [64][HD], then K buffer 0
  // K buffer b at q_s + b * 64 HD, V buffer b at q_s + (2 + b) * 64 HD.
  const auto k_s = [&](int b) { return q_s + b * kKTile * HD; };
  const auto v_s = [&](int b) { return q_s + (2 + b) * kKTile * HD; };

  griddep_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t seq = blockIdx.z, head = blockIdx.y;
  const int64_t n = a.n;
  const int64_t q_tiles = (n + kQTile - 1) / kQTile;
  const int64_t qt = q_tiles - 1 - blockIdx.x;  // the heaviest (last) tiles start first
  const int64_t kv_len = kv_len_dev ? static_cast<int64_t>(kv_len_dev[seq]) : a.kv_len;
  const int64_t first_pos = kv_len - n;  // absolute position of query row 0
  const int kvh = static_cast<int>(head / (a.heads / a.kv_heads));
  const int32_t* table = a.block_table + seq * a.table_stride;
  const auto* kpool = static_cast<const __nv_bfloat16*>(a.k);
  const auto* vpool = static_cast<const __nv_bfloat16*>(a.v);
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const int64_t row0 = qt * kQTile;  // first query row of the block (within the sequence)

  // Query tile -> shared (rows past n zero), then into A fragments.
  {
    constexpr int kChunks = HD / 8;
    for (int i = threadIdx.x; i < kQTile * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int64_t row = row0 + r;
      const __nv_bfloat16* src = q;
      int bytes = 0;
      if (row < n) {
        src = q + ((seq * n + row) * a.heads + head) * HD + c * 8;
        bytes = 16;
      }
      cp_async16(tile_at<HD>(q_s, r, c), src, bytes);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  uint32_t qf[kDK][4];
#pragma unroll
  for (int kk = 0; kk < kDK; ++kk) {
    const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int c = kk * 2 + (lane >> 4);
    ldmatrix_x4(qf[kk], tile_at<HD>(q_s, r, c));
  }
  __syncthreads();  // q_s is K buffer 0 from here on

  // Keys this block needs: [key_lo, key_hi).
  const int64_t last_row = min(row0 + kQTile, n) - 1;
  const int64_t key_hi = first_pos + last_row + 1;
  int64_t key_lo = 0;
  if (a.window > 0) key_lo = max(int64_t{0}, first_pos + row0 - a.window + 1);
  const int64_t t_lo = key_lo / kKTile, t_hi = (key_hi + kKTile - 1) / kKTile;

  // This thread's two query rows (g and g + 8 of the warp's 16) as absolute positions.
  const int64_t qpos0 = first_pos + row0 + warp * 16 + g, qpos1 = qpos0 + 8;
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  float o[kDN][4];
#pragma unroll
  for (int j = 0; j < kDN; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  if (t_lo < t_hi) {
    load_kv_tile<HD>(k_s(0), kpool, table, a.block_size, a.kv_heads, kvh, t_lo * kKTile, kv_len);
    load_kv_tile<HD>(v_s(0), vpool, table, a.block_size, a.kv_heads, kvh, t_lo * kKTile, kv_len);
    cp_async_commit();
  }
  for (int64_t kt = t_lo; kt < t_hi; ++kt) {
    const int buf = static_cast<int>((kt - t_lo) & 1);
    if (kt + 1 < t_hi) {  // prefetch the next tile into the other buffer
      load_kv_tile<HD>(k_s(buf ^ 1), kpool, table, a.block_size, a.kv_heads, kvh, (kt + 1) * kKTile,
                       kv_len);
      load_kv_tile<HD>(v_s(buf ^ 1), vpool, table, a.block_size, a.kv_heads, kvh, (kt + 1) * kKTile,
                       kv_len);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ks = k_s(buf);
    const __nv_bfloat16* vs = v_s(buf);

    // S = Q K^T: 16 rows x 64 keys per warp (8 n-tiles of 8 keys).
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDK; ++kk) {
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {  // key n-tiles 2 jp, 2 jp + 1
        uint32_t b[4];
        const int r = jp * 16 + (lane & 7) + (lane >> 4) * 8;
        const int c = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(b, tile_at<HD>(const_cast<__nv_bfloat16*>(ks), r, c));
        mma_bf16(s[2 * jp], qf[kk], b[0], b[1]);
        mma_bf16(s[2 * jp + 1], qf[kk], b[2], b[3]);
      }
    }

    // Mask, scale to log2 units, row maxima.
    const int64_t k0 = kt * kKTile;
    // Tiles wholly below the block's first query (and inside every row's window) need no mask.
    const bool all_visible = k0 + kKTile - 1 <= first_pos + row0 && k0 + kKTile <= kv_len &&
                             (a.window == 0 || first_pos + last_row - k0 < a.window);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + j * 8 + 2 * t + (e & 1);
        const int64_t qp = e < 2 ? qpos0 : qpos1;
        const bool vis =
            all_visible || (key <= qp && key < kv_len && (a.window == 0 || qp - key < a.window));
        s[j][e] = vis ? s[j][e] * sl2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with no visible key yet keeps max -inf: use 0 as the reference so exp2 gives 0.
    const float ref0 = mn0 == -INFINITY ? 0.0f : mn0, ref1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float alpha0 = exp2f(m0 - ref0), alpha1 = exp2f(m1 - ref1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(s[j][0] - ref0);
      s[j][1] = exp2f(s[j][1] - ref0);
      s[j][2] = exp2f(s[j][2] - ref1);
      s[j][3] = exp2f(s[j][3] - ref1);
      rs0 += s[j][0] + s[j][1];
      rs1 += s[j][2] + s[j][3];
    }
    l0 = l0 * alpha0 + rs0;  // per-thread partial sums (quad-reduced at the end)
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int j = 0; j < kDN; ++j) {
      o[j][0] *= alpha0;
      o[j][1] *= alpha0;
      o[j][2] *= alpha1;
      o[j][3] *= alpha1;
    }

    // O += P V: P's accumulator layout is the A fragment of k-step kk (keys 16 kk .. +15).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int jp = 0; jp < kDN / 2; ++jp) {  // dim n-tiles 2 jp, 2 jp + 1
        uint32_t b[4];
        const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int c = jp * 2 + (lane >> 4);
        ldmatrix_x4_trans(b, tile_at<HD>(const_cast<__nv_bfloat16*>(vs), r, c));
        mma_bf16(o[2 * jp], pa, b[0], b[1]);
        mma_bf16(o[2 * jp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's prefetch
  }

  // Normalise and store (rows < n only).
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  const int64_t r0 = row0 + warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int j = 0; j < kDN; ++j) {
    const int col = j * 8 + 2 * t;
    if (r0 < n) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((seq * n + r0) * a.heads + head) * HD + col) =
          __floats2bfloat162_rn(o[j][0] * inv0, o[j][1] * inv0);
    }
    if (r1 < n) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((seq * n + r1) * a.heads + head) * HD + col) =
          __floats2bfloat162_rn(o[j][2] * inv1, o[j][3] * inv1);
    }
  }
}

template <int HD>
cudaError_t launch_flash(const AttentionArgs& a, const int32_t* kv_len_dev, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(4) * kKTile * HD * sizeof(__nv_bfloat16);
  static const cudaError_t configured =
      cudaFuncSetAttribute(flash_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned>((a.n + kQTile - 1) / kQTile),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.num_seqs));
  return launch_pdl(flash_prefill_kernel<HD>, grid, dim3(kThreads), smem, s, a, kv_len_dev);
}

}  // namespace

bool flash_prefill_supported(const AttentionArgs& a) {
  return a.t == Elem::kBF16 && a.block_table != nullptr && a.causal &&
         (a.hd == 64 || a.hd == 128) && a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.n > 0 &&
         a.num_seqs >= 1 && a.num_seqs <= 65535 && a.heads <= 65535;
}

cudaError_t flash_prefill(const AttentionArgs& a, const int32_t* kv_len_dev, cudaStream_t s) {
  return a.hd == 64 ? launch_flash<64>(a, kv_len_dev, s) : launch_flash<128>(a, kv_len_dev, s);
}

}  // namespace bs::cuda
