// Weight-streaming tensor-core GEMM for 1..kSkinnyMaxRows rows (GemvMode::kStream, issue 17):
// y[r, j] (+)= sum_c x[r, c] w[j, c] (+ bias[j]) with BF16 x [n, k] and w [m, k] (row-major, as
// an HF Linear), y BF16 or F32, bias F32 or null.
//
// Built for the decode step's bandwidth floor: each block owns 16 output features (a tile), its
// warps split k and stream their pieces of the 16 weight rows through a ring of stages several
// chunks deep; the first stages' weight loads are issued before griddepcontrol.wait (launched with
// programmatic dependent launch; the weights do not depend on the kernel before), so they overlap
// the previous kernel's tail. Three kernels:
//   variants 0, 1, 3: cp.async into each lane's own shared-memory slots (6-16 stages), a
//     persistent one-wave grid whose blocks stream their tiles back to back, warps on
//     interleaved 32-wide k chunks;
//   variant 2: a ring of registers (4 stages), one block per tile, warps on contiguous k ranges;
//   variants 4-9 (stream_bulk.cu): a producer warp's bulk copies into a ring of stages that
//     four (4, 5, 7-9: variant 1's k split and bits) or eight (6: variant 0's) consumer warps
//     read, x resident in shared memory where it fits, with fused forms (StreamX below); variants
//     8 and 9 also split k over blocks (StreamSplitSpace below).
// Row r's arithmetic (the k split, the order of every sum) depends only on k and the variant,
// never on n: a 1-row decode equals row 0 of a 16-row verify bit for bit. Deterministic (no
// atomics). Measured on an H200 (docs/BENCHMARKS.md, session 10): variant 0 beats cuBLASLt on
// the 4096 x 4096 projection (10.7 vs 13.1 us at 1 row), not on the larger matrices.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace bs::cuda {

// Variants (warps per block x ring depth): 0 = cp.async 8 x 6 (the default), 1 = cp.async 4 x 12,
// 2 = registers 8 x 4, 3 = cp.async 4 x 16; 4-7 = bulk copies (stream_bulk.cu: one producer
// warp; 4: four consumer warps, 512-byte row pieces x 8 stages; 5: four, 1 KiB x 4; 6: eight,
// 1 KiB x 4; 7: four, 1 KiB x 8, i.e. variant 5's 128 KiB in flight an SM in one block where 5
// needs two); 8, 9 = bulk copies with k split over blocks and x resident (below; 8: 4 stages of
// 32 rows x 1 KiB, one block an SM; 9: 4 stages of 16 rows x 1 KiB, two blocks an SM); kept for
// measurement (BLOCKSPEC_STREAM_VARIANT). Results differ between variants (another k split),
// never between row counts.
constexpr int kStreamVariants = 10;

// Variants 8 and 9 split k into spans (as even as 64-element multiples allow) and give each
// (unit of output features, span) to its own block, so that 16 rows of a span stay resident in
// shared memory beside the ring of weight stages:
//   variant 8: 32-feature units, spans of at most 2,048 (k = 4096 -> 2, 12288 -> 6): 64 KiB of
//     rows beside 4 x 32 KiB of stages, one block an SM;
//   variant 9: 16-feature units, spans of at most 1,024 (4096 -> 4, 12288 -> 12): 33 KiB of rows
//     beside 4 x 17 KiB, ~111 KB a block, so two blocks share an SM (variant 5's layout, which
//     streams fastest at 1 row) at 16 rows too.
// The spans' sums meet in global memory: each block stores its unit's partial sums (and, for the
// fused RMSNorm, its span's sums of squares) in a slot, counts its arrival on the unit's counter,
// and the last of the unit's blocks adds the slots in span order (whichever block arrives last:
// deterministic) and writes y, in an epilogue warp of its own while the consumer warps go on
// with the next unit. Within a span variant 1's k split: where k is one span, variant 1's bits.
// A row's bits depend on k, m and the variant only. The space a stream's launches use, one after
// another (a launch leaves the counters zero, as it found them); where it holds too few slots or
// counters for m, the product is not split (the same choice for every row count):
struct StreamSplitSpace {
  float* partials = nullptr;  // a slot a (unit, span): the unit's features x 16 rows, 16 sums
  size_t partial_bytes = 0;
  unsigned* counters = nullptr;  // one a unit, zero between launches
  int64_t counter_count = 0;
};
// The spans variant `variant` splits an [m, k] product into with this space (1: not split, or a
// variant that never splits).
int stream_split_count(int64_t m, int64_t k, int variant, const StreamSplitSpace& space);
// Whether a variant splits k.
bool stream_splits(int variant);

// Whether stream_gemm takes these operands: 1 <= n <= kSkinnyMaxRows, k % 8 == 0, x and w 16-byte
// aligned. Others go to cuBLASLt.
bool stream_gemm_supported(int64_t n, int64_t k, const void* x, const void* w);

cudaError_t stream_gemm(Out y, const void* x, const void* w, const float* bias, int64_t n,
                        int64_t m, int64_t k, bool accumulate, cudaStream_t s, int variant = 0,
                        const StreamSplitSpace& space = {});

// The x operand of a fused stream GEMM (bulk variants only), derived as the kernel loads it:
//   kRows:      x [n, k] as is (stream_gemm);
//   kRmsNormed: y (+)= rms_norm(x; norm_w, eps) . w^T: the kernel multiplies x by the norm's F32
//               weights (rounded to BF16 for the product), sums each row's squares from the x it
//               streams, and scales the dot products by 1 / sqrt(mean(x^2) + eps) before bias
//               and accumulation (the same value as RMSNorm then stream_gemm up to rounding: the
//               normalized row is not rounded to BF16 before the product);
//   kSwiglu:    x = gate_up [n, 2k]; the operand is silu(gate) * up rounded to BF16, swiglu's
//               kernel arithmetic, so the result equals swiglu then stream_gemm bit for bit.
//               Derived once a launch into shared memory, so only where n rows of k fit there
//               (stream_swiglu_fuses); elsewhere cudaErrorNotSupported.
// A row's arithmetic never depends on n in any form.
enum class StreamX { kRows, kRmsNormed, kSwiglu };

// The bulk kernels (variants 4, 5 and the FP8 bulk product): up to `bytes` of a launch's later
// weight stages are prefetched into L2 (cp.async.bulk.prefetch) before the kernel waits for the
// one before it, so that DRAM streams them while that kernel runs (the attention between q/k/v
// and o_proj leaves DRAM mostly idle for ~10 us a layer). 0 (the default): none. Process-wide.
void set_stream_l2_prefetch(int64_t bytes);

// The bulk kernels keep x's rows resident in shared memory where n rows of k fit beside the ring;
// plain products (kRows) of fewer than this many rows stream x with the weights instead (the
// same bits): on an H100 (docs/BENCHMARKS.md, session 20) resident x, laid out for one block an
// SM, made 1-row products 15-20 % slower; sized to its rows (session 21) it is within 1 % of
// streamed x (v5: 5.096 vs 5.053 ms of products a token). The fused forms derive x into resident
// rows whatever n. Process-wide; for measurement (BLOCKSPEC_STREAM_RESIDENT_ROWS); 0 restores the
// default.
constexpr int kStreamResidentRows = 9;
void set_stream_resident_rows(int rows);

// Whether a variant has the fused forms (the bulk variants, 4-9).
bool stream_fuses(int variant);
// Whether the SwiGLU form takes n rows of an [m, k] product (x resident: about 150 KiB of rows, or
// of a span with variants 8 and 9).
bool stream_swiglu_fuses(int64_t n, int64_t m, int64_t k, int variant,
                         const StreamSplitSpace& space = {});

// The fused forms; norm_w (kRmsNormed) F32 [k], 16-byte aligned. cudaErrorInvalidValue for
// operands stream_gemm_supported refuses or a variant without fusion.
cudaError_t stream_gemm_fused(Out y, StreamX kind, const void* x, const float* norm_w, float eps,
                              const void* w, const float* bias, int64_t n, int64_t m, int64_t k,
                              bool accumulate, cudaStream_t s, int variant,
                              const StreamSplitSpace& space = {});

}  // namespace bs::cuda
