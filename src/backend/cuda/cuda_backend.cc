// CUDA backend: memory, copies, cuBLASLt GEMMs and the dispatch of every backend op to the raw
// kernels of kernels.cu. See cuda_backend.h.
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/stream_gemm.h"
#include "core/check.h"

#define CUDA_CHECK(expr)                                                    \
  do {                                                                      \
    const cudaError_t bs_err_ = (expr);                                     \
    if (bs_err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "blockspec: CUDA error '%s' at %s:%d: %s\n",     \
                   cudaGetErrorString(bs_err_), __FILE__, __LINE__, #expr); \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

#define CUBLAS_CHECK(expr)                                                \
  do {                                                                    \
    const cublasStatus_t bs_st_ = (expr);                                 \
    if (bs_st_ != CUBLAS_STATUS_SUCCESS) {                                \
      std::fprintf(stderr, "blockspec: cuBLASLt error %d at %s:%d: %s\n", \
                   static_cast<int>(bs_st_), __FILE__, __LINE__, #expr);  \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

namespace bs::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
// The stream GEMM's k split (variants 8, 9; StreamSplitSpace), a set a stream, allocated when a
// split variant is chosen: counters for units of 16 or 32 output features (up to 1,048,576
// features: the largest LM head is ~262k), slots for every (unit, span) of Qwen3-8B's LM head at
// 16 rows (variant 9: 9,496 units x 4 spans x 272 floats = 41 MB); larger products do not split.
constexpr int64_t kSplitCounters = 1 << 16;
constexpr size_t kSplitPartialBytes = 64u << 20;
// copy_from_host's pinned staging ring, in kRingSlices slices (each with the event of the last
// upload that reads it).
constexpr size_t kPinnedRingBytes = 32u << 20;
constexpr int kRingSlices = 16;
constexpr size_t kRingSliceBytes = kPinnedRingBytes / kRingSlices;
// The largest copy that goes through the ring (larger ones, weights, are copied synchronously).
constexpr size_t kMaxStagedBytes = kPinnedRingBytes / 4;
constexpr size_t kPoolMaxBytes = 32u << 20;  // larger buffers are not cached

Elem elem(DType t) {
  switch (t) {
    case DType::kF32:
      return Elem::kF32;
    case DType::kF16:
      return Elem::kF16;
    case DType::kBF16:
      return Elem::kBF16;
    case DType::kF8E4M3:
      return Elem::kF8E4M3;
    default:
      std::fprintf(stderr, "blockspec: CUDA backend: dtype %s is not a float type\n",
                   std::string(dtype_name(t)).c_str());
      std::abort();
  }
}
In in(const Tensor& t) { return In{t.data(), elem(t.dtype())}; }
Out out(const Tensor& t) { return Out{t.data(), elem(t.dtype())}; }
// An optional operand: a null pointer when undefined.
In in_opt(const Tensor& t) { return t.defined() ? in(t) : In{nullptr, Elem::kF32}; }

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      BS_CHECK(false && "unsupported GEMM dtype");
  }
  return CUDA_R_32F;
}

uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

void check_cuda_tensor(const Tensor& t) { BS_CHECK(t.defined() && t.device() == Device::kCuda); }

// Caching allocator for activation buffers: power-of-two bins up to kPoolMaxBytes, reused
// without synchronisation (every use is ordered on the backend's single stream). Shared with
// the deleters of the tensors it hands out, so it outlives the backend if they do. Every
// cudaMalloc of the backend goes through malloc() here, which counts the bytes held (for the KV
// plan's warm-up) and turns a failure into AllocationError after giving the cached free buffers
// back to CUDA and trying once more.
// Thrown by an allocation or a workspace growth attempted while run_captured captures a graph
// (CUDA forbids cudaMalloc and synchronisation then): run_captured abandons the capture and runs
// the ops eagerly, so the memory is there when the key is captured on its next use.
struct GrowthDuringCapture {};

class DevicePool {
 public:
  ~DevicePool() {
    for (auto& [size, list] : free_) {
      for (void* p : list) cudaFree(p);
    }
  }
  void* allocate(size_t bytes, size_t* cap) {
    if (bytes > kPoolMaxBytes) {
      *cap = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
      return malloc(*cap);
    }
    size_t c = 512;
    while (c < bytes) c <<= 1;
    *cap = c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(c);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= c;
        return p;
      }
    }
    return malloc(c);
  }
  void release(void* p, size_t cap) {
    if (cap > kPoolMaxBytes) {
      free(p, cap);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_[cap].push_back(p);
    cached_bytes_ += cap;
  }
  // Bytes held free for reuse (allocated from CUDA, owned by no tensor).
  int64_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  // Set by run_captured while it captures: malloc then throws GrowthDuringCapture.
  void set_capturing(bool on) { capturing_ = on; }
  bool capturing() const { return capturing_; }

  // cudaMalloc, counted; AllocationError when the device has no room even after the cached free
  // buffers went back to CUDA.
  void* malloc(size_t bytes) {
    if (capturing_) throw GrowthDuringCapture{};
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, or a later launch check would report it
      trim();
      err = cudaMalloc(&p, bytes);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw AllocationError("device", static_cast<int64_t>(bytes),
                            fmt::format("cudaMalloc: {:.1f} MiB of {:.1f} MiB free",
                                        static_cast<double>(free_bytes) / (1 << 20),
                                        static_cast<double>(total) / (1 << 20)));
    }
    CUDA_CHECK(err);
    count(static_cast<int64_t>(bytes));
    return p;
  }
  void free(void* p, size_t bytes) {
    cudaFree(p);
    count(-static_cast<int64_t>(bytes));
  }
  AllocationStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {.held = held_, .peak = peak_};
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = held_;
  }

 private:
  void count(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  // Gives every cached free buffer back to CUDA (after the device finished with them).
  void trim() {
    cudaDeviceSynchronize();
    std::map<size_t, std::vector<void*>> cached;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cached.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [size, list] : cached) {
      for (void* p : list) free(p, size);
    }
  }

  std::mutex mu_;
  bool capturing_ = false;
  int64_t cached_bytes_ = 0;
  int64_t held_ = 0, peak_ = 0;
  std::map<size_t, std::vector<void*>> free_;
};

// One cached cuBLASLt plan (descriptors + chosen algorithm) per GEMM shape and layout.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;
};

// A GEMM in cuBLASLt's column-major terms: D[M,N] = op(A) op(B) (* beta C=D) (+ bias[M]).
struct LtCall {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  cudaDataType_t ta = CUDA_R_16BF;
  int64_t lda = 0;
  const void* b = nullptr;
  cudaDataType_t tb = CUDA_R_16BF;
  int64_t ldb = 0;
  void* d = nullptr;
  cudaDataType_t td = CUDA_R_16BF;
  int64_t ldd = 0;
  bool accumulate = false;
  const void* bias = nullptr;
  cudaDataType_t tbias = CUDA_R_32F;
  // The N the algorithm is chosen for (op_b == N only). Choosing it for N = 16 whatever the
  // actual N <= 16 keeps each row's arithmetic independent of how many rows are multiplied.
  int64_t algo_n = 0;
  // Strided batches (1 = none): batch j reads A + j stride_a, B + j stride_b, writes D + j
  // stride_d (elements).
  int32_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
};

}  // namespace

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), pool_(std::make_shared<DevicePool>()) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&lt_));
    CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    // The side stream (beside()): its own cuBLASLt workspace, fork / join events.
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&side_workspace_, kWorkspaceBytes));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&argmax_keys_, kArgmaxKeys * sizeof(uint64_t)));
    CUDA_CHECK(cudaMalloc(&walk_keys_, (kMarkovRowMaxBlocks + 1) * sizeof(uint64_t)));
    CUDA_CHECK(cudaMemset(walk_keys_, 0, (kMarkovRowMaxBlocks + 1) * sizeof(uint64_t)));
    walk_counter_ = reinterpret_cast<unsigned*>(walk_keys_ + kMarkovRowMaxBlocks);
    CUDA_CHECK(cudaHostAlloc(&ring_, kPinnedRingBytes, cudaHostAllocDefault));
    for (cudaEvent_t& e : ring_ev_) {
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    // The fault record (kernels.h, FaultSink): host-mapped, read after each read-back's sync.
    CUDA_CHECK(cudaHostAlloc(&fault_host_, sizeof(FaultRecord), cudaHostAllocMapped));
    *fault_host_ = FaultRecord{};
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&fault_.record), fault_host_, 0));
    CUDA_CHECK(cudaMalloc(&fault_.claim, sizeof(int)));
    CUDA_CHECK(cudaMemset(fault_.claim, 0, sizeof(int)));
    CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
    read_switches();
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(side_stream_);
    cudaStreamSynchronize(stream_);
    for (auto& [key, plan] : plans_) destroy(plan);
    for (auto& [key, c] : graphs_) {
      if (c.exec) cudaGraphExecDestroy(c.exec);
    }
    if (attn_ws_) pool_->free(attn_ws_, attn_ws_bytes_);
    if (x16_ws_) pool_->free(x16_ws_, x16_ws_bytes_);
    if (fp8_part_ws_) pool_->free(fp8_part_ws_, fp8_part_ws_bytes_);
    if (conv_part_ws_) pool_->free(conv_part_ws_, conv_part_ws_bytes_);
    if (fp8_count_ws_) pool_->free(fp8_count_ws_, fp8_count_ws_bytes_);
    if (draw_ws_) pool_->free(draw_ws_, draw_ws_bytes_);
    if (topk_ws_) pool_->free(topk_ws_, topk_ws_bytes_);
    if (walk_ws_) pool_->free(walk_ws_, walk_ws_bytes_);
    if (chain_ws_) pool_->free(chain_ws_, chain_ws_bytes_);
    cublasLtDestroy(lt_);
    cudaFree(workspace_);
    cudaFree(side_workspace_);
    free_split_space();
    cudaEventDestroy(fork_ev_);
    cudaEventDestroy(join_ev_);
    cudaStreamDestroy(side_stream_);
    cudaFree(argmax_keys_);
    cudaFree(walk_keys_);
    cudaFreeHost(ring_);
    for (cudaEvent_t e : ring_ev_) cudaEventDestroy(e);
    cudaFreeHost(fault_host_);
    cudaFree(fault_.claim);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::kBF16; }

  cudaStream_t stream() const { return stream_; }
  const cudaDeviceProp& props() const { return props_; }
  void set_gemv_mode(GemvMode mode) {
    gemv_mode_ = mode;
    ++capture_generation_;  // captured graphs hold the old mode's kernels
  }
  void set_stream_options(int variant, int64_t max_mib) {
    choose_stream_variant(variant);
    stream_max_bytes_ = max_mib << 20;
    ++capture_generation_;
  }
  void set_stream_fusion(bool on) {
    stream_fuse_ = on;
    ++capture_generation_;
  }
  void set_pinned_rows(int64_t rows) {
    pinned_rows_ = std::max<int64_t>(kSkinnyMaxRows, rows);
    ++capture_generation_;
  }
  void set_walk_table(bool on) {
    walk_table_ = on;
    ++capture_generation_;
  }
  void set_conv_kernel(bool fast) {
    conv_fast_ = fast;
    ++capture_generation_;
  }
  void set_fp8_kernel(Fp8Kernel kernel) {
    fp8_kernel_ = kernel;
    ++capture_generation_;
  }

  // ---- Memory ----
  MemoryInfo memory_info() const override {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return {.free = static_cast<int64_t>(free) + pool_->cached_bytes(),
            .total = static_cast<int64_t>(total)};
  }
  AllocationStats allocation_stats() const override { return pool_->stats(); }
  void reset_peak_allocated() override { pool_->reset_peak(); }
  Tensor empty(std::initializer_list<int64_t> shape, DType dtype) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = std::max<size_t>(16, static_cast<size_t>(n) * dtype_size(dtype));
    check_injected_allocation_failure("device", static_cast<int64_t>(bytes));
    size_t cap = 0;
    void* p = pool_->allocate(bytes, &cap);
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    std::shared_ptr<DevicePool> pool = pool_;
    std::shared_ptr<void> storage(p, [pool, cap](void* q) { pool->release(q, cap); });
    Tensor t(std::move(storage), p, dtype, Device::kCuda, shape);
    // A buffer taken while capturing (an op's temporary) is baked into the graph: it lives as
    // long as the graph, or a later owner of the memory would be overwritten by every replay.
    if (capture_keep_) capture_keep_->push_back(t);
    return t;
  }

  // Matrices (rank >= 2) become BF16, vectors (norm weights, biases, RoPE frequencies) F32.
  Tensor upload_weight(DType src_dtype, const void* src,
                       std::initializer_list<int64_t> shape) override {
    const DType dst_dtype = shape.size() >= 2 ? DType::kBF16 : DType::kF32;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = std::max<size_t>(16, static_cast<size_t>(n) * dtype_size(dst_dtype));
    check_injected_allocation_failure("device", static_cast<int64_t>(bytes));
    void* p = pool_->malloc(bytes);
    std::shared_ptr<DevicePool> pool = pool_;
    std::shared_ptr<void> storage(p, [pool, bytes](void* q) { pool->free(q, bytes); });
    Tensor t(std::move(storage), p, dst_dtype, Device::kCuda, shape);
    if (n == 0) return t;
    if (src_dtype == dst_dtype) {
      CUDA_CHECK(cudaMemcpyAsync(p, src, static_cast<size_t>(n) * dtype_size(dst_dtype),
                                 cudaMemcpyHostToDevice, stream_));
    } else {
      // Raw source bytes in chunks through a device staging buffer, converted on the device.
      const size_t es = dtype_size(src_dtype);
      const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((64u << 20) / es));
      const int64_t staged = std::min<int64_t>(chunk, n);
      size_t cap = 0;
      void* stage = pool_->allocate(static_cast<size_t>(staged) * es, &cap);
      for (int64_t off = 0; off < n; off += chunk) {
        const int64_t cnt = std::min<int64_t>(chunk, n - off);
        CUDA_CHECK(cudaMemcpyAsync(stage, static_cast<const char*>(src) + off * es,
                                   static_cast<size_t>(cnt) * es, cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(
            convert(Out{static_cast<char*>(p) + off * dtype_size(dst_dtype), elem(dst_dtype)},
                    In{stage, elem(src_dtype)}, cnt, stream_));
      }
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      pool_->release(stage, cap);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return t;
  }

  void copy_from_host(const Tensor& dst, const void* src) override {
    check_cuda_tensor(dst);
    const size_t n = dst.nbytes();
    if (n == 0) return;
    if (n > kMaxStagedBytes) {  // weights and the like: a copy of its own
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, n, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    // A step's inputs go through the pinned ring, so that they stay asynchronous.
    upload_staged(dst, [&](void* staging) { std::memcpy(staging, src, n); });
  }
  // Uploads dst's bytes (at most kMaxStagedBytes), which fill(staging) writes straight into
  // the pinned ring.
  template <typename F>
  void upload_staged(const Tensor& dst, F&& fill) {
    const size_t n = dst.nbytes();
    void* staging = ring_stage(n);
    fill(staging);
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), staging, n, cudaMemcpyHostToDevice, stream_));
    close_ring_slices(static_cast<int>(ring_off_ / kRingSliceBytes));
  }
  // Room for n bytes at the ring's write offset (which then moves past them). A slice the writes
  // have left is closed: an event is recorded after the last upload that reads it, and a write
  // into it a lap later waits for that event (long done), not for everything queued since, as a
  // stream synchronize would (a penalized batch's rules can upload megabytes a step).
  void* ring_stage(size_t n) {
    const size_t span = (n + 255) / 256 * 256;
    if (ring_off_ + span > kPinnedRingBytes) {
      close_ring_slices(kRingSlices);
      ring_off_ = 0;
      ring_open_ = 0;
    }
    const auto first = ring_off_ / kRingSliceBytes, last = (ring_off_ + span - 1) / kRingSliceBytes;
    for (size_t s = first; s <= last; ++s) {
      if (ring_closed_[s]) {
        CUDA_CHECK(cudaEventSynchronize(ring_ev_[s]));
        ring_closed_[s] = false;
      }
    }
    void* p = static_cast<char*>(ring_) + ring_off_;
    ring_off_ += span;
    return p;
  }
  // Closes the open slices before `end` (after the uploads queued so far).
  void close_ring_slices(int end) {
    if (pool_->capturing()) return;  // (no upload is captured: the graphs read device buffers)
    for (; ring_open_ < end; ++ring_open_) {
      CUDA_CHECK(cudaEventRecord(ring_ev_[static_cast<size_t>(ring_open_)], stream_));
      ring_closed_[static_cast<size_t>(ring_open_)] = true;
    }
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    join_side();  // host reads and copies see the work queued beside the stream too
    check_cuda_tensor(src);
    if (src.nbytes() == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    throw_fault();
  }
  // The read lands in a pinned buffer of its own (slot ticket % kMaxPendingReads) and an event
  // marks it done; end_read waits for that event only, so work queued after begin_read runs on.
  int64_t begin_read(const Tensor& src) override {
    join_side();  // host reads and copies see the work queued beside the stream too
    check_cuda_tensor(src);
    BS_CHECK(reads_pending_ < kMaxPendingReads);
    const int64_t ticket = next_read_++;
    ++reads_pending_;
    PendingRead& r = reads_[ticket % kMaxPendingReads];
    r.bytes = src.nbytes();
    if (r.capacity < r.bytes) {
      if (r.host) CUDA_CHECK(cudaFreeHost(r.host));
      r.host = nullptr;
      r.capacity = std::max<size_t>(r.bytes, 4096);
      CUDA_CHECK(cudaHostAlloc(&r.host, r.capacity, cudaHostAllocDefault));
    }
    if (!r.done) CUDA_CHECK(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming));
    if (r.bytes > 0) {
      CUDA_CHECK(cudaMemcpyAsync(r.host, src.data(), r.bytes, cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_CHECK(cudaEventRecord(r.done, stream_));
    return ticket;
  }
  void end_read(int64_t ticket, void* dst) override {
    BS_CHECK(reads_pending_ > 0 && ticket == next_read_ - reads_pending_);
    --reads_pending_;
    PendingRead& r = reads_[ticket % kMaxPendingReads];
    CUDA_CHECK(cudaEventSynchronize(r.done));
    if (r.bytes > 0) std::memcpy(dst, r.host, r.bytes);
    throw_fault();
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    join_side();  // host reads and copies see the work queued beside the stream too
    BS_CHECK(dst.nbytes() == src.nbytes());
    if (dst.nbytes() == 0 || dst.data() == src.data()) return;
    CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(const Tensor& t) override {
    if (t.nbytes() == 0) return;
    CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_));
  }
  void copy_columns(const Tensor& dst, int64_t col_offset, const Tensor& src) override {
    const int64_t n = src.dim(0), d = src.row_numel(), big = dst.row_numel();
    BS_CHECK(dst.dim(0) == n && col_offset >= 0 && col_offset + d <= big);
    if (dst.dtype() == src.dtype()) {
      const size_t es = dtype_size(dst.dtype());
      CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + col_offset * es, big * es,
                                   src.data(), d * es, d * es, n, cudaMemcpyDeviceToDevice,
                                   stream_));
    } else {
      CUDA_CHECK(copy_block(out(dst), big, col_offset, in(src), d, 0, n, d, stream_));
    }
  }
  void slice_columns(const Tensor& dst, const Tensor& src, int64_t col_offset) override {
    const int64_t n = dst.dim(0), d = dst.row_numel(), big = src.row_numel();
    BS_CHECK(src.dim(0) == n && col_offset >= 0 && col_offset + d <= big);
    if (dst.dtype() == src.dtype()) {
      const size_t es = dtype_size(dst.dtype());
      CUDA_CHECK(cudaMemcpy2DAsync(dst.data(), d * es,
                                   static_cast<const char*>(src.data()) + col_offset * es, big * es,
                                   d * es, n, cudaMemcpyDeviceToDevice, stream_));
    } else {
      CUDA_CHECK(copy_block(out(dst), d, 0, in(src), big, col_offset, n, d, stream_));
    }
  }
  std::vector<float> to_host_f32(const Tensor& t) override {
    std::vector<float> result(static_cast<size_t>(t.numel()));
    if (t.numel() == 0) return result;
    if (t.dtype() == DType::kF32) {
      copy_to_host(result.data(), t);
      return result;
    }
    std::vector<unsigned char> raw(t.nbytes());
    copy_to_host(raw.data(), t);
    convert_to_f32(t.dtype(), raw.data(), result.data(), result.size());
    return result;
  }
  void synchronize() override {
    join_side();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // First use of a key runs eagerly (lazy plans, workspaces and kernel attributes get set up
  // outside any capture); the second captures a graph and launches it; later uses replay it. A
  // graph is captured again after capture_generation_ changed (a workspace it uses was
  // reallocated, or the GEMV mode changed).
  void run_captured(const std::string& key, const std::function<void()>& ops) override {
    if (!graphs_enabled_) {
      ops();
      return;
    }
    auto it = graphs_.find(key);
    if (it == graphs_.end() && graphs_.size() >= kMaxGraphs) {
      // Keys of reallocated scratch are never used again; rather than track them, drop every
      // graph once there are many (live keys are captured again on their next uses).
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (auto& [k, c] : graphs_) {
        if (c.exec) CUDA_CHECK(cudaGraphExecDestroy(c.exec));
      }
      graphs_.clear();
      it = graphs_.end();
    }
    if (it == graphs_.end()) {
      graphs_.emplace(key, Captured{});
      ops();
      return;
    }
    Captured& c = it->second;
    if (c.exec == nullptr || c.generation != capture_generation_) {
      if (c.exec != nullptr) CUDA_CHECK(cudaGraphExecDestroy(c.exec));
      c.exec = nullptr;
      c.keep.clear();
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const uint64_t before = capture_generation_;
      capture_keep_ = &c.keep;
      pool_->set_capturing(true);
      const auto abandon_capture = [&] {
        join_side();
        pool_->set_capturing(false);
        capture_keep_ = nullptr;
        cudaStreamEndCapture(stream_, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();
        c.keep.clear();
      };
      try {
        ops();
      } catch (const GrowthDuringCapture&) {
        // These shapes need memory the eager first use did not (a longer context, say): nothing
        // captured has run, so run the ops eagerly now; the next use captures.
        abandon_capture();
        ops();
        return;
      } catch (...) {  // an AllocationError: end the capture, keep no graph, pass it on
        abandon_capture();
        throw;
      }
      join_side();  // a forked branch joins the graph's end at the latest
      pool_->set_capturing(false);
      capture_keep_ = nullptr;
      CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      BS_CHECK(capture_generation_ == before && "a workspace grew during graph capture");
      CUDA_CHECK(cudaGraphInstantiate(&c.exec, graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
      c.generation = capture_generation_;
    }
    CUDA_CHECK(cudaGraphLaunch(c.exec, stream_));
  }

  // ---- Work beside the stream ----
  // Runs `ops` (backend calls, which then queue on side_stream_ with side_workspace_) after
  // everything queued on stream_ so far, concurrently with what is queued on stream_ after it;
  // stream_ waits for them at the next join_side() (inside a capture: a parallel branch of the
  // graph). The ops must not touch buffers that stream_'s work before the join writes or reads.
  template <typename F>
  void beside(F&& ops) {
    if (!beside_) {
      ops();
      return;
    }
    join_side();  // one branch at a time
    CUDA_CHECK(cudaEventRecord(fork_ev_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_ev_, 0));
    std::swap(stream_, side_stream_);
    std::swap(workspace_, side_workspace_);
    std::swap(split_counters_, side_split_counters_);
    std::swap(split_partials_, side_split_partials_);
    on_side_ = true;
    struct Restore {
      CudaBackend* b;
      ~Restore() {
        std::swap(b->stream_, b->side_stream_);
        std::swap(b->workspace_, b->side_workspace_);
        std::swap(b->split_counters_, b->side_split_counters_);
        std::swap(b->split_partials_, b->side_split_partials_);
        b->on_side_ = false;
      }
    };
    {
      const Restore restore{this};
      ops();
    }
    CUDA_CHECK(cudaEventRecord(join_ev_, side_stream_));
    side_pending_ = true;
  }
  void join_side() {
    if (!side_pending_) return;
    side_pending_ = false;
    CUDA_CHECK(cudaStreamWaitEvent(stream_, join_ev_, 0));
  }
  void run_beside(const std::function<void()>& ops) override { beside(ops); }
  void join_beside() override { join_side(); }

  // ---- Dense algebra ----
  void matmul(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
              bool accumulate) override {
    const int64_t m = w.dim(0), k = w.dim(-1);
    const int64_t n = k ? x.numel() / k : 0;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && w.numel() == m * k);
    if (n == 0 || m == 0) return;
    BS_CHECK(y.dtype() == DType::kBF16 || y.dtype() == DType::kF32);
    const bool bias_f32 = !bias || bias->dtype() == DType::kF32;
    const bool bf16_in = x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16 && bias_f32;
    const float* bp = bias ? bias->as<float>() : nullptr;
    if (gemv_mode_ == GemvMode::kMma && bf16_in && n <= pinned_rows_) {
      for_row_groups(x, y, n, [&](const Tensor& xr, const Tensor& yr, int64_t rows) {
        CUDA_CHECK(skinny_gemm(out(yr), xr.data(), w.data(), bp, rows, m, k, accumulate, stream_));
      });
      return;
    }
    if (bf16_in && streams(x, w, n)) {
      for_row_groups(x, y, n, [&](const Tensor& xr, const Tensor& yr, int64_t rows) {
        CUDA_CHECK(stream_gemm(out(yr), xr.data(), w.data(), bp, rows, m, k, accumulate, stream_,
                               stream_variant_, split_space()));
      });
      return;
    }
    if (gemv_mode_ == GemvMode::kSimt && bf16_in && gemv_supported(n, k, x.data(), w.data())) {
      CUDA_CHECK(gemv(out(y), x.data(), w.data(), bp, n, m, k, accumulate,
                      props_.multiProcessorCount, stream_));
      return;
    }
    // y[n,m] = x[n,k] w[m,k]^T  <=>  y^T (m x n, col-major) = w^T-as-stored (op T) . x^T.
    // kStream's fallback (other shapes) keeps the pinned algorithm too.
    const bool pinned = gemv_mode_ == GemvMode::kAuto || gemv_mode_ == GemvMode::kStream;
    const int64_t algo_n = pinned && n <= pinned_rows_ ? kSkinnyMaxRows : n;
    gemm_any(y, x, /*a_rows=*/n, k, /*trans_a=*/false, w, m, /*trans_b=*/true, accumulate, bias,
             algo_n);
  }

  // The stream GEMM's split space on the current stream (variants 8, 9, stream_gemm.h): its own
  // slots and counters (the sizes, so which matrices split, are fixed per backend). Without it
  // (not yet allocated, or the allocation failed) nothing splits.
  StreamSplitSpace split_space() const {
    if (!split_partials_) return {};
    return {split_partials_, kSplitPartialBytes, split_counters_, kSplitCounters};
  }
  int stream_split_count(int64_t m, int64_t k) const {
    return bs::cuda::stream_split_count(m, k, stream_variant_, split_space());
  }
  // The stream GEMM's variant, with the split space a split variant needs (not while capturing).
  void choose_stream_variant(int variant) {
    stream_variant_ = std::clamp(variant, 0, kStreamVariants - 1);
    if (stream_splits(stream_variant_)) allocate_split_space();
  }
  // Both streams' split spaces, once (a split variant chosen; not while capturing). A failed
  // allocation leaves them unallocated (products unsplit) and clears its error.
  void allocate_split_space() {
    if (split_partials_) return;
    bool ok = true;
    for (unsigned** c : {&split_counters_, &side_split_counters_}) {
      ok = ok && cudaMalloc(c, kSplitCounters * sizeof(unsigned)) == cudaSuccess &&
           cudaMemset(*c, 0, kSplitCounters * sizeof(unsigned)) == cudaSuccess;
    }
    for (float** p : {&split_partials_, &side_split_partials_}) {
      ok = ok && cudaMalloc(p, kSplitPartialBytes) == cudaSuccess;
    }
    if (ok) return;
    cudaGetLastError();
    free_split_space();
    std::fprintf(stderr,
                 "blockspec: no device memory for the stream GEMM's k-split slots (%zu MiB); "
                 "products stay unsplit\n",
                 2 * kSplitPartialBytes >> 20);
  }

  void free_split_space() {  // cudaFree(nullptr) does nothing
    cudaFree(split_counters_);
    cudaFree(side_split_counters_);
    cudaFree(split_partials_);
    cudaFree(side_split_partials_);
    split_counters_ = side_split_counters_ = nullptr;
    split_partials_ = side_split_partials_ = nullptr;
  }

  static bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; }
  // Runs f(x rows, y rows, count) over the n rows of x and y in groups of at most kSkinnyMaxRows,
  // in order. The few-row kernels (kMma, kStream, FP8) give a row the same bits whatever group it
  // is in, so products of up to pinned_rows_ rows (a batch's decode rows, its verify blocks) stay
  // row-invariant as with kAuto's pinned algorithm, at the cost of streaming the weights once a
  // group.
  template <typename F>
  static void for_row_groups(const Tensor& x, const Tensor& y, int64_t n, F&& f) {
    const Tensor x2 = x.view({n, x.numel() / n}), y2 = y.view({n, y.numel() / n});
    for (int64_t r0 = 0; r0 < n; r0 += kSkinnyMaxRows) {
      const int64_t rows = std::min(kSkinnyMaxRows, n - r0);
      f(x2.rows(r0, rows), y2.rows(r0, rows), rows);
    }
  }
  // Whether GemvMode::kStream takes a product of n rows of x with w: which matrices it takes
  // depends on their shape only, never on n (a row's bits must not depend on how many rows share
  // the product); more than 16 rows go 16 at a time up to the pinned row count.
  bool streams(const Tensor& x, const Tensor& w, int64_t n) const {
    const int64_t m = w.dim(0), k = w.dim(-1);
    return gemv_mode_ == GemvMode::kStream && m * k * 2 <= stream_max_bytes_ && n <= pinned_rows_ &&
           stream_gemm_supported(std::min(n, kSkinnyMaxRows), k, x.data(), w.data());
  }
  // Whether a product y = x · wᵀ (+ bias) of n rows takes a fused stream GEMM: the stream mode
  // with a fusing variant, and the matrix routed to it (by shape only, as in matmul).
  bool fuses_stream(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                    int64_t n) const {
    return stream_fuse_ && stream_fuses(stream_variant_) && x.dtype() == DType::kBF16 &&
           w.dtype() == DType::kBF16 && (!bias || bias->dtype() == DType::kF32) &&
           (y.dtype() == DType::kBF16 || y.dtype() == DType::kF32) && streams(x, w, n);
  }
  void norm_matmul(const Tensor& y, const Tensor& xn, const Tensor& x, const Tensor& norm_w,
                   float eps, const Tensor& w, const Tensor* bias, bool accumulate) override {
    const int64_t m = w.dim(0), k = w.dim(-1), n = k ? x.numel() / k : 0;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && norm_w.numel() == k);
    if (n > 0 && norm_w.dtype() == DType::kF32 && aligned16(norm_w) &&
        fuses_stream(y, x, w, bias, n)) {
      for_row_groups(x, y, n, [&](const Tensor& xr, const Tensor& yr, int64_t rows) {
        CUDA_CHECK(stream_gemm_fused(out(yr), StreamX::kRmsNormed, xr.data(), norm_w.as<float>(),
                                     eps, w.data(), bias ? bias->as<float>() : nullptr, rows, m, k,
                                     accumulate, stream_, stream_variant_, split_space()));
      });
      return;
    }
    Backend::norm_matmul(y, xn, x, norm_w, eps, w, bias, accumulate);
  }
  void swiglu_matmul(const Tensor& y, const Tensor& act, const Tensor& gate_up, const Tensor& w,
                     const Tensor* bias, bool accumulate) override {
    const int64_t m = w.dim(0), k = w.dim(-1), n = k ? gate_up.numel() / (2 * k) : 0;
    BS_CHECK(gate_up.numel() == 2 * n * k && y.numel() == n * m);
    // The fused SwiGLU gives the ops' bits, so how many rows take it may depend on n.
    if (n > 0 && n <= swiglu_fuse_rows_ && fuses_stream(y, gate_up, w, bias, n) &&
        stream_swiglu_fuses(std::min(n, kSkinnyMaxRows), m, k, stream_variant_, split_space())) {
      for_row_groups(gate_up, y, n, [&](const Tensor& gr, const Tensor& yr, int64_t rows) {
        CUDA_CHECK(stream_gemm_fused(out(yr), StreamX::kSwiglu, gr.data(), nullptr, 0.0f, w.data(),
                                     bias ? bias->as<float>() : nullptr, rows, m, k, accumulate,
                                     stream_, stream_variant_, split_space()));
      });
      return;
    }
    Backend::swiglu_matmul(y, act, gate_up, w, bias, accumulate);
  }

  // FP8 weights: fused with the bulk FP8 kernel (BLOCKSPEC_FP8_KERNEL=bulk), 16 rows a launch.
  bool fuses_fp8(const Tensor& y, const Tensor& x, const Fp8Weight& w) const {
    const int64_t k = w.q.dim(-1);
    return fp8_kernel_ == Fp8Kernel::kBulk && stream_fuse_ && x.dtype() == DType::kBF16 &&
           w.q.dtype() == DType::kF8E4M3 && w.scale.dtype() == DType::kF32 &&
           (y.dtype() == DType::kBF16 || y.dtype() == DType::kF32) &&
           bs::cuda::fp8_matmul_supported(k, x.data(), w.q.data());
  }
  // The bulk FP8 product of x's rows (x_cols columns a row: k, or 2k for SwiGLU's gate_up).
  void fp8_bulk(const Tensor& y, StreamX kind, const Tensor& x, int64_t x_cols,
                const Tensor* norm_w, float eps, const Fp8Weight& w, bool accumulate) {
    const int64_t m = w.q.dim(0), n = x.numel() / x_cols, k = w.q.dim(-1);
    for_row_groups(x, y, n, [&](const Tensor& xr, const Tensor& yr, int64_t rows) {
      CUDA_CHECK(bs::cuda::fp8_bulk_matmul(
          out(yr), xr.data(), static_cast<const uint8_t*>(w.q.data()), w.scale.as<float>(), rows, m,
          k, accumulate, stream_, kind, norm_w ? norm_w->as<float>() : nullptr, eps));
    });
  }
  void norm_matmul_fp8(const Tensor& y, const Tensor& xn, const Tensor& x, const Tensor& norm_w,
                       float eps, const Fp8Weight& w, bool accumulate) override {
    const int64_t m = w.q.dim(0), k = w.q.dim(-1), n = k ? x.numel() / k : 0;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && norm_w.numel() == k);
    if (n > 0 && norm_w.dtype() == DType::kF32 && aligned16(norm_w) && fuses_fp8(y, x, w)) {
      return fp8_bulk(y, StreamX::kRmsNormed, x, k, &norm_w, eps, w, accumulate);
    }
    Backend::norm_matmul_fp8(y, xn, x, norm_w, eps, w, accumulate);
  }
  void swiglu_matmul_fp8(const Tensor& y, const Tensor& act, const Tensor& gate_up,
                         const Fp8Weight& w, bool accumulate) override {
    const int64_t m = w.q.dim(0), k = w.q.dim(-1), n = k ? gate_up.numel() / (2 * k) : 0;
    BS_CHECK(gate_up.numel() == 2 * n * k && y.numel() == n * m);
    if (n > 0 && n <= swiglu_fuse_rows_ && fuses_fp8(y, gate_up, w) &&
        bs::cuda::fp8_bulk_swiglu_fuses(std::min(n, kSkinnyMaxRows), k)) {
      return fp8_bulk(y, StreamX::kSwiglu, gate_up, 2 * k, nullptr, 0.0f, w, accumulate);
    }
    Backend::swiglu_matmul_fp8(y, act, gate_up, w, accumulate);
  }

  Fp8Weight quantize_fp8_rows(const Tensor& w) override {
    const int64_t m = w.dim(0), k = w.dim(-1);
    BS_CHECK(w.numel() == m * k);
    Fp8Weight out{empty({m, k}, DType::kF8E4M3), empty({m}, DType::kF32)};
    CUDA_CHECK(bs::cuda::quantize_fp8_rows(static_cast<uint8_t*>(out.q.data()),
                                           out.scale.as<float>(), in(w), m, k, stream_));
    return out;
  }

  void matmul_fp8(const Tensor& y, const Tensor& x, const Fp8Weight& w, bool accumulate) override {
    BS_CHECK(w.q.dtype() == DType::kF8E4M3 && w.scale.dtype() == DType::kF32);
    const int64_t m = w.q.dim(0), k = w.q.dim(-1);
    const int64_t n = k ? x.numel() / k : 0;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && w.scale.numel() == m);
    if (n == 0 || m == 0) return;
    const auto* q = static_cast<const uint8_t*>(w.q.data());
    if (x.dtype() == DType::kBF16 && bs::cuda::fp8_matmul_supported(k, x.data(), q) &&
        fp8_kernel_ == Fp8Kernel::kV2) {
      const int sms = props_.multiProcessorCount;
      const bs::cuda::Fp8V2Plan plan = bs::cuda::fp8_v2_plan(m, k, sms);
      bs::cuda::Fp8V2Workspace ws{.num_sms = sms};
      if (plan.splits > 1) {
        ws.partials = static_cast<float*>(scratch(&fp8_part_ws_, &fp8_part_ws_bytes_,
                                                  static_cast<size_t>(plan.partial_floats) * 4));
        const size_t had = fp8_count_ws_bytes_;
        ws.counters = static_cast<int*>(
            scratch(&fp8_count_ws_, &fp8_count_ws_bytes_, static_cast<size_t>(plan.counters) * 4));
        // A new counter buffer starts at zero (never inside a capture: growth throws there).
        if (fp8_count_ws_bytes_ != had) {
          CUDA_CHECK(cudaMemsetAsync(ws.counters, 0, fp8_count_ws_bytes_, stream_));
        }
      }
      CUDA_CHECK(bs::cuda::fp8_matmul_v2(out(y), x.data(), q, w.scale.as<float>(), n, m, k,
                                         accumulate, ws, stream_));
      return;
    }
    if (x.dtype() == DType::kBF16 && bs::cuda::fp8_matmul_supported(k, x.data(), q) &&
        fp8_kernel_ == Fp8Kernel::kBulk) {  // v1's bits, 16 rows a launch as v1
      return fp8_bulk(y, StreamX::kRows, x, k, nullptr, 0.0f, w, accumulate);
    }
    if (x.dtype() == DType::kBF16 && bs::cuda::fp8_matmul_supported(k, x.data(), q)) {
      // v1 (the default): an FP16 copy of x, made once for more than 8 rows.
      void* x16 =
          n > 8 ? scratch(&x16_ws_, &x16_ws_bytes_, static_cast<size_t>(n * k) * 2) : nullptr;
      CUDA_CHECK(bs::cuda::fp8_matmul(out(y), x.data(), q, w.scale.as<float>(), n, m, k, accumulate,
                                      stream_, x16));
      return;
    }
    // Other shapes and dtypes: the weight dequantized into a BF16 temporary, then cuBLASLt.
    const Tensor deq = empty({m, k}, DType::kBF16);
    CUDA_CHECK(bs::cuda::dequantize_fp8_rows(out(deq), q, w.scale.as<float>(), m, k, stream_));
    matmul(y, x, deq, nullptr, accumulate);
  }

  void gemm(const Tensor& y, const Tensor& a, const Tensor& b, bool trans_a,
            bool trans_b) override {
    BS_CHECK(a.ndim() == 2 && b.ndim() == 2);
    const int64_t n = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
    const int64_t m = trans_b ? b.dim(0) : b.dim(1);
    BS_CHECK((trans_b ? b.dim(1) : b.dim(0)) == k && y.numel() == n * m);
    if (n == 0 || m == 0) return;
    if (k == 0) {
      fill_zero(y);
      return;
    }
    gemm_any(y, a, n, k, trans_a, b, m, trans_b, /*accumulate=*/false, nullptr, n);
  }

  void add(const Tensor& y, const Tensor& a, const Tensor& b) override {
    BS_CHECK(a.numel() == b.numel() && y.numel() == a.numel());
    CUDA_CHECK(bs::cuda::add(out(y), in(a), in(b), y.numel(), stream_));
  }
  void mul(const Tensor& y, const Tensor& a, const Tensor& b) override {
    BS_CHECK(a.numel() == b.numel() && y.numel() == a.numel());
    CUDA_CHECK(bs::cuda::mul(out(y), in(a), in(b), y.numel(), stream_));
  }

  // ---- Normalisation ----
  void rms_norm(const Tensor& y, const Tensor& x, const Tensor& w, float eps) override {
    const int64_t d = w.numel(), rows = d ? x.numel() / d : 0;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::rms_norm(out(y), in(x), in(w), rows, d, eps, stream_));
  }
  void layer_norm(const Tensor& y, const Tensor& x, int64_t d, const Tensor& w, const Tensor& b,
                  float eps) override {
    const int64_t rows = d ? x.numel() / d : 0;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::layer_norm(out(y), in(x), in_opt(w), in_opt(b), rows, d, eps, stream_));
  }
  void modulate(const Tensor& y, const Tensor& x, const Tensor& shift,
                const Tensor& scale) override {
    const int64_t d = x.dim(-1), rows = d ? x.numel() / d : 0;
    const bool per_row = shift.numel() == x.numel() && rows > 1;
    BS_CHECK((shift.numel() == x.numel() || shift.numel() == d) && scale.numel() == shift.numel() &&
             y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::modulate(out(y), in(x), in(shift), in(scale), rows, d, per_row, stream_));
  }

  // ---- Activations ----
  void silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) override {
    BS_CHECK(gate.numel() == up.numel() && y.numel() == up.numel());
    CUDA_CHECK(bs::cuda::silu_mul(out(y), in(gate), in(up), y.numel(), stream_));
  }
  void swiglu(const Tensor& y, const Tensor& gate_up) override {
    const int64_t i_dim = y.dim(-1), rows = i_dim ? y.numel() / i_dim : 0;
    BS_CHECK(gate_up.numel() == 2 * y.numel());
    if (y.dtype() == DType::kBF16 && gate_up.dtype() == DType::kBF16) {
      CUDA_CHECK(bs::cuda::swiglu(y.data(), gate_up.data(), rows, i_dim, stream_));
      return;
    }
    const Tensor g = empty({rows, i_dim}, gate_up.dtype()),
                 u = empty({rows, i_dim}, gate_up.dtype());
    slice_columns(g, gate_up.view({rows, 2 * i_dim}), 0);
    slice_columns(u, gate_up.view({rows, 2 * i_dim}), i_dim);
    silu_mul(y, g, u);
  }
  void gelu(const Tensor& y, const Tensor& x, bool tanh_approx) override {
    BS_CHECK(y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::gelu(out(y), in(x), y.numel(), tanh_approx, stream_));
  }
  void silu(const Tensor& y, const Tensor& x) override {
    BS_CHECK(y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::silu(out(y), in(x), y.numel(), stream_));
  }

  // ---- Embedding and positions ----
  void embedding(const Tensor& y, const Tensor& ids, const Tensor& table) override {
    const int64_t n = ids.numel(), d = table.dim(-1), vocab = table.dim(0);
    BS_CHECK(ids.dtype() == DType::kI32 && y.numel() == n * d);
    CUDA_CHECK(bs::cuda::embedding(out(y), ids.as<int32_t>(), in(table), n, d, vocab, stream_));
  }
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
            float attention_scaling) override {
    const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2);
    BS_CHECK(inv_freq.numel() == hd / 2 && positions.numel() == n &&
             positions.dtype() == DType::kI32);
    CUDA_CHECK(bs::cuda::rope(out(x), positions.as<int32_t>(), in(inv_freq), n, heads, hd,
                              attention_scaling, stream_));
  }

  // ---- Attention ----
  void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    const int64_t n = slots.numel(), row = k.row_numel();
    BS_CHECK(slots.dtype() == DType::kI32 && k.numel() == n * row && v.numel() == n * row);
    BS_CHECK(k_pool.numel() / (k_pool.dim(0) * k_pool.dim(1)) == row);
    const int64_t capacity = k_pool.dim(0) * k_pool.dim(1);
    CUDA_CHECK(bs::cuda::kv_write(out(k_pool), out(v_pool), in(k), in(v), slots.as<int32_t>(), n,
                                  row, capacity, fault_, stream_));
  }

  void paged_attention(const Tensor& o, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                       const Tensor& block_table, KvLength kv_len, AttentionMask mask,
                       float scale) override {
    const int64_t block_size = k_pool.dim(1);
    BS_CHECK(block_table.dtype() == DType::kI32 && block_table.numel() * block_size >= kv_len.max);
    const int32_t* kv_len_dev = nullptr;
    if (kv_len.device) {
      BS_CHECK(kv_len.device->dtype() == DType::kI32 && kv_len.device->numel() >= 1);
      kv_len_dev = kv_len.device->as<int32_t>();
    }
    run_attention(o, q, k_pool, v_pool, Paging{block_table.as<int32_t>(), block_size},
                  k_pool.dim(2), k_pool.dim(3), kv_len.max, kv_len_dev, mask, scale);
  }

  // All sequences in one split-KV launch (+ one combine launch). The lengths are on the device,
  // which only the split-KV kernels read, so like a single call with a device KvLength this needs
  // BF16 tensors and hd % 8 == 0 (the row kernel fallback takes host lengths only).
  void paged_attention_batch(const Tensor& o, const Tensor& q, const Tensor& k_pool,
                             const Tensor& v_pool, const Tensor& block_tables,
                             const Tensor& kv_lens, int64_t max_kv_len, AttentionMask mask,
                             float scale) override {
    const int64_t block_size = k_pool.dim(1);
    const int64_t num_seqs = block_tables.dim(0), capacity = block_tables.dim(1);
    BS_CHECK(block_tables.ndim() == 2 && block_tables.dtype() == DType::kI32 &&
             capacity * block_size >= max_kv_len);
    BS_CHECK(kv_lens.dtype() == DType::kI32 && kv_lens.numel() == num_seqs);
    BS_CHECK(num_seqs > 0 && q.dim(0) % num_seqs == 0);
    run_attention(o, q, k_pool, v_pool,
                  Paging{block_tables.as<int32_t>(), block_size, num_seqs, capacity}, k_pool.dim(2),
                  k_pool.dim(3), max_kv_len, kv_lens.as<int32_t>(), mask, scale);
  }

  void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions,
                          const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& slots) override {
    const PrologueArgs a = prologue_args(q_out, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                         attention_scaling, k_pool, v_pool, slots);
    CUDA_CHECK(bs::cuda::attention_prologue(a, stream_));
  }

  // One launch when the kernels allow it (BF16, head dim 64 / 128 / 256), else the two ops.
  void prologue_attention(const Tensor& o, const Tensor& q_scratch, const Tensor& qkv,
                          const Tensor& q_norm, const Tensor& k_norm, float eps,
                          const Tensor& positions, const Tensor& inv_freq, float attention_scaling,
                          const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                          const Tensor& block_tables, const Tensor& kv_lens, int64_t max_kv_len,
                          AttentionMask mask, float scale) override {
    const PrologueArgs p = prologue_args(q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                         attention_scaling, k_pool, v_pool, slots);
    const int64_t block_size = k_pool.dim(1), num_seqs = block_tables.dim(0);
    BS_CHECK(block_tables.ndim() == 2 && block_tables.dtype() == DType::kI32 &&
             block_tables.dim(1) * block_size >= max_kv_len);
    BS_CHECK(kv_lens.dtype() == DType::kI32 && kv_lens.numel() == num_seqs);
    BS_CHECK(num_seqs > 0 && q_scratch.dim(0) % num_seqs == 0 && o.numel() == q_scratch.numel());
    AttentionArgs a;
    a.out = o.data();
    a.q = q_scratch.data();
    a.k = k_pool.data();
    a.v = v_pool.data();
    a.t = elem(k_pool.dtype());
    a.block_table = block_tables.as<int32_t>();
    a.block_size = block_size;
    a.num_seqs = num_seqs;
    a.table_stride = block_tables.dim(1);
    a.n = q_scratch.dim(0) / num_seqs;
    a.heads = p.heads;
    a.kv_heads = p.kv_heads;
    a.hd = p.hd;
    a.kv_len = max_kv_len;
    a.causal = mask.causal;
    a.window = mask.window;
    a.scale = scale;
    if (o.dtype() == DType::kBF16 && q_scratch.dtype() == DType::kBF16 && use_flash_prefill(a)) {
      CUDA_CHECK(bs::cuda::attention_prologue(p, stream_));  // prompt rows: prologue, then flash
      CUDA_CHECK(bs::cuda::flash_prefill(a, kv_lens.as<int32_t>(), stream_));
      return;
    }
    if (o.dtype() == DType::kBF16 && fused_prologue_enabled() &&
        prologue_attention_supported(a, p)) {
      void* ws = attention_workspace(
          split_attention_workspace(q_scratch.dim(0), p.heads, p.hd, max_kv_len));
      CUDA_CHECK(bs::cuda::prologue_attention(a, p, kv_lens.as<int32_t>(), ws, stream_));
      return;
    }
    Backend::prologue_attention(o, q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                attention_scaling, k_pool, v_pool, slots, block_tables, kv_lens,
                                max_kv_len, mask, scale);
  }

  void attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                 AttentionMask mask, float scale) override {
    run_attention(o, q, k, v, Paging{}, k.dim(1), k.dim(2), k.dim(0), nullptr, mask, scale);
  }

 private:
  // Throws the fault a kernel recorded (the stream has been synchronised), clearing the record.
  void throw_fault() {
    const volatile FaultRecord* r = fault_host_;
    const auto op = static_cast<FaultOp>(r->op);
    if (op == FaultOp::kNone) return;
    const int64_t slot = r->slot, capacity = r->capacity;
    fault_host_->op = static_cast<int32_t>(FaultOp::kNone);
    CUDA_CHECK(cudaMemsetAsync(fault_.claim, 0, sizeof(int), stream_));
    const char* name = op == FaultOp::kKvWrite             ? "kv_write"
                       : op == FaultOp::kAttentionPrologue ? "attention_prologue"
                                                           : "prologue_attention";
    throw BackendFault(kv_slot_fault_message(name, slot, capacity));
  }

  PrologueArgs prologue_args(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                             const Tensor& k_norm, float eps, const Tensor& positions,
                             const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                             const Tensor& v_pool, const Tensor& slots) {
    PrologueArgs a;
    a.n = q_out.dim(0);
    a.heads = q_out.dim(1);
    a.hd = q_out.dim(2);
    a.kv_heads = k_pool.dim(2);
    a.capacity = k_pool.dim(0) * k_pool.dim(1);
    a.fault = fault_;
    BS_CHECK(q_out.dtype() == DType::kBF16 && qkv.dtype() == DType::kBF16 &&
             k_pool.dtype() == DType::kBF16 && v_pool.dtype() == DType::kBF16);
    BS_CHECK(qkv.numel() == a.n * (a.heads + 2 * a.kv_heads) * a.hd && k_pool.dim(3) == a.hd);
    BS_CHECK(positions.dtype() == DType::kI32 && slots.dtype() == DType::kI32 &&
             positions.numel() == a.n && slots.numel() == a.n);
    BS_CHECK(inv_freq.dtype() == DType::kF32 && inv_freq.numel() == a.hd / 2);
    a.qkv = static_cast<const __nv_bfloat16*>(qkv.data());
    a.q_out = static_cast<__nv_bfloat16*>(q_out.data());
    a.k_pool = static_cast<__nv_bfloat16*>(k_pool.data());
    a.v_pool = static_cast<__nv_bfloat16*>(v_pool.data());
    if (q_norm.defined()) {
      BS_CHECK(q_norm.dtype() == DType::kF32 && q_norm.numel() == a.hd);
      a.q_norm = q_norm.as<float>();
    }
    if (k_norm.defined()) {
      BS_CHECK(k_norm.dtype() == DType::kF32 && k_norm.numel() == a.hd);
      a.k_norm = k_norm.as<float>();
    }
    a.inv_freq = inv_freq.as<float>();
    a.positions = positions.as<int32_t>();
    a.slots = slots.as<int32_t>();
    a.eps = eps;
    a.attention_scaling = attention_scaling;
    return a;
  }
  // Prompt rows (more than kSkinnyMaxRows per sequence, causal, BF16, head dim 64 / 128) take
  // the tensor-core flash kernel; decode, verify and draft rows keep the split-KV kernel, whose
  // rounding the speculative pass relies on. BLOCKSPEC_FLASH_PREFILL=0 turns it off (a
  // measurement switch).
  static bool use_flash_prefill(const AttentionArgs& a) {
    static const bool enabled = [] {
      const char* v = std::getenv("BLOCKSPEC_FLASH_PREFILL");
      return v == nullptr || std::string_view(v) != "0";
    }();
    return enabled && a.n > kSkinnyMaxRows && flash_prefill_supported(a);
  }
  // BLOCKSPEC_FUSED_PROLOGUE=0: the prologue and the attention as two launches (a measurement
  // switch; the results are the same bits).
  static bool fused_prologue_enabled() {
    static const bool enabled = [] {
      const char* v = std::getenv("BLOCKSPEC_FUSED_PROLOGUE");
      return v == nullptr || std::string_view(v) != "0";
    }();
    return enabled;
  }

 public:
  // ---- Reductions ----
  void argmax(const Tensor& o, const Tensor& x) override {
    const int64_t v = x.dim(-1), n = v ? x.numel() / v : 0;
    BS_CHECK(o.dtype() == DType::kI32 && o.numel() >= n);
    CUDA_CHECK(bs::cuda::argmax(o.as<int32_t>(), in(x), n, v, stream_, argmax_keys_, kArgmaxKeys));
  }

  // ---- FlashMap ops ----
  void scatter_columns(const Tensor& dst, const Tensor& src, const Tensor& ids,
                       float fill) override {
    const int64_t n = dst.dim(0), v = dst.row_numel(), vs = src.row_numel();
    BS_CHECK(src.dim(0) == n && ids.numel() == vs && ids.dtype() == DType::kI32);
    CUDA_CHECK(
        bs::cuda::scatter_columns(out(dst), in(src), ids.as<int32_t>(), n, v, vs, fill, stream_));
  }
  void gated_add(const Tensor& y, const Tensor& x, const Tensor& gate) override {
    const int64_t d = gate.numel(), rows = d ? x.numel() / d : 0;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::gated_add(out(y), in(x), in(gate), rows, d, stream_));
  }
  void axpby(const Tensor& y, float a, const Tensor& x, float b, const Tensor& z) override {
    BS_CHECK(x.numel() == z.numel() && y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::axpby(out(y), a, in(x), b, in(z), y.numel(), stream_));
  }
  void softmax(const Tensor& y, const Tensor& x, float scale) override {
    const int64_t v = x.dim(-1), rows = v ? x.numel() / v : 0;
    BS_CHECK(y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::softmax(out(y), in(x), rows, v, scale, stream_));
  }
  void noise_combine(const Tensor& y, const Tensor& base, const Tensor& x, const Tensor& z,
                     const Tensor& w, float gate, float eps) override {
    const int64_t d = base.numel(), e = w.numel(), rows = d ? x.numel() / d : 0;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel() && z.numel() == rows * e);
    CUDA_CHECK(bs::cuda::noise_combine(out(y), in(base), in(x), in(z), in(w), rows, d, e, gate, eps,
                                       stream_));
  }
  void seeded_normal(const Tensor& o, const Tensor& positions, uint64_t seed, uint32_t stream,
                     float scale) override {
    const int64_t n = positions.numel(), d = o.numel() / std::max<int64_t>(1, n);
    BS_CHECK(o.numel() == n * d && positions.dtype() == DType::kI32);
    CUDA_CHECK(bs::cuda::seeded_normal(out(o), positions.as<int32_t>(), n, d, seed, stream, scale,
                                       stream_));
  }

  // ---- DSpark / DFlash2 ops ----
  void topk(const Tensor& values, const Tensor& ids, const Tensor& x) override {
    const int64_t v = x.dim(-1), n = v ? x.numel() / v : 0, k = values.dim(-1);
    BS_CHECK(values.dtype() == DType::kF32 && ids.dtype() == DType::kI32 && k >= 1 && k <= v &&
             values.numel() == n * k && ids.numel() == n * k);
    if (topk_two_stage(v, k)) {
      void* ws = scratch(&topk_ws_, &topk_ws_bytes_, topk_workspace_bytes(n, v, k));
      CUDA_CHECK(topk_fast(values.as<float>(), ids.as<int32_t>(), in(x), n, v, k, ws, stream_));
      return;
    }
    CUDA_CHECK(bs::cuda::topk(values.as<float>(), ids.as<int32_t>(), in(x), n, v, k, stream_));
  }
  void scale_softcap(const Tensor& y, const Tensor& x, float multiplier, float cap) override {
    BS_CHECK(y.numel() == x.numel());
    CUDA_CHECK(bs::cuda::scale_softcap(out(y), in(x), x.numel(), multiplier, cap, stream_));
  }
  void dynamic_conv(const Tensor& y, const Tensor& x, const Tensor& dyn, int64_t which,
                    const Tensor& base, int64_t group, int64_t block_rows,
                    bool accumulate) override {
    join_side();  // dyn may come from projected_conv's GEMM beside the stream
    const int64_t h = x.dim(-1), n = h ? x.numel() / h : 0, taps = h ? base.numel() / h : 0;
    BS_CHECK(group >= 1 && h % group == 0 && block_rows >= 1 && n % block_rows == 0);
    BS_CHECK(y.numel() == x.numel() && base.numel() == taps * h &&
             dyn.numel() == n * 2 * taps * (h / group) && (which == 0 || which == 1) &&
             y.data() != x.data());
    CUDA_CHECK(bs::cuda::dynamic_conv(out(y), in(x), in(dyn), which, in(base), n, h, taps, group,
                                      block_rows, accumulate, stream_, conv_fast_));
  }
  // The projection as conv_splits_ strided-batched K slices (one cuBLASLt launch, F32 partials)
  // summed by the convolution kernel: no split-K reduce launch. With conv_side_ only the prepare
  // half of the projection (dyn[:, 0], what this convolution needs) is on the stream's chain; the
  // finish half (dyn[:, 1], for dynamic_conv_rms_norm after the sublayer) is one GEMM beside it,
  // which the finish convolution joins (docs/CUDA.md).
  void projected_conv(const Tensor& y, const Tensor& dyn, const Tensor& x, const Tensor& proj,
                      const Tensor& base, int64_t group, int64_t block_rows) override {
    const int64_t h = x.dim(-1), n = h ? x.numel() / h : 0, taps = h ? base.numel() / h : 0;
    const int64_t width = proj.dim(0), splits = conv_splits_;
    const bool fits = conv_fast_ && splits > 1 && all_bf16({&y, &dyn, &x, &proj, &base}) &&
                      taps == 2 && h % group == 0 && width == 2 * taps * (h / group) &&
                      proj.dim(-1) == h && n % block_rows == 0 && h % (8 * splits) == 0 &&
                      dyn.numel() == n * width &&
                      bs::cuda::dynamic_conv_fused_supported(
                          n, h, taps, group, {y.data(), x.data(), base.data(), proj.data()});
    if (!fits) return Backend::projected_conv(y, dyn, x, proj, base, group, block_rows);
    auto* part = static_cast<float*>(
        scratch(&conv_part_ws_, &conv_part_ws_bytes_, static_cast<size_t>(splits * n * width) * 4));
    const int64_t chained = conv_side_ ? width / 2 : width;  // outputs on the chain
    if (conv_side_) {
      beside([&] {
        LtCall f;  // dyn[:, 1]ᵀ (width / 2 x n, column-major, ld width) = proj[width / 2:] · xᵀ
        f.op_a = CUBLAS_OP_T;
        f.m = width / 2;
        f.n = n;
        f.k = h;
        f.a = static_cast<const __nv_bfloat16*>(proj.data()) + (width / 2) * h;
        f.lda = h;
        f.b = x.data();
        f.ldb = h;
        f.d = static_cast<__nv_bfloat16*>(dyn.data()) + width / 2;
        f.ldd = width;
        run_lt(f);
      });
    }
    LtCall c;  // part[s]ᵀ (chained x n, column-major) = proj[:chained, slice s] · x[:, slice s]ᵀ
    c.op_a = CUBLAS_OP_T;
    c.m = chained;
    c.n = n;
    c.k = h / splits;
    c.a = proj.data();
    c.lda = h;
    c.b = x.data();
    c.ldb = h;
    c.d = part;
    c.td = CUDA_R_32F;
    c.ldd = chained;
    c.batch = static_cast<int32_t>(splits);
    c.stride_a = c.stride_b = h / splits;
    c.stride_d = n * chained;
    run_lt(c);
    CUDA_CHECK(bs::cuda::dynamic_conv_partials(
        static_cast<__nv_bfloat16*>(y.data()), static_cast<__nv_bfloat16*>(dyn.data()), part,
        splits, chained, static_cast<const __nv_bfloat16*>(x.data()),
        static_cast<const __nv_bfloat16*>(base.data()), n, h, group, block_rows, stream_));
  }
  void dynamic_conv_rms_norm(const Tensor& xn, const Tensor& residual, const Tensor& out,
                             const Tensor& dyn, const Tensor& base, int64_t group,
                             int64_t block_rows, const Tensor& norm_w, float eps) override {
    join_side();  // dyn[:, 1] may come from projected_conv's GEMM beside the stream
    const int64_t h = out.dim(-1), n = h ? out.numel() / h : 0, taps = h ? base.numel() / h : 0;
    const bool fits =
        conv_fast_ && conv_splits_ > 1 && all_bf16({&xn, &residual, &out, &dyn, &base}) &&
        norm_w.dtype() == DType::kF32 && norm_w.numel() == h && taps == 2 && h % group == 0 &&
        n % block_rows == 0 && residual.numel() == n * h && xn.numel() == n * h &&
        dyn.numel() == n * 2 * taps * (h / group) && residual.data() != out.data() &&
        bs::cuda::dynamic_conv_fused_supported(
            n, h, taps, group, {xn.data(), residual.data(), out.data(), base.data()});
    if (!fits) {
      return Backend::dynamic_conv_rms_norm(xn, residual, out, dyn, base, group, block_rows, norm_w,
                                            eps);
    }
    CUDA_CHECK(bs::cuda::dynamic_conv_rms_norm(
        static_cast<__nv_bfloat16*>(xn.data()), static_cast<__nv_bfloat16*>(residual.data()),
        static_cast<const __nv_bfloat16*>(out.data()),
        static_cast<const __nv_bfloat16*>(dyn.data()),
        static_cast<const __nv_bfloat16*>(base.data()), norm_w.as<float>(), n, h, group, block_rows,
        eps, stream_));
  }
  // ---- Fused drafter walks ----
  void markov_row(const Tensor& z, const Tensor& argmax, const Tensor& u, const Tensor& prev,
                  const Tensor& w1, const Tensor& w2) override {
    const int64_t v = w2.dim(0), r = w2.dim(-1);
    BS_CHECK(w1.dim(0) == v && w1.dim(-1) == r && u.numel() == v && prev.dtype() == DType::kI32);
    BS_CHECK(!z.defined() || (z.dtype() == DType::kF32 && z.numel() == v));
    BS_CHECK(!argmax.defined() || argmax.dtype() == DType::kI32);
    CUDA_CHECK(bs::cuda::markov_row(z.defined() ? z.as<float>() : nullptr,
                                    argmax.defined() ? argmax.as<int32_t>() : nullptr, in(u),
                                    prev.as<int32_t>(), in(w1), in(w2), v, r, walk_keys_,
                                    walk_counter_, props_.multiProcessorCount, stream_));
  }
  void markov_chain(const Tensor& drafts, const Tensor& anchor, const Tensor& u, const Tensor& w1,
                    const Tensor& w2, const Tensor& norms) override {
    if (!norms.defined()) {
      Backend::markov_chain(drafts, anchor, u, w1, w2, norms);
      return;
    }
    const int64_t k = u.dim(0), v = w2.dim(0), r = w2.dim(-1);
    BS_CHECK(w1.dim(0) == v && w1.dim(-1) == r && u.numel() == k * v);
    BS_CHECK(drafts.dtype() == DType::kI32 && drafts.numel() >= k && anchor.dtype() == DType::kI32);
    BS_CHECK(norms.dtype() == DType::kF32 && norms.numel() == v);
    void* ws = scratch(&chain_ws_, &chain_ws_bytes_, markov_chain_workspace_bytes(k, v));
    CUDA_CHECK(bs::cuda::markov_chain_pruned(drafts.as<int32_t>(), anchor.as<int32_t>(), in(u),
                                             in(w1), in(w2), norms.as<float>(), k, v, r, ws,
                                             walk_keys_, walk_counter_, stream_));
  }
  void candidate_walk(const Tensor& drafts, const Tensor& rows, const Tensor& probs,
                      const Tensor& anchor, const Tensor& vals, const Tensor& ids,
                      const Tensor& pred, const Tensor& succ, const Tensor& scale,
                      const sampling::FilterParams& filter, const Tensor& uniforms) override {
    WalkArgs a;
    a.k = vals.dim(0);
    a.t = vals.dim(-1);
    a.r = pred.defined() ? pred.dim(-1) : 0;
    a.vocab = pred.defined() ? pred.dim(0) : 0;
    a.v = rows.defined() ? rows.dim(-1) : probs.defined() ? probs.dim(-1) : a.vocab;
    const bool sampled = filter.temperature > 0.0f;
    BS_CHECK(vals.dtype() == DType::kF32 && ids.dtype() == DType::kI32 &&
             ids.numel() == a.k * a.t && vals.numel() == a.k * a.t);
    BS_CHECK(drafts.dtype() == DType::kI32 && drafts.numel() >= a.k &&
             anchor.dtype() == DType::kI32);
    BS_CHECK(!pred.defined() || (succ.dim(-1) == a.r && succ.dim(0) == a.vocab));
    BS_CHECK(!scale.defined() || (pred.defined() && scale.numel() == a.k * a.r));
    BS_CHECK(!rows.defined() || (rows.dtype() == DType::kF32 && rows.numel() == a.k * a.v));
    BS_CHECK(!sampled || (probs.dtype() == DType::kF32 && probs.numel() == a.k * a.v &&
                          uniforms.dtype() == DType::kF32 && uniforms.numel() >= a.k && a.v > 0));
    BS_CHECK(candidate_walk_supported(a.t, a.r) && "candidate_walk: too many candidates");
    a.drafts = drafts.as<int32_t>();
    a.rows = rows.defined() ? rows.as<float>() : nullptr;
    a.probs = sampled ? probs.as<float>() : nullptr;
    a.anchor = anchor.as<int32_t>();
    a.vals = vals.as<float>();
    a.ids = ids.as<int32_t>();
    a.pred = in_opt(pred);
    a.succ = in_opt(succ);
    a.scale = in_opt(scale);
    a.uniforms = sampled ? uniforms.as<float>() : nullptr;
    a.filter = {filter.temperature, filter.top_k, filter.top_p};
    float* table = nullptr;
    if (const int64_t n = candidate_walk_table_floats(a.k, a.t, a.r); n > 0 && walk_table_) {
      table = static_cast<float*>(scratch(&walk_ws_, &walk_ws_bytes_, n * sizeof(float)));
    }
    CUDA_CHECK(bs::cuda::candidate_walk(a, table, stream_));
  }

  // ---- Speculative decoding on the device ----
  void greedy_accept(const Tensor& o, const Tensor& tokens, const Tensor& target_ids,
                     const Tensor& offsets) override {
    BS_CHECK(o.dtype() == DType::kI32 && tokens.dtype() == DType::kI32 &&
             target_ids.dtype() == DType::kI32 && offsets.dtype() == DType::kI32);
    const int64_t seqs = offsets.numel() - 1, width = o.dim(-1);
    BS_CHECK(o.ndim() == 2 && seqs >= 0 && o.dim(0) == seqs && width >= 2);
    CUDA_CHECK(bs::cuda::greedy_accept(o.as<int32_t>(), tokens.as<int32_t>(),
                                       target_ids.as<int32_t>(), offsets.as<int32_t>(), seqs, width,
                                       stream_));
  }

  // ---- Sampling ----
  void filtered_probs(const Tensor& probs, const Tensor& logits,
                      std::span<const sampling::FilterParams> params) override {
    const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
    BS_CHECK(probs.dtype() == DType::kF32 && probs.numel() == n * v);
    BS_CHECK(params.size() == 1 || std::ssize(params) == n);
    std::vector<FilterArg> args(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      args[i] = {params[i].temperature, params[i].top_k, params[i].top_p, params[i].min_p};
    }
    CUDA_CHECK(bs::cuda::filtered_probs(probs.as<float>(), in(logits), n, v, args.data(),
                                        std::ssize(args), stream_));
  }
  // The rules go up in one copy (the tokens, then the requests' arguments) through the pinned ring.
  void apply_logit_rules(const Tensor& logits, const Tensor& row_tokens,
                         std::span<const sampling::LogitRules> requests) override {
    const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
    BS_CHECK(!row_tokens.defined() ||
             (row_tokens.dtype() == DType::kI32 && row_tokens.numel() >= n));
    if (requests.empty()) return;
    std::vector<LogitRulesArg> args;
    int64_t token_count = 0, max_rows = 0;
    for (const sampling::LogitRules& req : requests) {
      BS_CHECK(req.first_row >= 0 && req.rows >= 0 && req.first_row + req.rows <= n);
      BS_CHECK(req.rows <= 1 || row_tokens.defined());
      args.push_back({.first_row = req.first_row,
                      .rows = req.rows,
                      .stop_rows = req.stop_rows,
                      .token_offset = token_count,
                      .token_count = std::ssize(req.tokens),
                      .repetition = req.repetition,
                      .frequency = req.frequency,
                      .presence = req.presence});
      token_count += std::ssize(req.tokens);
      max_rows = std::max(max_rows, req.rows);
    }
    // One upload: every request's token rules, then the requests' arguments, packed straight
    // into the staging memory (a long prompt under a repetition penalty names thousands).
    static_assert(sizeof(sampling::TokenRule) % 8 == 0 && sizeof(LogitRulesArg) % 8 == 0);
    const size_t token_bytes = static_cast<size_t>(token_count) * sizeof(sampling::TokenRule);
    const size_t bytes = token_bytes + args.size() * sizeof(LogitRulesArg);
    const int64_t words = static_cast<int64_t>(bytes / 4);  // I32 elements
    if (!rules_dev_.defined() || rules_dev_.numel() < words) {
      rules_dev_ = empty({std::max<int64_t>(words * 2, 4096)}, DType::kI32);
    }
    const auto pack = [&](void* staging) {
      char* p = static_cast<char*>(staging);
      for (const sampling::LogitRules& req : requests) {
        if (req.tokens.empty()) continue;
        std::memcpy(p, req.tokens.data(), req.tokens.size_bytes());
        p += req.tokens.size_bytes();
      }
      std::memcpy(p, args.data(), args.size() * sizeof(LogitRulesArg));
    };
    const Tensor dst = rules_dev_.rows(0, words);
    if (bytes <= kMaxStagedBytes) {
      upload_staged(dst, pack);
    } else {
      std::vector<uint64_t> packed(bytes / 8);
      pack(packed.data());
      copy_from_host(dst, packed.data());
    }
    const char* dev = static_cast<const char*>(rules_dev_.data());
    CUDA_CHECK(bs::cuda::apply_logit_rules(
        out(logits), v, row_tokens.defined() ? row_tokens.as<int32_t>() : nullptr,
        reinterpret_cast<const LogitRulesArg*>(dev + token_bytes), std::ssize(args), max_rows,
        reinterpret_cast<const sampling::TokenRule*>(dev), stream_));
  }
  void sample_from_probs(const Tensor& o, const Tensor& weights, const Tensor& uniforms) override {
    const int64_t v = weights.dim(-1), n = v ? weights.numel() / v : 0;
    BS_CHECK(weights.dtype() == DType::kF32 && uniforms.dtype() == DType::kF32);
    BS_CHECK(o.dtype() == DType::kI32 && o.numel() >= n && uniforms.numel() >= n);
    void* ws = scratch(&draw_ws_, &draw_ws_bytes_, draw_workspace_bytes(n, v));
    CUDA_CHECK(bs::cuda::sample_from_probs(o.as<int32_t>(), weights.as<float>(),
                                           uniforms.as<float>(), n, v, ws, stream_));
  }
  void rejection_sample(const Tensor& o, const Tensor& drafts, const Tensor& q, const Tensor& p,
                        const Tensor& uniforms) override {
    const int64_t k = drafts.defined() ? drafts.numel() : 0, v = p.dim(-1);
    BS_CHECK(k == 0 ||
             (drafts.dtype() == DType::kI32 && q.dtype() == DType::kF32 && q.numel() == k * v));
    BS_CHECK(p.dtype() == DType::kF32 && p.numel() == (k + 1) * v);
    BS_CHECK(uniforms.dtype() == DType::kF32 && uniforms.numel() == k + 1);
    BS_CHECK(o.dtype() == DType::kI32 && o.numel() >= k + 2);
    void* ws = scratch(&draw_ws_, &draw_ws_bytes_, draw_workspace_bytes(1, v));
    CUDA_CHECK(bs::cuda::rejection_sample(o.as<int32_t>(), k > 0 ? drafts.as<int32_t>() : nullptr,
                                          k > 0 ? q.as<float>() : nullptr, p.as<float>(),
                                          uniforms.as<float>(), k, v, ws, stream_));
  }

 private:
  // The BLOCKSPEC_* switches of kernel variants and measurements (docs/CUDA.md), read once when
  // the backend is made. A value the switch does not know is reported and ignored.
  static int env_choice(const char* name, std::initializer_list<const char*> values) {
    const char* env = std::getenv(name);
    if (!env || !*env) return -1;  // unset or empty: the default
    int i = 0;
    std::string known;
    for (const char* v : values) {
      if (std::strcmp(env, v) == 0) return i;
      if (i++ > 0) known += '|';
      known += v;
    }
    std::fprintf(stderr, "blockspec: ignoring %s=%s (expected %s)\n", name, env, known.c_str());
    return -1;
  }
  // The numeric switches: an integer in [lo, hi], the whole value; anything else is reported and
  // ignored (nullopt, as when unset or empty).
  static std::optional<int64_t> env_int(const char* name, int64_t lo, int64_t hi) {
    const char* env = std::getenv(name);
    if (!env || !*env) return std::nullopt;
    int64_t v = 0;
    const char* end = env + std::strlen(env);
    const auto [stop, ec] = std::from_chars(env, end, v);
    if (ec == std::errc() && stop == end && v >= lo && v <= hi) return v;
    std::fprintf(stderr, "blockspec: ignoring %s=%s (expected an integer in [%lld, %lld])\n", name,
                 env, static_cast<long long>(lo), static_cast<long long>(hi));
    return std::nullopt;
  }
  void read_switches() {
    constexpr GemvMode kGemv[] = {GemvMode::kCublasLt, GemvMode::kSimt, GemvMode::kMma,
                                  GemvMode::kStream};
    if (const int c = env_choice("BLOCKSPEC_GEMV", {"cublaslt", "simt", "mma", "stream"}); c >= 0) {
      gemv_mode_ = kGemv[c];
    }
    if (const auto v = env_int("BLOCKSPEC_STREAM_VARIANT", 0, kStreamVariants - 1)) {
      choose_stream_variant(static_cast<int>(*v));
    }
    if (const auto v = env_int("BLOCKSPEC_STREAM_MAX_MIB", 0, int64_t{1} << 20)) {
      stream_max_bytes_ = *v << 20;
    }
    if (const int c = env_choice("BLOCKSPEC_STREAM_FUSE", {"0", "1"}); c >= 0) {
      stream_fuse_ = c == 1;
    }
    if (const auto v = env_int("BLOCKSPEC_STREAM_SWIGLU_ROWS", 0, int64_t{1} << 20)) {
      swiglu_fuse_rows_ = *v;
    }
    if (const auto v = env_int("BLOCKSPEC_STREAM_PREFETCH_MIB", 0, 1024)) {
      set_stream_l2_prefetch(*v << 20);
    }
    if (const auto v = env_int("BLOCKSPEC_STREAM_RESIDENT_ROWS", 1, 17)) {
      set_stream_resident_rows(static_cast<int>(*v));
    }
    if (const int c = env_choice("BLOCKSPEC_CUDA_GRAPHS", {"0", "1"}); c >= 0) {
      graphs_enabled_ = c == 1;
    }
    if (const auto v = env_int("BLOCKSPEC_PINNED_ROWS", kSkinnyMaxRows, int64_t{1} << 20)) {
      pinned_rows_ = *v;
    }
    if (const int c = env_choice("BLOCKSPEC_ATTN_KERNEL", {"v1", "v2", "v3", "v4"}); c >= 0) {
      set_split_kernel(c + 1);
    }
    if (const int c = env_choice("BLOCKSPEC_ATTN_QPT", {"auto", "2", "4", "8"}); c >= 0) {
      set_split_qpt(c == 0 ? 0 : 1 << c);
    }
    if (const int c = env_choice("BLOCKSPEC_ATTN_MMA_TILE", {"16", "32", "64"}); c >= 0) {
      set_split_mma_tile(16 << c);
    }
    if (const auto v = env_int("BLOCKSPEC_ATTN_DIAG", 0, 7); v && *v != 0) {
      std::fprintf(stderr,
                   "blockspec: BLOCKSPEC_ATTN_DIAG=%lld leaves parts of the attention out: its "
                   "results are meaningless (a profiling switch, docs/CUDA.md)\n",
                   static_cast<long long>(*v));
      set_split_diag(static_cast<int>(*v));
    }
    if (const int c = env_choice("BLOCKSPEC_WALK_TABLE", {"0", "1"}); c >= 0) walk_table_ = c == 1;
    if (const int c = env_choice("BLOCKSPEC_CONV_KERNEL", {"generic", "fast"}); c >= 0) {
      conv_fast_ = c == 1;
    }
    if (const auto v = env_int("BLOCKSPEC_CONV_SPLITS", 0, 64)) conv_splits_ = *v;
    if (const int c = env_choice("BLOCKSPEC_CONV_SIDE", {"0", "1"}); c >= 0) conv_side_ = c == 1;
    if (const int c = env_choice("BLOCKSPEC_BESIDE", {"0", "1"}); c >= 0) beside_ = c == 1;
    // Which split-K reduction schemes cuBLASLt's heuristic may pick (measurements only):
    // "inplace" leaves out the schemes that reduce in a separate kernel launch.
    if (const int c = env_choice("BLOCKSPEC_LT_REDUCTION", {"inplace", "none"}); c >= 0) {
      lt_reduction_mask_ = c == 0
                               ? CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_NONE
                               : CUBLASLT_REDUCTION_SCHEME_NONE;
    }
    if (const int c = env_choice("BLOCKSPEC_FP8_KERNEL", {"v1", "v2", "bulk"}); c >= 0) {
      constexpr Fp8Kernel kKernels[] = {Fp8Kernel::kV1, Fp8Kernel::kV2, Fp8Kernel::kBulk};
      fp8_kernel_ = kKernels[c];
    }
  }
  static bool all_bf16(std::initializer_list<const Tensor*> ts) {
    for (const Tensor* t : ts) {
      if (t->dtype() != DType::kBF16) return false;
    }
    return true;
  }

  // A scratch copy of `t` in `dtype` (or `t` itself when it already has it).
  Tensor as_dtype(const Tensor& t, DType dtype) {
    if (t.dtype() == dtype) return t;
    Tensor s = empty({t.numel()}, dtype);
    CUDA_CHECK(convert(out(s), in(t), t.numel(), stream_));
    return s;
  }

  // A device scratch buffer *buf of at least `bytes` (capacity *cap). Growing it reallocates,
  // which makes run_captured capture its graphs again (they hold the old address).
  void* scratch(void** buf, size_t* cap, size_t bytes) {
    // One set of scratch buffers, used in stream_'s order: an op beside it would race.
    BS_CHECK(!on_side_ && "an op that needs scratch memory was queued beside the stream");
    if (bytes > *cap) {
      if (pool_->capturing()) throw GrowthDuringCapture{};  // run_captured runs the ops eagerly
      if (*buf) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        pool_->free(*buf, *cap);
        *buf = nullptr;
        *cap = 0;
      }
      ++capture_generation_;
      size_t want = std::max(bytes * 5 / 4, size_t{1} << 20);
      try {
        *buf = pool_->malloc(want);
      } catch (const AllocationError&) {
        want = bytes;  // without the growth slack, or the error goes to the step
        *buf = pool_->malloc(want);
      }
      *cap = want;
    }
    return *buf;
  }
  void* attention_workspace(size_t bytes) { return scratch(&attn_ws_, &attn_ws_bytes_, bytes); }

  // Where the keys of an attention call live: dense k / v (no table), or paged pools read through
  // the block tables of num_seqs sequences, sequence s's table at table + s * table_stride.
  struct Paging {
    const int32_t* table = nullptr;  // [num_seqs, table_stride]
    int64_t block_size = 0;
    int64_t num_seqs = 1, table_stride = 0;
  };

  // Paged (table set) or dense attention over q / o [num_seqs * n, heads, hd]. BF16 paged calls
  // take the split-KV kernels (which can read the lengths from kv_len_dev [num_seqs], kv_len then
  // bounding the launch); everything else the one-block-per-row kernel, with operands converted
  // to the K/V dtype.
  void run_attention(const Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Paging& paging, int64_t kv_heads, int64_t hd, int64_t kv_len,
                     const int32_t* kv_len_dev, AttentionMask mask, float scale) {
    const int64_t rows = q.dim(0), heads = q.dim(1), n = rows / paging.num_seqs;
    BS_CHECK(q.dim(2) == hd && kv_heads > 0 && heads % kv_heads == 0 && n <= kv_len);
    BS_CHECK(o.numel() == q.numel() && k.dtype() == v.dtype());
    BS_CHECK(hd <= 256);
    const DType kvt = k.dtype();
    BS_CHECK(kvt == DType::kBF16 || kvt == DType::kF32);
    const Tensor qq = as_dtype(q, kvt);
    const Tensor oo = o.dtype() == kvt ? o : empty({o.numel()}, kvt);
    AttentionArgs a;
    a.out = oo.data();
    a.q = qq.data();
    a.k = k.data();
    a.v = v.data();
    a.t = elem(kvt);
    a.block_table = paging.table;
    a.block_size = paging.block_size;
    a.num_seqs = paging.num_seqs;
    a.table_stride = paging.table_stride;
    a.n = n;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.hd = hd;
    a.kv_len = kv_len;
    a.causal = mask.causal;
    a.window = mask.window;
    a.scale = scale;
    if (q.dtype() == kvt && o.dtype() == kvt && use_flash_prefill(a)) {
      CUDA_CHECK(bs::cuda::flash_prefill(a, kv_len_dev, stream_));
      return;
    }
    if (q.dtype() == kvt && o.dtype() == kvt && split_attention_supported(a)) {
      void* ws = attention_workspace(split_attention_workspace(rows, heads, hd, kv_len));
      CUDA_CHECK(split_attention(a, kv_len_dev, ws, stream_));
      return;
    }
    BS_CHECK(kv_len_dev == nullptr && "a device kv length needs BF16 tensors and hd % 8 == 0");
    CUDA_CHECK(bs::cuda::attention(a, stream_));
    if (oo.data() != o.data()) CUDA_CHECK(convert(out(o), in(oo), o.numel(), stream_));
  }

  // y[n,m] = op(a)[n,k] . op(b)[k,m] for row-major a, b, y; a_rows = n, b_cols = m.
  void gemm_any(const Tensor& y, const Tensor& a, int64_t n, int64_t k, bool trans_a,
                const Tensor& b, int64_t m, bool trans_b, bool accumulate, const Tensor* bias,
                int64_t algo_n) {
    BS_CHECK(y.dtype() == DType::kBF16 || y.dtype() == DType::kF32);
    // Operand types: all-F32 runs in fp32; otherwise operands are BF16 (converted if needed).
    const bool all_f32 =
        a.dtype() == DType::kF32 && b.dtype() == DType::kF32 && y.dtype() == DType::kF32;
    const DType op_t = all_f32 ? DType::kF32 : DType::kBF16;
    const Tensor aa = as_dtype(a, op_t), bb = as_dtype(b, op_t);
    LtCall c;
    c.m = m;
    c.n = n;
    c.k = k;
    // cuBLASLt A = op(b)^T in column-major.
    c.a = bb.data();
    c.ta = cuda_type(op_t);
    if (trans_b) {  // b stored [m, k] row-major = k x m column-major
      c.op_a = CUBLAS_OP_T;
      c.lda = k;
    } else {  // b stored [k, m] row-major = m x k column-major
      c.op_a = CUBLAS_OP_N;
      c.lda = m;
    }
    // cuBLASLt B = op(a)^T.
    c.b = aa.data();
    c.tb = cuda_type(op_t);
    if (trans_a) {  // a stored [k, n] row-major = n x k column-major
      c.op_b = CUBLAS_OP_T;
      c.ldb = n;
    } else {  // a stored [n, k] row-major = k x n column-major
      c.op_b = CUBLAS_OP_N;
      c.ldb = k;
    }
    c.d = y.data();
    c.td = cuda_type(y.dtype());
    c.ldd = m;
    c.accumulate = accumulate;
    c.algo_n = trans_a ? n : algo_n;
    if (bias) {
      BS_CHECK(bias->numel() == m);
      c.bias = bias->data();
      c.tbias = cuda_type(bias->dtype());
    }
    if (!run_lt(c) && bias) {
      CUDA_CHECK(add_bias(out(y), in(*bias), n, m, stream_));
    }
  }

  // Runs the GEMM; returns whether the bias (if any) went through the epilogue.
  bool run_lt(const LtCall& c) {
    const auto key = std::make_tuple(
        static_cast<int>(c.op_a), static_cast<int>(c.op_b), c.m, c.n, c.k, static_cast<int>(c.ta),
        static_cast<int>(c.tb), static_cast<int>(c.td), c.lda, c.ldb, c.ldd, c.accumulate,
        c.bias != nullptr, static_cast<int>(c.tbias),
        std::min(alignment(c.a), alignment(c.b)) * 1000 + std::min(alignment(c.d), 256u),
        c.bias ? alignment(c.bias) : 0u, c.algo_n, c.batch, c.stride_a, c.stride_b, c.stride_d);
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make_plan(c, /*allow_bias=*/true)).first;
    LtPlan& plan = it->second;
    if (plan.bias_in_epilogue) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &c.bias, sizeof(c.bias)));
    }
    const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
    cublasStatus_t st =
        cublasLtMatmul(lt_, plan.desc, &alpha, c.a, plan.a, c.b, plan.b, &beta, c.d, plan.d, c.d,
                       plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream_);
    if (st != CUBLAS_STATUS_SUCCESS && plan.bias_in_epilogue) {
      // The bias epilogue was offered but refused at run time: plan again without it.
      destroy(plan);
      plan = make_plan(c, /*allow_bias=*/false);
      st = cublasLtMatmul(lt_, plan.desc, &alpha, c.a, plan.a, c.b, plan.b, &beta, c.d, plan.d, c.d,
                          plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream_);
    }
    CUBLAS_CHECK(st);
    return plan.bias_in_epilogue;
  }

  static void destroy(LtPlan& plan) {
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d) cublasLtMatrixLayoutDestroy(plan.d);
    plan = LtPlan{};
  }

  LtPlan make_plan(const LtCall& c, bool allow_bias) {
    LtPlan plan;
    for (const bool with_bias : {true, false}) {
      if (with_bias && (!c.bias || !allow_bias)) continue;
      if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
      // fp32 accumulation (true fp32, not TF32, for F32 operands).
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.op_a,
                                                  sizeof(c.op_a)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.op_b,
                                                  sizeof(c.op_b)));
      if (with_bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof(epi)));
        const int32_t bt = static_cast<int32_t>(c.tbias);
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bt, sizeof(bt)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &c.bias, sizeof(c.bias)));
      }
      if (!plan.a) {
        const bool at = c.op_a == CUBLAS_OP_T, bt = c.op_b == CUBLAS_OP_T;
        CUBLAS_CHECK(
            cublasLtMatrixLayoutCreate(&plan.a, c.ta, at ? c.k : c.m, at ? c.m : c.k, c.lda));
        CUBLAS_CHECK(
            cublasLtMatrixLayoutCreate(&plan.b, c.tb, bt ? c.n : c.k, bt ? c.k : c.n, c.ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, c.td, c.m, c.n, c.ldd));
        if (c.batch > 1) {
          const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
              {plan.a, c.stride_a}, {plan.b, c.stride_b}, {plan.d, c.stride_d}};
          for (const auto& [layout, stride] : layouts) {
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
                layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c.batch, sizeof(c.batch)));
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
                layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
          }
        }
      }
      cublasLtMatmulPreference_t pref = nullptr;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = kWorkspaceBytes;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &lt_reduction_mask_, sizeof(lt_reduction_mask_)));
      const uint32_t al_a = alignment(c.a), al_b = alignment(c.b), al_d = alignment(c.d);
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
      cublasLtMatmulHeuristicResult_t result{};
      int count = 0;
      cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
      if (c.algo_n > 0 && c.algo_n != c.n && c.op_b == CUBLAS_OP_N) {
        // Choose for N = algo_n, then check the algorithm on the real problem.
        cublasLtMatrixLayout_t qb = nullptr, qd = nullptr;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qb, c.tb, c.k, c.algo_n, c.ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qd, c.td, c.m, c.algo_n, c.ldd));
        st = cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, qb, qd, qd, pref, 1, &result,
                                            &count);
        cublasLtMatrixLayoutDestroy(qb);
        cublasLtMatrixLayoutDestroy(qd);
        if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
          cublasLtMatmulHeuristicResult_t check{};
          st = cublasLtMatmulAlgoCheck(lt_, plan.desc, plan.a, plan.b, plan.d, plan.d, &result.algo,
                                       &check);
          if (st == CUBLAS_STATUS_SUCCESS && check.workspaceSize > kWorkspaceBytes) {
            st = CUBLAS_STATUS_NOT_SUPPORTED;
          }
        }
      }
      if (st != CUBLAS_STATUS_SUCCESS || count == 0) {
        st = cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1,
                                            &result, &count);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
        plan.algo = result.algo;
        plan.bias_in_epilogue = with_bias;
        return plan;
      }
    }
    std::fprintf(stderr,
                 "blockspec: cuBLASLt found no algorithm for m=%lld n=%lld k=%lld (types %d %d "
                 "%d)\n",
                 static_cast<long long>(c.m), static_cast<long long>(c.n),
                 static_cast<long long>(c.k), static_cast<int>(c.ta), static_cast<int>(c.tb),
                 static_cast<int>(c.td));
    std::abort();
  }

  using PlanKey =
      std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t,
                 bool, bool, int, uint32_t, uint32_t, int64_t, int32_t, int64_t, int64_t, int64_t>;

  int device_;
  std::shared_ptr<DevicePool> pool_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  // beside(): a second stream with its own cuBLASLt workspace, forked from and joined to stream_.
  cudaStream_t side_stream_ = nullptr;
  void* side_workspace_ = nullptr;
  unsigned* split_counters_ = nullptr;  // split_space(); swapped with the side stream's
  unsigned* side_split_counters_ = nullptr;
  float* split_partials_ = nullptr;
  float* side_split_partials_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool side_pending_ = false;  // work was queued beside and stream_ has not waited for it yet
  bool beside_ = true;         // false: beside() runs its ops on stream_ (BLOCKSPEC_BESIDE=0)
  bool on_side_ = false;       // inside beside()'s ops (stream_ is the side stream)
  void* ring_ = nullptr;
  FaultRecord* fault_host_ = nullptr;  // host-mapped (FaultSink); fault_.record is its device view
  FaultSink fault_;
  size_t ring_off_ = 0;  // the ring's write offset
  int ring_open_ = 0;    // the first slice not closed since the ring's last wrap
  std::array<cudaEvent_t, kRingSlices> ring_ev_{};
  std::array<bool, kRingSlices> ring_closed_{};
  // begin_read / end_read: a pinned buffer and an event per pending read (freed with the backend).
  struct PendingRead {
    void* host = nullptr;
    size_t capacity = 0, bytes = 0;
    cudaEvent_t done = nullptr;
    PendingRead() = default;
    PendingRead(const PendingRead&) = delete;
    PendingRead& operator=(const PendingRead&) = delete;
    ~PendingRead() {
      if (host) cudaFreeHost(host);
      if (done) cudaEventDestroy(done);
    }
  };
  PendingRead reads_[kMaxPendingReads];
  int64_t next_read_ = 0;
  int reads_pending_ = 0;
  cudaDeviceProp props_{};
  GemvMode gemv_mode_ = GemvMode::kAuto;
  // Products of up to this many rows use the algorithm chosen for kSkinnyMaxRows rows
  // (GemvMode::kAuto); BLOCKSPEC_PINNED_ROWS / set_pinned_rows raise it (experiment).
  int64_t pinned_rows_ = kSkinnyMaxRows;
  // GemvMode::kStream: the tuning variant, and the largest matrix (bytes) it takes.
  int stream_variant_ = kStreamDefaultVariant;
  int64_t stream_max_bytes_ = kStreamDefaultMaxMib << 20;
  bool stream_fuse_ = true;  // norm_matmul / swiglu_matmul fused where the variant can
  // swiglu_matmul(_fp8) fuses products of at most this many rows (BLOCKSPEC_STREAM_SWIGLU_ROWS;
  // its x is gate and up, twice a plain product's x bytes, so at 9-16 rows the ops apart may win).
  int64_t swiglu_fuse_rows_ = int64_t{1} << 20;
  std::map<PlanKey, LtPlan> plans_;
  // Scratch (see scratch()): split-KV attention partials; matmul_fp8's FP16 copy of x. Growing
  // one (or changing the GEMV mode) bumps capture_generation_, which makes run_captured capture
  // its graphs again.
  void* attn_ws_ = nullptr;
  size_t attn_ws_bytes_ = 0;
  void* x16_ws_ = nullptr;
  size_t x16_ws_bytes_ = 0;
  // fp8_matmul_v2's split partials and arrival counters (the counters zeroed when allocated).
  void* fp8_part_ws_ = nullptr;
  size_t fp8_part_ws_bytes_ = 0;
  // projected_conv's F32 partials [splits, n, width].
  void* conv_part_ws_ = nullptr;
  size_t conv_part_ws_bytes_ = 0;
  void* fp8_count_ws_ = nullptr;
  size_t fp8_count_ws_bytes_ = 0;
  // matmul_fp8's kernel: v1 unless BLOCKSPEC_FP8_KERNEL=v2 (the A/B switch) or set_fp8_kernel;
  // v2 measured slower on the draft step's shapes (docs/BENCHMARKS.md, session 10).
  Fp8Kernel fp8_kernel_ = Fp8Kernel::kV1;
  bool conv_fast_ = true;  // dynamic_conv: the 8-channel BF16 kernel where it applies
  // projected_conv's K slices; <= 1 runs DFlash2's convolutions unfused (BLOCKSPEC_CONV_SPLITS).
  int64_t conv_splits_ = 4;
  // projected_conv: dyn[:, 1]'s GEMM beside the stream (BLOCKSPEC_CONV_SIDE).
  bool conv_side_ = true;
  // cuBLASLt split-K reduction schemes the heuristic may choose (BLOCKSPEC_LT_REDUCTION).
  uint32_t lt_reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_MASK;
  bool walk_table_ = true;   // candidate_walk: the parallel table of candidate terms first
  void* draw_ws_ = nullptr;  // the draws' per-chunk sums
  Tensor rules_dev_;         // apply_logit_rules' rules and arguments (I32 words)
  size_t draw_ws_bytes_ = 0;
  uint64_t capture_generation_ = 0;
  struct Captured {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;
    std::vector<Tensor> keep;  // temporaries the graph uses
  };
  std::map<std::string, Captured> graphs_;
  static constexpr size_t kMaxGraphs = 256;
  std::vector<Tensor>* capture_keep_ = nullptr;  // set while a graph is being captured
  bool graphs_enabled_ = true;
  // Per-(row, chunk) partial results of the two-pass argmax (fixed size: never reallocated).
  static constexpr int64_t kArgmaxKeys = 1 << 16;
  uint64_t* argmax_keys_ = nullptr;
  // markov_row's per-block keys and its last-block counter (fixed size, zeroed once).
  uint64_t* walk_keys_ = nullptr;
  unsigned* walk_counter_ = nullptr;
  void* topk_ws_ = nullptr;  // the two-stage top-k's per-chunk candidates
  size_t topk_ws_bytes_ = 0;
  void* walk_ws_ = nullptr;  // the candidate walk's table of candidate terms
  size_t walk_ws_bytes_ = 0;
  void* chain_ws_ = nullptr;  // markov_chain's per-block argmax keys of u
  size_t chain_ws_bytes_ = 0;
};

namespace {
CudaBackend& as_cuda(Backend& backend) {
  auto* c = dynamic_cast<CudaBackend*>(&backend);
  BS_CHECK(c != nullptr && "not a CUDA backend");
  return *c;
}
}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error state of a failed runtime init
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

struct EventTimer::Impl {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

EventTimer::EventTimer(Backend& backend) : impl_(std::make_unique<Impl>()) {
  impl_->stream = as_cuda(backend).stream();
  CUDA_CHECK(cudaEventCreate(&impl_->start));
  CUDA_CHECK(cudaEventCreate(&impl_->stop));
}
EventTimer::~EventTimer() {
  cudaEventDestroy(impl_->start);
  cudaEventDestroy(impl_->stop);
}
void EventTimer::start() { CUDA_CHECK(cudaEventRecord(impl_->start, impl_->stream)); }
double EventTimer::stop_ms() {
  CUDA_CHECK(cudaEventRecord(impl_->stop, impl_->stream));
  CUDA_CHECK(cudaEventSynchronize(impl_->stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->start, impl_->stop));
  return ms;
}

double copy_bandwidth_gbs(Backend& backend, size_t bytes, int iters) {
  CudaBackend& be = as_cuda(backend);
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemsetAsync(src, 0x5a, bytes, be.stream()));
  EventTimer timer(backend);
  std::vector<double> ms;
  for (int i = 0; i < iters + 2; ++i) {
    timer.start();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, be.stream()));
    const double t = timer.stop_ms();
    if (i >= 2) ms.push_back(t);
  }
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  return 2.0 * static_cast<double>(bytes) / (med * 1e-3) / 1e9;
}

std::string device_description(Backend& backend) {
  const cudaDeviceProp& p = as_cuda(backend).props();
  return fmt::format("{}, {} SMs, {:.1f} GiB, sm_{}{}, L2 {} MiB", p.name, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / (1 << 30), p.major, p.minor,
                     p.l2CacheSize >> 20);
}

void set_gemv_mode(Backend& backend, GemvMode mode) { as_cuda(backend).set_gemv_mode(mode); }
void set_pinned_rows(Backend& backend, int64_t rows) { as_cuda(backend).set_pinned_rows(rows); }
void set_fp8_kernel(Backend& backend, Fp8Kernel kernel) { as_cuda(backend).set_fp8_kernel(kernel); }
void set_walk_table(Backend& backend, bool on) { as_cuda(backend).set_walk_table(on); }
void set_conv_kernel(Backend& backend, bool fast) { as_cuda(backend).set_conv_kernel(fast); }
static_assert(static_cast<int>(kDefaultAttentionKernel) + 1 == bs::cuda::kDefaultSplitVersion);
void set_attention_kernel(AttentionKernel kernel, AttentionKernelOptions options) {
  set_split_kernel(static_cast<int>(kernel) + 1, options.chunks_per_block);
  set_split_qpt(options.queries_per_thread);
  set_split_mma_tile(options.mma_tile);
}
int stream_variant_count() { return kStreamVariants; }
int stream_split_count(Backend& backend, int64_t m, int64_t k) {
  return as_cuda(backend).stream_split_count(m, k);
}
void set_stream_options(Backend& backend, int variant, int64_t max_mib) {
  as_cuda(backend).set_stream_options(variant, max_mib);
}
void set_stream_fusion(Backend& backend, bool on) { as_cuda(backend).set_stream_fusion(on); }

void set_stream_resident_rows(Backend& backend, int rows) {
  as_cuda(backend);  // a CUDA backend's switch, though process-wide
  set_stream_resident_rows(rows);
}

}  // namespace bs::cuda
