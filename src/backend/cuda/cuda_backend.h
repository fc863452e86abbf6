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
//   kStream: the weight-streaming GEMM of stream_gemm.h (row-count invariant too; PDL weight
//     prefetch; BLOCKSPEC_STREAM_VARIANT picks a tuning variant, BLOCKSPEC_STREAM_MAX_MIB sends
//     larger matrices to the pinned cuBLASLt algorithm, a choice by shape only);
//   kSimt: a CUDA-core GEMV for 1-4 rows (not invariant across row counts);
//   kCublasLt: cuBLASLt with the heuristic's algorithm for the actual row count (not invariant).
enum class GemvMode { kAuto, kMma, kSimt, kCublasLt, kStream };
void set_gemv_mode(Backend& backend, GemvMode mode);
// Products of up to `rows` rows (at least 16) use the algorithm pinned for 16 rows in
// GemvMode::kAuto (experiment; also BLOCKSPEC_PINNED_ROWS).
void set_pinned_rows(Backend& backend, int64_t rows);
// GemvMode::kStream's tuning variant (0 = default; stream_gemm.h; also BLOCKSPEC_STREAM_VARIANT).
void set_stream_variant(Backend& backend, int variant);
int stream_variant_count();

}  // namespace bs::cuda
