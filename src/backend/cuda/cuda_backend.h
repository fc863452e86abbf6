// The CUDA backend (NVIDIA GPUs; tuned for Hopper): BF16 activations and matrices, F32 1-D
// weights (norms, biases, RoPE frequencies), fp32 accumulation everywhere. GEMMs go through
// cuBLASLt (its algorithm pinned for 1-16 rows, see GemvMode); every other op is a kernel of
// kernels.h. One stream, one cuBLASLt handle and workspace per backend object.
//
// This header has no CUDA includes, so host code (CLI, tests) can use it freely; it exists only
// in builds with BLOCKSPEC_HAS_CUDA.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace bs::cuda {

// Whether a CUDA device can be used; when not, *why (if given) says why.
bool device_available(std::string* why = nullptr);
// The backend on device `device`; device_available() must be true.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// ---- Helpers for benchmarks and tests; `backend` must come from make_cuda_backend ----

// Times work queued on the backend's stream with CUDA events.
class EventTimer {
 public:
  explicit EventTimer(Backend& backend);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  // Milliseconds since start(); waits for the queued work.
  double stop_ms();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device-to-device copy bandwidth over a buffer of `bytes`: (bytes read + bytes written) per
// second in GB/s (1e9), median of `iters` copies after a warm-up.
double copy_bandwidth_gbs(Backend& backend, size_t bytes, int iters);
// "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90" and the like.
std::string device_description(Backend& backend);

// How matmul handles 1-16 rows (more rows always go to cuBLASLt with its own heuristic):
//   kAuto (default): cuBLASLt with the algorithm chosen for 16 rows, whatever the row count, so
//     a row's arithmetic does not depend on how many rows share the product (the speculative
//     verify pass reproduces plain decoding bit for bit);
//   kMma: the tensor-core skinny GEMM of kernels.h (row-count invariant too);
//   kStream: the weight-streaming GEMM of stream_gemm.h for matrices of at most
//     kStreamDefaultMaxMib MiB (Qwen3-8B: o_proj, where it beats cuBLASLt), the pinned cuBLASLt
//     algorithm for larger ones (a choice by shape only, so rows stay invariant);
//     BLOCKSPEC_STREAM_VARIANT / BLOCKSPEC_STREAM_MAX_MIB or set_stream_options change both;
//   kSimt: a CUDA-core GEMV for 1-4 rows (not invariant across row counts);
//   kCublasLt: cuBLASLt with the heuristic's algorithm for the actual row count (not invariant).
enum class GemvMode { kAuto, kMma, kSimt, kCublasLt, kStream };
void set_gemv_mode(Backend& backend, GemvMode mode);
// Products of up to `rows` rows (at least 16) use the algorithm pinned for 16 rows in
// GemvMode::kAuto (experiment; also BLOCKSPEC_PINNED_ROWS).
void set_pinned_rows(Backend& backend, int64_t rows);
// Backend::matmul_fp8's kernel for BF16 x (fp8_matmul.cu): kV1 (default) or kV2, the split-K
// ring variant (also BLOCKSPEC_FP8_KERNEL=v2, read when the backend is made; slower on the H200
// at the draft step's shapes), or kBulk (BLOCKSPEC_FP8_KERNEL=bulk; stream_bulk.cu; 1.8-3.1x
// slower than v1 on an H100, session 23), v1's arithmetic through the bulk-copy engine. All keep
// the row-count invariance; v2's rounding differs, kBulk gives v1's bits.
enum class Fp8Kernel { kV1, kV2, kBulk };
void set_fp8_kernel(Backend& backend, Fp8Kernel kernel);
// Split-KV attention's split pass (paged_attention.cu), for the whole process: kV1, a
// block per 64-key chunk; kV2 runs a block over several consecutive chunks with the next chunk's
// K / V loads in flight (also BLOCKSPEC_ATTN_KERNEL=v2, read when a backend is made; slower on
// the H200, docs/BENCHMARKS.md session 10). chunks_per_block > 0 forces v2's chunks per block
// (tests); 0 lets the launch size choose. kV3 (BLOCKSPEC_ATTN_KERNEL=v1 / v2 / v3 / v4): v1's
// blocks with cp.async loads, 16-byte shared-memory reads and tile-sized shared memory; v1-v3
// give the same bits. kV4 (the default since session 23): tensor-core scores and P . V for head
// dims 64 / 128 (others run v3), its own rounding, rows as invariant; about half of v3's time at
// 16 verify rows (docs/BENCHMARKS.md). The options only spread the work (the same bits for any
// choice): queries_per_thread, v1-v3's queries per thread, 2 / 4 / 8, or 0 to pick by the launch
// (the default; also BLOCKSPEC_ATTN_QPT=2|4|8); mma_tile, v4's query vectors per block, 16 / 32 /
// 64 (0: 16, the default; also BLOCKSPEC_ATTN_MMA_TILE).
enum class AttentionKernel { kV1, kV2, kV3, kV4 };
// The split pass a process starts with (kernels.h's kDefaultSplitVersion; asserted equal).
constexpr AttentionKernel kDefaultAttentionKernel = AttentionKernel::kV4;
struct AttentionKernelOptions {
  int chunks_per_block = 0;
  int queries_per_thread = 0;
  int mma_tile = 0;
};
void set_attention_kernel(AttentionKernel kernel, AttentionKernelOptions options = {});
// Backend::candidate_walk with its table (default: every row's candidate terms for every
// predecessor computed in parallel first, then looked up by the sequential walk) or without
// (each row computes its own; also BLOCKSPEC_WALK_TABLE=0, read when the backend is made). Both
// give the same bits.
void set_walk_table(Backend& backend, bool on);
// Backend::dynamic_conv with its 8-channel BF16 kernel where it applies (default) or the generic
// per-element kernel everywhere (also BLOCKSPEC_CONV_KERNEL=generic, read when the backend is
// made). Both give the same bits.
void set_conv_kernel(Backend& backend, bool fast);
// GemvMode::kStream: the kernel variant (stream_gemm.h) and the largest matrix it takes, in MiB
// (BLOCKSPEC_STREAM_VARIANT, BLOCKSPEC_STREAM_MAX_MIB); larger ones go to pinned cuBLASLt.
constexpr int kStreamDefaultVariant = 0;
constexpr int64_t kStreamDefaultMaxMib = 32;
void set_stream_options(Backend& backend, int variant, int64_t max_mib);
// GemvMode::kStream with a fusing variant (stream_gemm.h, 4-8): Backend::norm_matmul and
// swiglu_matmul run as one fused stream GEMM where the matrix takes the stream GEMM; with
// Fp8Kernel::kBulk, norm_matmul_fp8 and swiglu_matmul_fp8 as one fused FP8 bulk product (default
// on; BLOCKSPEC_STREAM_FUSE=0 or this switch off runs the separate ops, for comparison).
void set_stream_fusion(Backend& backend, bool on);
// The fewest rows whose x the bulk variants' plain products keep resident in shared memory
// (stream_gemm.h; BLOCKSPEC_STREAM_RESIDENT_ROWS; process-wide; the same bits); 0: the default.
void set_stream_resident_rows(Backend& backend, int rows);
int stream_variant_count();
// How many spans of k the stream GEMM's variant 8 splits an [m, k] product into on this backend
// (stream_gemm.h, stream_split_count): 1 where it does not split.
int stream_split_count(Backend& backend, int64_t m, int64_t k);

}  // namespace bs::cuda
