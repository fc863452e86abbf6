#include "backend/backend.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

#ifdef BLOCKSPEC_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bs {

AllocationError::AllocationError(std::string device, int64_t bytes, std::string detail)
    : bytes_(bytes),
      message_(fmt::format("out of {} memory: allocating {:.1f} MiB ({} bytes) failed{}{}", device,
                           static_cast<double>(bytes) / (1 << 20), bytes,
                           detail.empty() ? "" : ": ", detail)) {}

std::string kv_slot_fault_message(const std::string& op, int64_t slot, int64_t capacity) {
  return fmt::format(
      "{}: KV slot {} is outside the KV pool of {} slots (an engine bug: the row's keys and values "
      "were not written)",
      op, slot, capacity);
}

void Backend::norm_matmul(const Tensor& y, const Tensor& xn, const Tensor& x, const Tensor& norm_w,
                          float eps, const Tensor& w, const Tensor* bias, bool accumulate) {
  rms_norm(xn, x, norm_w, eps);
  matmul(y, xn, w, bias, accumulate);
}

void Backend::swiglu_matmul(const Tensor& y, const Tensor& act, const Tensor& gate_up,
                            const Tensor& w, const Tensor* bias, bool accumulate) {
  swiglu(act, gate_up);
  matmul(y, act, w, bias, accumulate);
}

void Backend::norm_matmul_fp8(const Tensor& y, const Tensor& xn, const Tensor& x,
                              const Tensor& norm_w, float eps, const Fp8Weight& w,
                              bool accumulate) {
  rms_norm(xn, x, norm_w, eps);
  matmul_fp8(y, xn, w, accumulate);
}

void Backend::swiglu_matmul_fp8(const Tensor& y, const Tensor& act, const Tensor& gate_up,
                                const Fp8Weight& w, bool accumulate) {
  swiglu(act, gate_up);
  matmul_fp8(y, act, w, accumulate);
}

int64_t Backend::begin_read(const Tensor& src) {
  BS_CHECK(static_cast<int>(pending_reads_.size()) < kMaxPendingReads);
  PendingRead read{.bytes = std::vector<unsigned char>(src.nbytes())};
  try {
    copy_to_host(read.bytes.data(), src);
  } catch (const BackendFault& e) {
    read.fault = e.what();  // thrown by end_read, as an asynchronous backend's read throws it
  }
  pending_reads_.push_back(std::move(read));
  return first_read_ + static_cast<int64_t>(pending_reads_.size()) - 1;
}

void Backend::end_read(int64_t ticket, void* dst) {
  BS_CHECK(!pending_reads_.empty() && ticket == first_read_);
  PendingRead read = std::move(pending_reads_.front());
  pending_reads_.erase(pending_reads_.begin());
  ++first_read_;
  if (!read.fault.empty()) throw BackendFault(read.fault);
  std::memcpy(dst, read.bytes.data(), read.bytes.size());
}

void Backend::markov_chain(const Tensor& drafts, const Tensor& anchor, const Tensor& u,
                           const Tensor& w1, const Tensor& w2, const Tensor& /*norms*/) {
  const int64_t k = u.dim(0);
  BS_CHECK(drafts.dtype() == DType::kI32 && drafts.numel() >= k);
  for (int64_t j = 0; j < k; ++j) {
    markov_row(Tensor(), drafts.rows(j, 1), u.rows(j, 1), j == 0 ? anchor : drafts.rows(j - 1, 1),
               w1, w2);
  }
}

std::vector<float> markov_norm_bounds(std::span<const float> w2, int64_t v, int64_t r) {
  BS_CHECK(static_cast<int64_t>(w2.size()) == v * r);
  std::vector<float> norms(static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) {
    // Squares of floats are exact in double; the sum's relative error (<= r * 2^-53) and the
    // square root's are far below one float ulp (2^-24), which the second step up covers.
    double ss = 0.0;
    for (int64_t c = 0; c < r; ++c) {
      const double x = w2[static_cast<size_t>(i * r + c)];
      ss += x * x;
    }
    const double n = std::sqrt(ss);
    float f = static_cast<float>(n);
    if (static_cast<double>(f) < n) f = std::nextafter(f, INFINITY);
    norms[static_cast<size_t>(i)] = std::nextafter(f, INFINITY);
  }
  return norms;
}

namespace {
// Allocations left until the injected failure (<= 0: none armed).
std::atomic<int64_t> g_alloc_countdown{0};
}  // namespace

void inject_allocation_failure(int64_t nth) { g_alloc_countdown.store(nth > 0 ? nth : 0); }

bool allocation_failure_pending() { return g_alloc_countdown.load() > 0; }

int64_t arm_allocation_failure_from_env() {
  const char* v = std::getenv("BLOCKSPEC_FAIL_ALLOC_AT");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || n <= 0) return 0;
  inject_allocation_failure(n);
  return n;
}

void check_injected_allocation_failure(const std::string& device, int64_t bytes) {
  if (g_alloc_countdown.load(std::memory_order_relaxed) <= 0) return;
  if (g_alloc_countdown.fetch_sub(1) == 1) {
    throw AllocationError(device, bytes, "injected failure (BLOCKSPEC_FAIL_ALLOC_AT)");
  }
}

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  if (device == "cuda" || device == "auto") {
#ifdef BLOCKSPEC_HAS_CUDA
    std::string why;
    if (cuda::device_available(&why)) return cuda::make_cuda_backend(0);
    if (device == "auto") return make_cpu_backend(threads);
    return FailedPrecondition("device 'cuda': {}", why);
#else
    if (device == "auto") return make_cpu_backend(threads);
    return Unimplemented("device 'cuda': this build of blockspec has no CUDA backend");
#endif
  }
  return InvalidArgument("unknown device '{}' (expected cpu, cuda or auto)", device);
}

}  // namespace bs
