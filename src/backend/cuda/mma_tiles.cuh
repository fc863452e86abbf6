// Tensor-core tiles in shared memory, shared by the attention kernels that use mma.sync
// (flash_prefill.cu, paged_attention.cu's split pass v4): BF16 tiles of 64-key / 16-query rows
// with a bank-conflict-free swizzle, ldmatrix loads into mma fragments, m16n8k16 BF16 MMA.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_util.cuh"  // pack_bf16

namespace bs::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c[4] += a[4] (16x16 bf16, row) * b[2] (16x8 bf16, col).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory tile of R rows x HD bf16 (HD * 2 bytes = HD / 8 16-byte chunks per row); chunk c
// of row r is stored at chunk c ^ (r & 7), so that the 8 rows an ldmatrix reads hit distinct
// banks.
template <int HD>
__device__ __forceinline__ __nv_bfloat16* tile_at(__nv_bfloat16* tile, int row, int chunk) {
  return tile + row * HD + ((chunk ^ (row & 7)) << 3);
}

}  // namespace bs::cuda
