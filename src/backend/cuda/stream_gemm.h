// Weight-streaming tensor-core GEMM for 1..kSkinnyMaxRows rows (GemvMode::kStream, issue 17):
// y[r, j] (+)= sum_c x[r, c] w[j, c] (+ bias[j]) with BF16 x [n, k] and w [m, k] (row-major, as
// an HF Linear), y BF16 or F32, bias F32 or null.
//
// Built for the decode step's bandwidth floor: each block owns 16 output features and its warps
// stream contiguous k-ranges of those 16 weight rows through a ring of registers several chunks
// deep; the first ring's weight loads are issued before griddepcontrol.wait (launched with
// programmatic dependent launch, the weights do not depend on the kernel before), so they overlap
// the previous kernel's tail. Row r's arithmetic (the k split, the order of every sum) depends only
// on k and the variant, never on n: a 1-row decode equals row 0 of a 16-row verify bit for bit.
// Deterministic (no atomics).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace bs::cuda {

// Tuning variants (warps per block x ring depth): 0 = the default; the others are kept for
// measurement (BLOCKSPEC_STREAM_VARIANT). Results differ between variants (another k split).
constexpr int kStreamVariants = 4;

// Whether stream_gemm takes these operands: 1 <= n <= kSkinnyMaxRows, k % 8 == 0, x and w 16-byte
// aligned. Others go to cuBLASLt.
bool stream_gemm_supported(int64_t n, int64_t k, const void* x, const void* w);

cudaError_t stream_gemm(Out y, const void* x, const void* w, const float* bias, int64_t n,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s, int variant = 0);

}  // namespace bs::cuda
