// Device helpers shared by the kernel files: warp reductions and programmatic dependent launch.
//
// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be scheduled
// while the kernel before it in the stream is still finishing, so its launch latency overlaps
// that kernel's tail. Every such kernel calls griddep_wait() before it touches global memory;
// the wait returns once the preceding grid has completed and its writes are visible, so the
// results are those of an ordinary launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace bs::cuda {

// Reports a KV slot outside the pool (kernels.h, FaultSink); only the first report is kept. The
// cold path of the one branch a kernel pays for the check.
__device__ __forceinline__ void report_slot_fault(const FaultSink& f, FaultOp op, int64_t slot,
                                                  int64_t capacity) {
  if (f.claim == nullptr || atomicCAS(f.claim, 0, 1) != 0) return;
  volatile FaultRecord* r = f.record;
  r->slot = static_cast<int32_t>(slot);
  r->capacity = capacity;
  __threadfence_system();
  r->op = static_cast<int32_t>(op);
}

// The two bf16 values packed in a 32-bit word (low half first) as floats, exactly.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Two floats rounded to bf16 (to nearest even) and packed in a 32-bit word, lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// SwiGLU's element, silu(g) * u, the one arithmetic of swiglu_kernel and the stream GEMMs' fused
// SwiGLU (which must give its bits).
__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// Sum / maximum over the 32 lanes of a full warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The end of a few-row tensor-core product: each of W warps holds m16n8 accumulator tiles
// acc[NT] (16 output features x NT * 8 x rows, in the mma.sync C layout) over its share of k.
// Sums the warps' tiles in a fixed order and calls out(x_row, feature, sum) once for every
// x_row < n and feature < 16. Block-wide: every thread of the W warps must call it.
template <int W, int NT, typename Out>
__device__ __forceinline__ void reduce_warp_tiles(const float (&acc)[NT][4], int n, Out&& out) {
  __shared__ float red[W][NT * 8][16];  // [warp][x row][output feature]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = nt * 8 + 2 * t;
    red[warp][col][g] = acc[nt][0];
    red[warp][col + 1][g] = acc[nt][1];
    red[warp][col][g + 8] = acc[nt][2];
    red[warp][col + 1][g + 8] = acc[nt][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < NT * 8 * 16; i += blockDim.x) {
    const int col = i / 16, row = i % 16;
    if (col >= n) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) sum += red[w][col][row];
    out(col, row, sum);
  }
}

// A 16-byte load of data read once (weights): not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// d += a . b on the tensor cores, m16n8k16, fp32 accumulate, BF16 operands (FP16 with kF16)
// (the mma.sync fragment layouts: a0..a3 = A rows g / g + 8 at k 2t / 2t + 8, b0, b1 = B column
// g at k 2t / 2t + 8).
#define BS_MMA16816(TYPES)                                                    \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPES                 \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
template <bool kF16 = false>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kF16) {
    BS_MMA16816("f16.f16");
  } else {
    BS_MMA16816("bf16.bf16");
  }
}
#undef BS_MMA16816

// 16 bytes from global to shared memory without passing through registers (cp.async.cg: cached
// in L2 only); the first src_bytes (0 or 16) are copied, the rest zero-filled (src must still be
// a valid address). kPrefetchL2 adds the hint to fetch the whole 128-byte line into L2.
template <bool kPrefetchL2 = false>
__device__ __forceinline__ void cp_async16(uint32_t smem_dst, const void* src, int src_bytes) {
  if constexpr (kPrefetchL2) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(smem_dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream (when launched with launch_pdl) be scheduled now: its blocks
// start and run up to their own griddep_wait(), which still returns only once this grid has
// completed. Called early by the small kernels so that the next GEMM's weight prefetch overlaps
// them.
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

}  // namespace bs::cuda
