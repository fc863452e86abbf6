// CPU reference backend: every activation and weight in fp32, multi-threaded over output
// features / rows where the work is large enough to pay for it.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace bs {
namespace {

// Work (multiply-adds) below which an op stays on the calling thread.
constexpr int64_t kParallelGrain = 1 << 15;

// Hot loops are compiled twice, for AVX2 and for baseline x86-64, and picked when the program
// loads. fp contraction is off (-std=c++20), and every output is summed in the same 8-lane order
// whatever the clone, row count or thread split, so a row's result never depends on how many
// rows share the call: verifying k tokens gives bit-identical logits to decoding them one by one.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BS_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BS_CPU_CLONES
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i, j] (=|+=) x[i] . w[j] + bias[j] for every row i and outputs j in [j0, j1).
BS_CPU_CLONES void matmul_kernel(const float* x, const float* w, const float* bias, float* y,
                                 int64_t n, int64_t m, int64_t k, int64_t j0, int64_t j1,
                                 bool accumulate) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* wr = w + j * k;
    const float b = bias ? bias[j] : 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float v = dot(x + i * k, wr, k) + b;
      float& out = y[i * m + j];
      out = accumulate ? out + v : v;
    }
  }
}

// One query row of one head: o = softmax(q . k_j * scale) v over visible keys j. keys[j] and
// values[j] point at position j's row for this head's kv head. scores has kv_len entries.
BS_CPU_CLONES void attend_row(const float* q, const float* const* keys, const float* const* values,
                              int64_t kv_len, int64_t hd, int64_t qpos, bool causal, int64_t window,
                              float scale, float* scores, float* o) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float max_score = kNegInf;
  for (int64_t j = 0; j < kv_len; ++j) {
    bool vis = !(causal && j > qpos);
    if (window > 0) vis = vis && qpos - j < window && (causal || j - qpos < window);
    if (!vis) {
      scores[j] = kNegInf;
      continue;
    }
    scores[j] = dot(q, keys[j], hd) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  for (int64_t c = 0; c < hd; ++c) o[c] = 0.0f;
  if (max_score == kNegInf) return;
  float denom = 0;
  for (int64_t j = 0; j < kv_len; ++j) {
    if (scores[j] == kNegInf) continue;
    const float p = std::exp(scores[j] - max_score);
    denom += p;
    const float* vv = values[j];
    for (int64_t c = 0; c < hd; ++c) o[c] += p * vv[c];
  }
  const float inv = 1.0f / denom;
  for (int64_t c = 0; c < hd; ++c) o[c] *= inv;
}

// y[d] = x[d] / sqrt(mean(x²) + eps) * w[d] (y may alias x).
void rms_norm_row(float* y, const float* x, const float* w, int64_t d, float eps) {
  const float inv = 1.0f / std::sqrt(dot(x, x, d) / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * w[i];
}

// cos/sin of position `pos` for every frequency, scaled by attention_scaling.
void rope_angles(float pos, const float* inv_freq, int64_t half, float attention_scaling,
                 float* cos_t, float* sin_t) {
  for (int64_t i = 0; i < half; ++i) {
    const float angle = pos * inv_freq[i];  // fp32 product, as the reference computes it
    cos_t[i] = std::cos(angle) * attention_scaling;
    sin_t[i] = std::sin(angle) * attention_scaling;
  }
}

// In-place neox rotation of `heads` vectors of hd at v.
void rope_heads(float* v, int64_t heads, int64_t hd, const float* cos_t, const float* sin_t) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h, v += hd) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_t[i] - b * sin_t[i];
      v[i + half] = b * cos_t[i] + a * sin_t[i];
    }
  }
}

void check_f32(const Tensor& t) {
  BS_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu);
}

// The host's RAM from /proc/meminfo (MemAvailable counts reclaimable caches as free), or from
// sysconf where that file is missing.
MemoryInfo host_memory_info() {
  MemoryInfo info;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long kib = 0;
    while (std::fscanf(f, "%63s %lld kB", key, &kib) == 2) {
      if (std::strcmp(key, "MemTotal:") == 0) info.total = kib * 1024;
      if (std::strcmp(key, "MemAvailable:") == 0) info.free = kib * 1024;
    }
    std::fclose(f);
  }
  if (info.total <= 0 || info.free <= 0) {
    const int64_t page = sysconf(_SC_PAGESIZE);
    info.total = page * static_cast<int64_t>(sysconf(_SC_PHYS_PAGES));
    info.free = page * static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES));
  }
  return info;
}

// Bytes held by a backend's live allocations and their peak; shared with the tensors' deleters,
// which may outlive the backend.
struct ByteCounter {
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> peak{0};
  void add(int64_t bytes) {
    const int64_t now = held.fetch_add(bytes) + bytes;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::kF32; }

  MemoryInfo memory_info() const override { return host_memory_info(); }

  Tensor empty(std::initializer_list<int64_t> shape, DType dtype) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = std::max<size_t>(64, static_cast<size_t>(n) * dtype_size(dtype));
    const size_t rounded = (bytes + 63) / 64 * 64;
    check_injected_allocation_failure("host", static_cast<int64_t>(rounded));
    // 64-byte aligned, zero-initialised.
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      throw AllocationError("host", static_cast<int64_t>(rounded), "aligned_alloc returned null");
    }
    std::memset(p, 0, bytes);
    counter_->add(static_cast<int64_t>(rounded));
    std::shared_ptr<void> storage(p, [counter = counter_, rounded](void* q) {
      std::free(q);
      counter->add(-static_cast<int64_t>(rounded));
    });
    return Tensor(std::move(storage), p, dtype, Device::kCpu, shape);
  }
  AllocationStats allocation_stats() const override {
    return {.held = counter_->held.load(), .peak = counter_->peak.load()};
  }
  void reset_peak_allocated() override { counter_->peak.store(counter_->held.load()); }

  Tensor upload_weight(DType src_dtype, const void* src,
                       std::initializer_list<int64_t> shape) override {
    Tensor t = empty(shape, DType::kF32);
    convert_to_f32(src_dtype, src, t.as<float>(), static_cast<size_t>(t.numel()));
    return t;
  }

  void copy_from_host(const Tensor& dst, const void* src) override {
    std::memcpy(dst.data(), src, dst.nbytes());
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    std::memcpy(dst, src.data(), src.nbytes());
    throw_fault();
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    BS_CHECK(dst.nbytes() == src.nbytes());
    std::memmove(dst.data(), src.data(), src.nbytes());
  }
  void fill_zero(const Tensor& t) override { std::memset(t.data(), 0, t.nbytes()); }
  void copy_columns(const Tensor& dst, int64_t col_offset, const Tensor& src) override {
    const int64_t n = src.dim(0), d = src.row_numel(), big = dst.row_numel();
    BS_CHECK(dst.dim(0) == n && col_offset + d <= big);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dst.as<float>() + i * big + col_offset, src.as<float>() + i * d,
                  d * sizeof(float));
    }
  }
  std::vector<float> to_host_f32(const Tensor& t) override {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    convert_to_f32(t.dtype(), t.data(), out.data(), out.size());
    throw_fault();
    return out;
  }

  void matmul(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
              bool accumulate) override {
    check_f32(y), check_f32(x), check_f32(w);
    const int64_t m = w.dim(0), k = w.dim(-1);
    const int64_t n = x.numel() / k;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && w.numel() == m * k);
    const float* xp = x.as<float>();
    const float* wp = w.as<float>();
    float* yp = y.as<float>();
    const float* bp = bias ? bias->as<float>() : nullptr;
    // Split over output features: each weight row is read once and reused for all n rows.
    pool_.parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, n * k)),
                       [&](int64_t j0, int64_t j1) {
                         matmul_kernel(xp, wp, bp, yp, n, m, k, j0, j1, accumulate);
                       });
  }

  Fp8Weight quantize_fp8_rows(const Tensor& w) override {
    check_f32(w);
    const int64_t m = w.dim(0), k = w.dim(-1);
    BS_CHECK(w.numel() == m * k);
    Fp8Weight out{empty({m, k}, DType::kF8E4M3), empty({m}, DType::kF32)};
    const float* wp = w.as<float>();
    auto* qp = static_cast<uint8_t*>(out.q.data());
    float* sp = out.scale.as<float>();
    pool_.parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, k)),
                       [&](int64_t j0, int64_t j1) {
                         for (int64_t j = j0; j < j1; ++j) {
                           const float* row = wp + j * k;
                           float amax = 0.0f;
                           for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
                           const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
                           sp[j] = scale;
                           for (int64_t c = 0; c < k; ++c)
                             qp[j * k + c] = f32_to_f8e4m3(row[c] / scale);
                         }
                       });
    return out;
  }

  void matmul_fp8(const Tensor& y, const Tensor& x, const Fp8Weight& w, bool accumulate) override {
    check_f32(y), check_f32(x);
    BS_CHECK(w.q.dtype() == DType::kF8E4M3 && w.scale.dtype() == DType::kF32);
    const int64_t m = w.q.dim(0), k = w.q.dim(-1);
    const int64_t n = k ? x.numel() / k : 0;
    BS_CHECK(x.numel() == n * k && y.numel() == n * m && w.scale.numel() == m);
    std::array<float, 256> lut;
    for (int v = 0; v < 256; ++v) lut[v] = f8e4m3_to_f32(static_cast<uint8_t>(v));
    const float* xp = x.as<float>();
    const auto* qp = static_cast<const uint8_t*>(w.q.data());
    const float* sp = w.scale.as<float>();
    float* yp = y.as<float>();
    pool_.parallel_for(
        m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, n * k)),
        [&](int64_t j0, int64_t j1) {
          std::vector<float> row(static_cast<size_t>(k));  // dequantized q[j, :], unscaled
          for (int64_t j = j0; j < j1; ++j) {
            for (int64_t c = 0; c < k; ++c) row[c] = lut[qp[j * k + c]];
            for (int64_t i = 0; i < n; ++i) {
              const float v = sp[j] * dot(xp + i * k, row.data(), k);
              float& o = yp[i * m + j];
              o = accumulate ? o + v : v;
            }
          }
        });
  }

  void add(const Tensor& y, const Tensor& a, const Tensor& b) override {
    BS_CHECK(a.numel() == b.numel() && y.numel() == a.numel());
    const float *ap = a.as<float>(), *bp = b.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = ap[i] + bp[i];
  }
  void mul(const Tensor& y, const Tensor& a, const Tensor& b) override {
    BS_CHECK(a.numel() == b.numel() && y.numel() == a.numel());
    const float *ap = a.as<float>(), *bp = b.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = ap[i] * bp[i];
  }

  void rms_norm(const Tensor& y, const Tensor& x, const Tensor& w, float eps) override {
    const int64_t d = w.numel(), rows = x.numel() / d;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    const float *xp = x.as<float>(), *wp = w.as<float>();
    float* yp = y.as<float>();
    for (int64_t r = 0; r < rows; ++r) rms_norm_row(yp + r * d, xp + r * d, wp, d, eps);
  }

  void layer_norm(const Tensor& y, const Tensor& x, int64_t d, const Tensor& w, const Tensor& b,
                  float eps) override {
    const int64_t rows = x.numel() / d;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    const float* xp = x.as<float>();
    const float* wp = w.defined() ? w.as<float>() : nullptr;
    const float* bp = b.defined() ? b.as<float>() : nullptr;
    float* yp = y.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < d; ++i) mean += xr[i];
      mean /= static_cast<double>(d);
      for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      var /= static_cast<double>(d);
      const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float mu = static_cast<float>(mean);
      for (int64_t i = 0; i < d; ++i) {
        float v = (xr[i] - mu) * inv;
        if (wp) v *= wp[i];
        if (bp) v += bp[i];
        yr[i] = v;
      }
    }
  }

  void modulate(const Tensor& y, const Tensor& x, const Tensor& shift,
                const Tensor& scale) override {
    const int64_t d = x.dim(-1), rows = x.numel() / d;
    const bool per_row = shift.numel() == x.numel();
    BS_CHECK((per_row || shift.numel() == d) && scale.numel() == shift.numel());
    const float *xp = x.as<float>(), *sh = shift.as<float>(), *sc = scale.as<float>();
    float* yp = y.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = per_row ? r * d : 0;
      for (int64_t i = 0; i < d; ++i) {
        yp[r * d + i] = xp[r * d + i] * (1.0f + sc[o + i]) + sh[o + i];
      }
    }
  }

  void silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) override {
    BS_CHECK(gate.numel() == up.numel() && y.numel() == up.numel());
    const float *g = gate.as<float>(), *u = up.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  void swiglu(const Tensor& y, const Tensor& gate_up) override {
    const int64_t i_dim = y.dim(-1), n = y.numel() / i_dim;
    BS_CHECK(gate_up.numel() == 2 * y.numel());
    for (int64_t r = 0; r < n; ++r) {
      const float* g = gate_up.as<float>() + r * 2 * i_dim;
      const float* u = g + i_dim;
      float* yr = y.as<float>() + r * i_dim;
      for (int64_t c = 0; c < i_dim; ++c) yr[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
    }
  }
  void silu(const Tensor& y, const Tensor& x) override {
    const float* xp = x.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = xp[i] / (1.0f + std::exp(-xp[i]));
  }
  void gelu(const Tensor& y, const Tensor& x, bool tanh_approx) override {
    const float* xp = x.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) {
      const float v = xp[i];
      if (tanh_approx) {
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        yp[i] = 0.5f * v * (1.0f + std::tanh(c * (v + 0.044715f * v * v * v)));
      } else {
        yp[i] = 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
      }
    }
  }

  void embedding(const Tensor& y, const Tensor& ids, const Tensor& table) override {
    const int64_t n = ids.numel(), d = table.dim(-1), vocab = table.dim(0);
    BS_CHECK(y.numel() == n * d);
    const int32_t* idp = ids.as<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      BS_CHECK(idp[i] >= 0 && idp[i] < vocab);
      std::memcpy(y.as<float>() + i * d, table.as<float>() + idp[i] * d, d * sizeof(float));
    }
  }

  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
            float attention_scaling) override {
    const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = hd / 2;
    BS_CHECK(inv_freq.numel() == half && positions.numel() == n);
    const float* freq = inv_freq.as<float>();
    std::vector<float> cos_t(half), sin_t(half);
    for (int64_t t = 0; t < n; ++t) {
      rope_angles(static_cast<float>(positions.as<int32_t>()[t]), freq, half, attention_scaling,
                  cos_t.data(), sin_t.data());
      rope_heads(x.as<float>() + t * heads * hd, heads, hd, cos_t.data(), sin_t.data());
    }
  }

  void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions,
                          const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& slots) override {
    const int64_t n = q_out.dim(0), heads = q_out.dim(1), hd = q_out.dim(2), half = hd / 2;
    const int64_t kv_heads = k_pool.dim(2), q_dim = heads * hd, kv_dim = kv_heads * hd;
    const int64_t width = q_dim + 2 * kv_dim, capacity = k_pool.dim(0) * k_pool.dim(1);
    BS_CHECK(k_pool.dim(3) == hd && qkv.numel() == n * width && positions.numel() == n &&
             slots.numel() == n && inv_freq.numel() == half);
    std::vector<float> cos_t(half), sin_t(half), k_dropped;
    for (int64_t t = 0; t < n; ++t) {
      const float* src = qkv.as<float>() + t * width;
      float* q = q_out.as<float>() + t * q_dim;
      const int64_t slot = slots.as<int32_t>()[t];
      float* k = nullptr;
      if (slot >= 0 && slot < capacity) {
        k = k_pool.as<float>() + slot * kv_dim;
        std::memcpy(v_pool.as<float>() + slot * kv_dim, src + q_dim + kv_dim,
                    kv_dim * sizeof(float));
      } else {  // the query row still gets computed; its key goes nowhere
        record_slot_fault("attention_prologue", slot, capacity);
        k_dropped.resize(static_cast<size_t>(kv_dim));
        k = k_dropped.data();
      }
      std::memcpy(q, src, q_dim * sizeof(float));
      std::memcpy(k, src + q_dim, kv_dim * sizeof(float));
      if (q_norm.defined()) {
        for (int64_t h = 0; h < heads; ++h)
          rms_norm_row(q + h * hd, q + h * hd, q_norm.as<float>(), hd, eps);
      }
      if (k_norm.defined()) {
        for (int64_t h = 0; h < kv_heads; ++h)
          rms_norm_row(k + h * hd, k + h * hd, k_norm.as<float>(), hd, eps);
      }
      rope_angles(static_cast<float>(positions.as<int32_t>()[t]), inv_freq.as<float>(), half,
                  attention_scaling, cos_t.data(), sin_t.data());
      rope_heads(q, heads, hd, cos_t.data(), sin_t.data());
      rope_heads(k, kv_heads, hd, cos_t.data(), sin_t.data());
    }
  }

  void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    const int64_t n = slots.numel(), row = k.row_numel();
    BS_CHECK(k_pool.numel() / (k_pool.dim(0) * k_pool.dim(1)) == row);
    const int64_t capacity = k_pool.dim(0) * k_pool.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = slots.as<int32_t>()[i];
      if (s < 0 || s >= capacity) {
        record_slot_fault("kv_write", s, capacity);
        continue;
      }
      std::memcpy(k_pool.as<float>() + s * row, k.as<float>() + i * row, row * sizeof(float));
      std::memcpy(v_pool.as<float>() + s * row, v.as<float>() + i * row, row * sizeof(float));
    }
  }

  void paged_attention(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                       const Tensor& v_pool, const Tensor& block_table, KvLength length,
                       AttentionMask mask, float scale) override {
    const int64_t kv_len = length.device ? length.device->as<int32_t>()[0] : length.max;
    BS_CHECK(kv_len <= length.max);
    const int64_t block_size = k_pool.dim(1), row = k_pool.dim(2) * k_pool.dim(3);
    const int32_t* table = block_table.as<int32_t>();
    BS_CHECK(block_table.numel() * block_size >= kv_len);
    key_rows_.resize(kv_len);
    value_rows_.resize(kv_len);
    for (int64_t pos = 0; pos < kv_len; ++pos) {
      const int64_t slot = table[pos / block_size] * block_size + pos % block_size;
      key_rows_[pos] = k_pool.as<float>() + slot * row;
      value_rows_[pos] = v_pool.as<float>() + slot * row;
    }
    attend(out, q, kv_len, k_pool.dim(2), k_pool.dim(3), mask, scale);
  }

  // One single-sequence call per sequence: the same code path, so rows match bit for bit.
  void paged_attention_batch(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                             const Tensor& v_pool, const Tensor& block_tables,
                             const Tensor& kv_lens, int64_t max_kv_len, AttentionMask mask,
                             float scale) override {
    const int64_t num_seqs = block_tables.dim(0), capacity = block_tables.dim(1);
    BS_CHECK(block_tables.ndim() == 2 && block_tables.dtype() == DType::kI32);
    BS_CHECK(kv_lens.dtype() == DType::kI32 && kv_lens.numel() == num_seqs);
    BS_CHECK(num_seqs > 0 && q.dim(0) % num_seqs == 0 && out.dim(0) == q.dim(0));
    const int64_t n = q.dim(0) / num_seqs;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const Tensor kv_len = kv_lens.rows(s, 1);  // [1]
      paged_attention(out.rows(s * n, n), q.rows(s * n, n), k_pool, v_pool,
                      block_tables.rows(s, 1).view({capacity}), KvLength(max_kv_len, &kv_len), mask,
                      scale);
    }
  }

  void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                 AttentionMask mask, float scale) override {
    const int64_t m = k.dim(0), row = k.dim(1) * k.dim(2);
    key_rows_.resize(m);
    value_rows_.resize(m);
    for (int64_t pos = 0; pos < m; ++pos) {
      key_rows_[pos] = k.as<float>() + pos * row;
      value_rows_[pos] = v.as<float>() + pos * row;
    }
    attend(out, q, m, k.dim(1), k.dim(2), mask, scale);
  }

  void argmax(const Tensor& out, const Tensor& x) override {
    const int64_t v = x.dim(-1), n = x.numel() / v;
    for (int64_t r = 0; r < n; ++r) {
      const float* row = x.as<float>() + r * v;
      out.as<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + v) - row);
    }
  }

  // ---- Ops added for the FlashMap drafter ----
  void gemm(const Tensor& y, const Tensor& a, const Tensor& b, bool trans_a,
            bool trans_b) override {
    check_f32(y), check_f32(a), check_f32(b);
    BS_CHECK(a.ndim() == 2 && b.ndim() == 2);
    const int64_t n = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
    const int64_t m = trans_b ? b.dim(0) : b.dim(1);
    BS_CHECK((trans_b ? b.dim(1) : b.dim(0)) == k && y.numel() == n * m);
    const float *ap = a.as<float>(), *bp = b.as<float>();
    float* yp = y.as<float>();
    // Element (i, l) of op(a) and (l, j) of op(b).
    const int64_t a_row = trans_a ? 1 : k, a_col = trans_a ? n : 1;
    const int64_t b_row = trans_b ? 1 : m, b_col = trans_b ? k : 1;
    pool_.parallel_for(n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, m * k)),
                       [&](int64_t i0, int64_t i1) {
                         std::vector<double> acc(static_cast<size_t>(m));
                         for (int64_t i = i0; i < i1; ++i) {
                           std::fill(acc.begin(), acc.end(), 0.0);
                           for (int64_t l = 0; l < k; ++l) {
                             const double av = ap[i * a_row + l * a_col];
                             if (av == 0.0) continue;
                             const float* br = bp + l * b_row;
                             for (int64_t j = 0; j < m; ++j) acc[j] += av * br[j * b_col];
                           }
                           for (int64_t j = 0; j < m; ++j) {
                             yp[i * m + j] = static_cast<float>(acc[j]);
                           }
                         }
                       });
  }

  void slice_columns(const Tensor& dst, const Tensor& src, int64_t col_offset) override {
    const int64_t n = dst.dim(0), d = dst.row_numel(), big = src.row_numel();
    BS_CHECK(src.dim(0) == n && col_offset >= 0 && col_offset + d <= big);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dst.as<float>() + i * d, src.as<float>() + i * big + col_offset,
                  d * sizeof(float));
    }
  }

  void scatter_columns(const Tensor& dst, const Tensor& src, const Tensor& ids,
                       float fill) override {
    const int64_t n = dst.dim(0), v = dst.row_numel(), vs = src.row_numel();
    BS_CHECK(src.dim(0) == n && ids.numel() == vs && ids.dtype() == DType::kI32);
    const int32_t* idp = ids.as<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      float* row = dst.as<float>() + i * v;
      std::fill(row, row + v, fill);
      const float* sr = src.as<float>() + i * vs;
      for (int64_t j = 0; j < vs; ++j) {
        BS_CHECK(idp[j] >= 0 && idp[j] < v);
        row[idp[j]] = sr[j];
      }
    }
  }

  void gated_add(const Tensor& y, const Tensor& x, const Tensor& gate) override {
    const int64_t d = gate.numel(), rows = x.numel() / d;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel());
    const float *xp = x.as<float>(), *gp = gate.as<float>();
    float* yp = y.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < d; ++i) yp[r * d + i] += gp[i] * xp[r * d + i];
    }
  }

  void axpby(const Tensor& y, float a, const Tensor& x, float b, const Tensor& z) override {
    BS_CHECK(x.numel() == z.numel() && y.numel() == x.numel());
    const float *xp = x.as<float>(), *zp = z.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = a * xp[i] + b * zp[i];
  }

  void softmax(const Tensor& y, const Tensor& x, float scale) override {
    const int64_t v = x.dim(-1), rows = x.numel() / v;
    BS_CHECK(y.numel() == x.numel());
    pool_.parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, v)),
                       [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) {
                           const float* xr = x.as<float>() + r * v;
                           float* yr = y.as<float>() + r * v;
                           float mx = -std::numeric_limits<float>::infinity();
                           for (int64_t i = 0; i < v; ++i) mx = std::max(mx, xr[i] * scale);
                           double sum = 0;
                           for (int64_t i = 0; i < v; ++i) {
                             yr[i] = std::exp(xr[i] * scale - mx);
                             sum += yr[i];
                           }
                           const float inv = static_cast<float>(1.0 / sum);
                           for (int64_t i = 0; i < v; ++i) yr[i] *= inv;
                         }
                       });
  }

  void noise_combine(const Tensor& y, const Tensor& base, const Tensor& x, const Tensor& z,
                     const Tensor& w, float gate, float eps) override {
    const int64_t d = base.numel(), e = w.numel(), rows = x.numel() / d;
    BS_CHECK(rows * d == x.numel() && y.numel() == x.numel() && z.numel() == rows * e);
    const float *bp = base.as<float>(), *xp = x.as<float>(), *zp = z.as<float>(),
                *wp = w.as<float>();
    float* yp = y.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < e; ++i)
        ss += static_cast<double>(wp[i]) * zp[r * e + i] * zp[r * e + i];
      const float s = gate / std::sqrt(static_cast<float>(ss) + eps);
      for (int64_t i = 0; i < d; ++i) yp[r * d + i] = bp[i] + s * xp[r * d + i];
    }
  }

  void seeded_normal(const Tensor& out, const Tensor& positions, uint64_t seed, uint32_t stream,
                     float scale) override {
    const int64_t n = positions.numel(), d = out.numel() / std::max<int64_t>(1, n);
    BS_CHECK(out.numel() == n * d && positions.dtype() == DType::kI32);
    const auto mix = [](uint64_t x) {
      x += 0x9E3779B97F4A7C15ull;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      return x ^ (x >> 31);
    };
    const uint64_t h_seed = mix(mix(seed) ^ stream);
    for (int64_t r = 0; r < n; ++r) {
      const uint64_t pos = static_cast<uint64_t>(static_cast<int64_t>(positions.as<int32_t>()[r]));
      const uint64_t h_pos = mix(h_seed ^ pos);
      float* row = out.as<float>() + r * d;
      for (int64_t c = 0; c < d; c += 2) {
        const uint64_t h = mix(h_pos ^ static_cast<uint64_t>(c / 2));
        const double u1 = static_cast<double>((h >> 40) + 1) * 0x1p-24;
        const double u2 = static_cast<double>((h >> 16) & 0xFFFFFFull) * 0x1p-24;
        const double radius = std::sqrt(-2.0 * std::log(u1));
        const double angle = 6.283185307179586 * u2;
        row[c] = scale * static_cast<float>(radius * std::cos(angle));
        if (c + 1 < d) row[c + 1] = scale * static_cast<float>(radius * std::sin(angle));
      }
    }
  }

  // ---- Speculative decoding on the device ----
  void greedy_accept(const Tensor& out, const Tensor& tokens, const Tensor& target_ids,
                     const Tensor& offsets) override {
    BS_CHECK(out.dtype() == DType::kI32 && tokens.dtype() == DType::kI32 &&
             target_ids.dtype() == DType::kI32 && offsets.dtype() == DType::kI32);
    const int64_t seqs = offsets.numel() - 1, width = out.dim(-1);
    BS_CHECK(out.ndim() == 2 && seqs >= 0 && out.dim(0) == seqs);
    const int32_t* off = offsets.as<int32_t>();
    const int32_t *tok = tokens.as<int32_t>(), *tgt = target_ids.as<int32_t>();
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t first = off[s], k = off[s + 1] - first - 1;
      BS_CHECK(k >= 0 && k + 2 <= width && off[s + 1] <= tokens.numel() &&
               off[s + 1] <= target_ids.numel());
      const int32_t* drafts = tok + first + 1;
      const int32_t* target = tgt + first;
      int64_t a = 0;
      while (a < k && drafts[a] == target[a]) ++a;
      int32_t* row = out.as<int32_t>() + s * width;
      std::fill(row, row + width, 0);
      row[0] = static_cast<int32_t>(a);
      row[1] = target[a];
      std::copy(drafts, drafts + k, row + 2);
    }
  }

  // ---- Sampling: the host definitions of backend/sampling.h, row by row ----
  void filtered_probs(const Tensor& probs, const Tensor& logits,
                      std::span<const sampling::FilterParams> params) override {
    check_f32(probs), check_f32(logits);
    const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
    BS_CHECK(probs.numel() == n * v && (params.size() == 1 || std::ssize(params) == n));
    pool_.parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        sampling::filtered_probs({logits.as<float>() + r * v, static_cast<size_t>(v)},
                                 params[params.size() == 1 ? 0 : r],
                                 {probs.as<float>() + r * v, static_cast<size_t>(v)});
      }
    });
  }
  void apply_logit_rules(const Tensor& logits, const Tensor& row_tokens,
                         std::span<const sampling::LogitRules> requests) override {
    check_f32(logits);
    const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
    BS_CHECK(!row_tokens.defined() ||
             (row_tokens.dtype() == DType::kI32 && row_tokens.numel() >= n));
    for (const sampling::LogitRules& req : requests) {
      BS_CHECK(req.first_row >= 0 && req.rows >= 0 && req.first_row + req.rows <= n);
      BS_CHECK(req.rows <= 1 || row_tokens.defined());
      for (int64_t r = 0; r < req.rows; ++r) {
        const int64_t row = req.first_row + r;
        const int32_t* extra = r > 0 ? row_tokens.as<int32_t>() + req.first_row + 1 : nullptr;
        sampling::apply_logit_rules({logits.as<float>() + row * v, static_cast<size_t>(v)}, r, req,
                                    {extra, static_cast<size_t>(r)});
      }
    }
  }
  void sample_from_probs(const Tensor& out, const Tensor& weights,
                         const Tensor& uniforms) override {
    check_f32(weights), check_f32(uniforms);
    const int64_t v = weights.dim(-1), n = v ? weights.numel() / v : 0;
    BS_CHECK(out.dtype() == DType::kI32 && out.numel() >= n && uniforms.numel() >= n);
    for (int64_t r = 0; r < n; ++r) {
      out.as<int32_t>()[r] = sampling::draw_index(
          {weights.as<float>() + r * v, static_cast<size_t>(v)}, uniforms.as<float>()[r]);
    }
  }
  void rejection_sample(const Tensor& out, const Tensor& drafts, const Tensor& q, const Tensor& p,
                        const Tensor& uniforms) override {
    const int64_t k = drafts.defined() ? drafts.numel() : 0, v = p.dim(-1);
    if (k > 0) {
      check_f32(q);
      BS_CHECK(drafts.dtype() == DType::kI32 && q.numel() == k * v);
    }
    check_f32(p), check_f32(uniforms);
    BS_CHECK(out.dtype() == DType::kI32 && out.numel() >= k + 2 && p.numel() == (k + 1) * v &&
             uniforms.numel() == k + 1);
    const std::span<const int32_t> d(drafts.as<int32_t>(), static_cast<size_t>(k));
    int32_t* o = out.as<int32_t>();
    int32_t next = 0;
    const int64_t a =
        sampling::rejection_sample(d, {q.as<float>(), static_cast<size_t>(k * v)},
                                   {p.as<float>(), static_cast<size_t>(p.numel())}, v,
                                   {uniforms.as<float>(), static_cast<size_t>(k + 1)}, &next);
    o[0] = static_cast<int32_t>(a);
    o[1] = next;
    std::copy(d.begin(), d.end(), o + 2);
  }

  // ---- DSpark / DFlash2 ops ----
  void topk(const Tensor& values, const Tensor& ids, const Tensor& x) override {
    check_f32(values), check_f32(x);
    const int64_t v = x.dim(-1), n = v ? x.numel() / v : 0, k = values.dim(-1);
    BS_CHECK(ids.dtype() == DType::kI32 && k >= 1 && k <= v && values.numel() == n * k &&
             ids.numel() == n * k);
    std::vector<int32_t> order(static_cast<size_t>(v));
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.as<float>() + r * v;
      for (int64_t i = 0; i < v; ++i) order[i] = static_cast<int32_t>(i);
      // Larger value first; on equal values the lower index (NaN sorts last).
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const float fa = xr[a], fb = xr[b];
        if (std::isnan(fa) || std::isnan(fb)) return !std::isnan(fa) && std::isnan(fb);
        return fa > fb || (fa == fb && a < b);
      });
      for (int64_t j = 0; j < k; ++j) {
        ids.as<int32_t>()[r * k + j] = order[j];
        values.as<float>()[r * k + j] = xr[order[j]];
      }
    }
  }
  void scale_softcap(const Tensor& y, const Tensor& x, float multiplier, float cap) override {
    check_f32(y), check_f32(x);
    BS_CHECK(y.numel() == x.numel());
    const float* xp = x.as<float>();
    float* yp = y.as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = multiplier * xp[i];
      yp[i] = cap > 0.0f ? cap * std::tanh(v / cap) : v;
    }
  }
  void dynamic_conv(const Tensor& y, const Tensor& x, const Tensor& dyn, int64_t which,
                    const Tensor& base, int64_t group, int64_t block_rows,
                    bool accumulate) override {
    check_f32(y), check_f32(x), check_f32(dyn), check_f32(base);
    const int64_t h = x.dim(-1), n = h ? x.numel() / h : 0, taps = base.numel() / h;
    BS_CHECK(group >= 1 && h % group == 0 && block_rows >= 1 && n % block_rows == 0);
    const int64_t groups = h / group;
    BS_CHECK(y.numel() == x.numel() && base.numel() == taps * h &&
             dyn.numel() == n * 2 * taps * groups && (which == 0 || which == 1));
    BS_CHECK(y.data() != x.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* d = dyn.as<float>() + (i * 2 + which) * taps * groups;
      float* yr = y.as<float>() + i * h;
      for (int64_t c = 0; c < h; ++c) {
        float acc = 0.0f;
        for (int64_t t = 0; t < taps && t <= i % block_rows; ++t) {
          acc += (base.as<float>()[t * h + c] + d[t * groups + c / group]) *
                 x.as<float>()[(i - t) * h + c];
        }
        yr[c] = accumulate ? yr[c] + acc : acc;
      }
    }
  }

  // ---- Fused drafter walks: the reference (plain loops, fp32 sums in index order) ----
  void markov_row(const Tensor& z, const Tensor& argmax, const Tensor& u, const Tensor& prev,
                  const Tensor& w1, const Tensor& w2) override {
    check_f32(u), check_f32(w1), check_f32(w2);
    const int64_t v = w2.dim(0), r = w2.dim(-1);
    BS_CHECK(w1.dim(0) == v && w1.dim(-1) == r && u.numel() == v && prev.dtype() == DType::kI32);
    BS_CHECK(!z.defined() || (z.dtype() == DType::kF32 && z.numel() == v));
    BS_CHECK(!argmax.defined() || argmax.dtype() == DType::kI32);
    const int64_t p = prev.as<int32_t>()[0];
    BS_CHECK(p >= 0 && p < v);
    const float* e = w1.as<float>() + p * r;
    std::vector<float> tmp;
    float* zp = z.defined() ? z.as<float>() : (tmp.resize(static_cast<size_t>(v)), tmp.data());
    pool_.parallel_for(v, std::max<int64_t>(1, kParallelGrain / (r + 1)),
                       [&](int64_t b, int64_t end) {
                         for (int64_t i = b; i < end; ++i) {
                           const float* w = w2.as<float>() + i * r;
                           float acc = 0.0f;
                           for (int64_t c = 0; c < r; ++c) acc += w[c] * e[c];
                           zp[i] = u.as<float>()[i] + acc;
                         }
                       });
    if (argmax.defined())
      argmax.as<int32_t>()[0] = static_cast<int32_t>(std::max_element(zp, zp + v) - zp);
  }
  void candidate_walk(const Tensor& drafts, const Tensor& rows, const Tensor& probs,
                      const Tensor& anchor, const Tensor& vals, const Tensor& ids,
                      const Tensor& pred, const Tensor& succ, const Tensor& scale,
                      const sampling::FilterParams& filter, const Tensor& uniforms) override {
    check_f32(vals);
    const int64_t k = vals.dim(0), t = vals.dim(-1);
    BS_CHECK(ids.dtype() == DType::kI32 && ids.numel() == k * t && vals.numel() == k * t);
    BS_CHECK(drafts.dtype() == DType::kI32 && drafts.numel() >= k && anchor.dtype() == DType::kI32);
    const int64_t r = pred.defined() ? pred.dim(-1) : 0;
    if (pred.defined()) {
      check_f32(pred), check_f32(succ);
      BS_CHECK(succ.dim(-1) == r && succ.dim(0) == pred.dim(0));
    }
    if (scale.defined()) {
      check_f32(scale);
      BS_CHECK(pred.defined() && scale.numel() == k * r);
    }
    const bool sampled = filter.temperature > 0.0f;
    const int64_t v = rows.defined()    ? rows.dim(-1)
                      : probs.defined() ? probs.dim(-1)
                      : pred.defined()  ? pred.dim(0)
                                        : 0;
    if (rows.defined()) {
      check_f32(rows);
      BS_CHECK(rows.numel() == k * v);
    }
    if (sampled) {
      check_f32(probs), check_f32(uniforms);
      BS_CHECK(probs.numel() == k * v && uniforms.numel() >= k && v > 0);
    }
    const float kNegInf = -std::numeric_limits<float>::infinity();
    std::vector<float> s(static_cast<size_t>(t)), row, q;
    int64_t prev = anchor.as<int32_t>()[0];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t* id = ids.as<int32_t>() + j * t;
      for (int64_t c = 0; c < t; ++c) {
        float dot = 0.0f;
        if (r > 0) {
          BS_CHECK(prev >= 0 && prev < pred.dim(0) && id[c] >= 0 && id[c] < pred.dim(0));
          const float* a = pred.as<float>() + prev * r;
          const float* b = succ.as<float>() + static_cast<int64_t>(id[c]) * r;
          const float* sc = scale.defined() ? scale.as<float>() + j * r : nullptr;
          for (int64_t i = 0; i < r; ++i) dot += a[i] * b[i] * (sc ? sc[i] : 1.0f);
        }
        s[c] = vals.as<float>()[j * t + c] + dot;
      }
      if (rows.defined() || sampled) {
        row.assign(static_cast<size_t>(v), kNegInf);
        for (int64_t c = 0; c < t; ++c) row[id[c]] = s[c];
      }
      int32_t d = 0;
      if (!sampled) {
        int64_t best = 0;
        for (int64_t c = 1; c < t; ++c) {
          if (s[c] > s[best] || (s[c] == s[best] && id[c] < id[best])) best = c;
        }
        d = id[best];
      } else {
        q.resize(static_cast<size_t>(v));
        sampling::filtered_probs(row, filter, q);
        d = sampling::draw_index(q, uniforms.as<float>()[j]);
        std::copy(q.begin(), q.end(), probs.as<float>() + j * v);
      }
      if (rows.defined()) std::copy(row.begin(), row.end(), rows.as<float>() + j * v);
      drafts.as<int32_t>()[j] = d;
      prev = d;
    }
  }

 private:
  // A KV slot outside the pool (Backend::kv_write): the first one is kept for the next read-back.
  void record_slot_fault(const char* op, int64_t slot, int64_t capacity) {
    if (fault_.empty()) fault_ = kv_slot_fault_message(op, slot, capacity);
  }
  // Throws the recorded fault, if any, and clears it.
  void throw_fault() {
    if (fault_.empty()) return;
    const std::string message = std::move(fault_);
    fault_.clear();
    throw BackendFault(message);
  }
  // Shared attention over the rows in key_rows_/value_rows_ (position -> kv head 0's row).
  void attend(const Tensor& out, const Tensor& q, int64_t kv_len, int64_t kv_heads, int64_t hd,
              AttentionMask mask, float scale) {
    const int64_t n = q.dim(0), heads = q.dim(1);
    BS_CHECK(q.dim(2) == hd && heads % kv_heads == 0 && n <= kv_len);
    const int64_t group = heads / kv_heads;
    pool_.parallel_for(n * heads, std::max<int64_t>(1, kParallelGrain / (kv_len * hd + 1)),
                       [&](int64_t b, int64_t e) {
                         thread_local std::vector<float> scores;
                         thread_local std::vector<const float*> keys, values;
                         scores.resize(kv_len);
                         keys.resize(kv_len);
                         values.resize(kv_len);
                         int64_t cached_kvh = -1;
                         for (int64_t qh = b; qh < e; ++qh) {
                           const int64_t i = qh / heads, h = qh % heads, kvh = h / group;
                           if (kvh != cached_kvh) {
                             for (int64_t j = 0; j < kv_len; ++j) {
                               keys[j] = key_rows_[j] + kvh * hd;
                               values[j] = value_rows_[j] + kvh * hd;
                             }
                             cached_kvh = kvh;
                           }
                           attend_row(q.as<float>() + qh * hd, keys.data(), values.data(), kv_len,
                                      hd, kv_len - n + i, mask.causal, mask.window, scale,
                                      scores.data(), out.as<float>() + qh * hd);
                         }
                       });
  }
  ThreadPool pool_;
  std::shared_ptr<ByteCounter> counter_ = std::make_shared<ByteCounter>();
  std::vector<const float*> key_rows_, value_rows_;  // attention scratch: position -> row
  std::string fault_;  // the first fault since the last read-back (BackendFault); empty: none
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace bs
