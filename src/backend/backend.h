// The backend op interface: everything a model needs from a device. Models call only this
// interface (never cpu/ or cuda/ directly). Tensors passed to an op live on that backend.
//
// Conventions: activations use activation_dtype(); weights come from upload_weight(); index
// tensors (ids, slots, block tables) are I32. All tensors are row-major and contiguous. "Rows" of
// an op over the last dimension d are numel / d.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/logit_rules.h"
#include "backend/sampling.h"
#include "backend/tensor.h"
#include "core/status.h"

namespace bs {

// A weight matrix stored as FP8 E4M3 with one F32 scale per output row (weight-only
// quantization, used for drafter weights): w[m, k] ~ q[m, k] * scale[m].
struct Fp8Weight {
  Tensor q;      // [m, k] F8E4M3
  Tensor scale;  // [m] F32
  bool defined() const { return q.defined(); }
};

// Which keys a query row sees in attention. Query i of n sits at absolute position
// kv_len - n + i (queries are the last n positions). Key j is visible iff
// (!causal || j <= qpos) && (window == 0 || (qpos - j < window && (causal || j - qpos < window))).
struct AttentionMask {
  bool causal = true;
  int64_t window = 0;  // 0: no sliding window
};

// How many cached positions an attention call sees: `max` on the host, or, when `device` is set
// (an I32 [1] tensor on the backend), the value stored there, which must not exceed `max`. The
// device form lets a captured op sequence (Backend::run_captured) serve every step of a
// sequence; `max` then only bounds the work launched.
struct KvLength {
  KvLength(int64_t n) : max(n) {}  // NOLINT(google-explicit-constructor): a plain length
  KvLength(int64_t upper_bound, const Tensor* on_device) : max(upper_bound), device(on_device) {}
  int64_t max = 0;
  const Tensor* device = nullptr;
};

// Memory of the device a backend allocates from, in bytes: the CUDA device's (cudaMemGetInfo plus
// what the backend's own allocator holds free), or the host's RAM (MemAvailable / MemTotal) for
// the CPU backend.
struct MemoryInfo {
  int64_t free = 0;
  int64_t total = 0;
};

// Allocation failure (docs/RELIABILITY.md, "Out of memory"). Backend::empty and upload_weight
// cannot return a Status (they are called from inside every op sequence), so running out of
// device or host memory throws this, one of the code base's two exceptions (with BackendFault,
// below): it unwinds to the nearest
// step boundary (the Scheduler's prefill of one request and its batched step, generate_*,
// plan_kv_cache's warm-up, model loading), which turns it into a kOutOfMemory Status with
// to_status() and frees what the failed step held. Everything else about memory (the KV plan,
// admission) keeps it from happening in normal operation. Programming errors still abort.
class AllocationError : public std::bad_alloc {
 public:
  AllocationError(std::string device, int64_t bytes, std::string detail);
  const char* what() const noexcept override { return message_.c_str(); }
  int64_t bytes() const { return bytes_; }
  Status to_status() const { return {StatusCode::kOutOfMemory, message_}; }

 private:
  int64_t bytes_ = 0;
  std::string message_;
};

// A programming error that a backend op met but could not report through its (void) signature
// (docs/RELIABILITY.md, "Backend faults"): today a KV slot outside the pool in kv_write,
// attention_prologue or prologue_attention. The op skips the offending row and records the first
// such fault; the backend's next read-back (copy_to_host, to_host_f32), which waits for the
// queued work anyway, throws it as a BackendFault and clears the record. Like AllocationError it
// unwinds to the nearest step boundary (catch_allocation_failure), which turns it into a kInternal
// Status: the step's requests fail with the message, the server keeps serving.
class BackendFault : public std::runtime_error {
 public:
  explicit BackendFault(const std::string& message) : std::runtime_error(message) {}
  Status to_status() const { return {StatusCode::kInternal, what()}; }
};

// Upper bounds of the Euclidean norms of the v rows of w2 ([v, r], row-major, the values the
// backend holds), each rounded up to a float and one step more: Backend::markov_chain's norms.
std::vector<float> markov_norm_bounds(std::span<const float> w2, int64_t v, int64_t r);

// The message of a KV slot fault: names the op, the slot and the pool's capacity in slots.
std::string kv_slot_fault_message(const std::string& op, int64_t slot, int64_t capacity);

// Runs `f` (returning Status or Result<T>), turning an AllocationError or std::bad_alloc thrown
// inside into a kOutOfMemory Status, and a BackendFault into a kInternal one.
template <typename F>
auto catch_allocation_failure(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const AllocationError& e) {
    return e.to_status();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kOutOfMemory, "out of host memory (std::bad_alloc)");
  } catch (const BackendFault& e) {
    return e.to_status();
  }
}

// Test hook (fault injection): the n-th allocation through Backend::empty / upload_weight of
// any backend from now on (n >= 1) throws AllocationError as if memory had run out, once; 0
// disarms. `blockspec serve` arms it from the environment variable BLOCKSPEC_FAIL_ALLOC_AT=n when
// it starts listening (arm_allocation_failure_from_env), so n counts the requests' allocations.
void inject_allocation_failure(int64_t nth);
// True while an injected failure is armed and has not fired yet.
bool allocation_failure_pending();
// Reads BLOCKSPEC_FAIL_ALLOC_AT; returns the n armed (0: unset or not a positive number).
int64_t arm_allocation_failure_from_env();
// Called by backends at each allocation: throws the injected failure when its turn has come.
void check_injected_allocation_failure(const std::string& device, int64_t bytes);

// How much a backend's own allocations hold (tensors from empty, weights, workspaces, cached free
// buffers), now and at most since the last Backend::reset_peak_allocated(). Zero where a backend
// does not count.
struct AllocationStats {
  int64_t held = 0;
  int64_t peak = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Storage dtype of activations (F32 on the CPU reference, BF16 on CUDA).
  virtual DType activation_dtype() const = 0;

  // ---- Memory ----
  virtual MemoryInfo memory_info() const = 0;
  // Zero-filled tensors. Throw AllocationError when memory runs out (see above).
  virtual Tensor empty(std::initializer_list<int64_t> shape, DType dtype) = 0;
  Tensor empty(std::initializer_list<int64_t> shape) { return empty(shape, activation_dtype()); }
  // empty() with the failure as a Status (kOutOfMemory naming the bytes).
  Result<Tensor> try_empty(std::initializer_list<int64_t> shape, DType dtype) {
    return catch_allocation_failure([&]() -> Result<Tensor> { return empty(shape, dtype); });
  }
  // Peak accounting for the KV plan's warm-up (engine/kv_budget.h).
  virtual AllocationStats allocation_stats() const { return {}; }
  virtual void reset_peak_allocated() {}
  // Converts host data of any checkpoint dtype into this backend's weight storage.
  virtual Tensor upload_weight(DType src_dtype, const void* src,
                               std::initializer_list<int64_t> shape) = 0;
  // Raw byte copies; host data is in the tensor's own dtype. copy_to_host (and to_host_f32, which
  // reads through it) waits for the queued work and then throws the BackendFault an op recorded
  // since the last read-back, if any (see BackendFault).
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  virtual void fill_zero(const Tensor& t) = 0;
  // dst[n, D][:, col_offset : col_offset + d] = src[n, d] (e.g. gathering tapped hidden states
  // side by side).
  virtual void copy_columns(const Tensor& dst, int64_t col_offset, const Tensor& src) = 0;
  // Reads any float tensor back as fp32 (logits, tests).
  virtual std::vector<float> to_host_f32(const Tensor& t) = 0;
  // Waits for queued work (no-op on the CPU).
  virtual void synchronize() {}

  // ---- Asynchronous read-back ----
  // A read-back that does not wait, so that the host can queue more work (the Scheduler's next
  // step, SchedulerOptions::overlap) before it needs the bytes:
  //   int64_t t = begin_read(ids);   // queued behind the work so far; returns at once
  //   ... queue more ops ...
  //   end_read(t, host_ids);         // waits for that copy only, writes src.nbytes() bytes
  // `src` is small (a step's token ids). end_read throws the BackendFault an op recorded, as
  // copy_to_host does (one queued after begin_read may show up there too). Tickets end in the
  // order they began, each exactly once; at most kMaxPendingReads are pending at a time. A pair
  // is one read-back (the step's one read). CUDA: a pinned host buffer per pending read and an
  // event; the default (CPU) reads at begin_read through copy_to_host and hands the bytes (or the
  // fault that read met) over at end_read.
  static constexpr int kMaxPendingReads = 2;
  virtual int64_t begin_read(const Tensor& src);
  virtual void end_read(int64_t ticket, void* dst);

  // ---- Captured op sequences ----
  // Runs `ops`: op calls whose tensors, shapes and scalar arguments are the same every time
  // `key` is used, so that only tensor contents change between calls (index uploads happen
  // before, outside `ops`; nothing inside may copy to or from the host). The CUDA backend
  // captures the sequence into a CUDA graph on a key's first use and replays the graph after
  // that; other backends just run it. A caller that reallocates a tensor used inside must use a
  // new key.
  virtual void run_captured(const std::string& key, const std::function<void()>& ops) { ops(); }

  // ---- Work beside the stream ----
  // Queues `ops` (op calls) after everything queued so far, free to run concurrently with the
  // calls queued after this one until join_beside() (or a host read, synchronize(), the end of
  // run_captured, which join too): the CUDA backend runs them on a second stream (inside a
  // capture: a parallel branch of the graph); a backend with one stream runs them here. `ops`
  // must not write what the calls before the join read or write, nor read what they write.
  virtual void run_beside(const std::function<void()>& ops) { ops(); }
  virtual void join_beside() {}

  // ---- Dense algebra ----
  // y[n,m] = x[n,k] · w[m,k]ᵀ (+ bias[m]); with accumulate, y += that.
  virtual void matmul(const Tensor& y, const Tensor& x, const Tensor& w,
                      const Tensor* bias = nullptr, bool accumulate = false) = 0;
  // y (+)= rms_norm(x; norm_w, eps) · wᵀ (+ bias): a projection of normalized rows. The default
  // writes the normalized rows into xn (scratch shaped like x) and calls matmul; a backend may
  // fuse the norm into the product and leave xn untouched, equal up to rounding (a row's result
  // still never depends on how many rows share the call).
  virtual void norm_matmul(const Tensor& y, const Tensor& xn, const Tensor& x, const Tensor& norm_w,
                           float eps, const Tensor& w, const Tensor* bias = nullptr,
                           bool accumulate = false);
  // y (+)= swiglu(gate_up) · wᵀ (+ bias): the MLP's down projection. The default writes
  // silu(gate) * up into act ([rows, w.dim(-1)]) and calls matmul; a backend may fuse the
  // activation into the product (leaving act untouched).
  virtual void swiglu_matmul(const Tensor& y, const Tensor& act, const Tensor& gate_up,
                             const Tensor& w, const Tensor* bias = nullptr,
                             bool accumulate = false);
  // The same two with FP8 weights (matmul_fp8 for the product).
  virtual void norm_matmul_fp8(const Tensor& y, const Tensor& xn, const Tensor& x,
                               const Tensor& norm_w, float eps, const Fp8Weight& w,
                               bool accumulate = false);
  virtual void swiglu_matmul_fp8(const Tensor& y, const Tensor& act, const Tensor& gate_up,
                                 const Fp8Weight& w, bool accumulate = false);
  // ---- FP8 weights (drafters' optional weight-only quantization) ----
  // Quantizes a weight w[m, k] (from upload_weight) per row: scale[j] = max_c |w[j, c]| / 448
  // (1 for an all-zero row) and q[j, c] = e4m3(w[j, c] / scale[j]), rounded to nearest even and
  // saturated at 448 (f32_to_f8e4m3). Every backend gives the same q and scale for the same
  // stored w.
  virtual Fp8Weight quantize_fp8_rows(const Tensor& w) = 0;
  // y[n, m] = x[n, k] · (q · diag(scale))ᵀ, i.e. y[r, j] = scale[j] * sum_c x[r, c] q[j, c];
  // with accumulate, y += that. A row's result does not depend on n. (The CUDA kernel computes
  // with x rounded to FP16, saturated at +-65504.)
  virtual void matmul_fp8(const Tensor& y, const Tensor& x, const Fp8Weight& w,
                          bool accumulate = false) = 0;
  // y = a + b (same shape).
  virtual void add(const Tensor& y, const Tensor& a, const Tensor& b) = 0;
  // y = a * b elementwise (same shape).
  virtual void mul(const Tensor& y, const Tensor& a, const Tensor& b) = 0;

  // ---- Normalisation ----
  // RMSNorm over the last dim d = w.numel(): y = x / sqrt(mean(x²) + eps) * w. Works on any
  // x whose numel is a multiple of d (per-head q/k norm uses d = head_dim).
  virtual void rms_norm(const Tensor& y, const Tensor& x, const Tensor& w, float eps) = 0;
  // LayerNorm over the last dim d, optional affine weight/bias (undefined tensors = none).
  virtual void layer_norm(const Tensor& y, const Tensor& x, int64_t d, const Tensor& w,
                          const Tensor& b, float eps) = 0;
  // AdaLN modulation: y[n,d] = x[n,d] * (1 + scale) + shift, where shift/scale are [d] (shared
  // by every row) or [n,d].
  virtual void modulate(const Tensor& y, const Tensor& x, const Tensor& shift,
                        const Tensor& scale) = 0;

  // ---- Activations ----
  // y[n,i] = silu(gate[n,i]) * up[n,i].
  virtual void silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) = 0;
  // The same on a fused gate/up projection: y[n,i] = silu(gate_up[n,c]) * gate_up[n,i+c].
  virtual void swiglu(const Tensor& y, const Tensor& gate_up) = 0;
  // y = gelu(x); tanh approximation or exact erf.
  virtual void gelu(const Tensor& y, const Tensor& x, bool tanh_approx) = 0;
  // y = silu(x).
  virtual void silu(const Tensor& y, const Tensor& x) = 0;

  // ---- Embedding and positions ----
  // y[n,d] = table[ids[n], :].
  virtual void embedding(const Tensor& y, const Tensor& ids, const Tensor& table) = 0;
  // In-place neox (rotate-half) RoPE on x[n, heads, head_dim] at positions[n] (I32):
  // angle = pos * inv_freq[i] (inv_freq F32 [head_dim/2]); cos/sin scaled by attention_scaling.
  virtual void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                    float attention_scaling) = 0;

  // ---- Attention ----
  // Writes k/v[n, kv_heads, head_dim] into the paged pools [num_blocks, block_size, kv_heads,
  // head_dim] at slots[n] (I32, slot = block * block_size + offset). A slot outside
  // [0, num_blocks * block_size) is a programming error: its row is not written and the next
  // read-back throws a BackendFault naming it (so do attention_prologue and prologue_attention).
  virtual void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k,
                        const Tensor& v, const Tensor& slots) = 0;
  // The attention prologue of a decoder layer, from the fused projection
  // qkv[n, (heads + 2 kv_heads) * head_dim] (q columns, then k, then v):
  //   q_out[n, heads, head_dim] = rope(rms_norm(q, q_norm)),
  //   k = rope(rms_norm(k, k_norm)) and v written to the paged pools at slots[n] (as kv_write),
  // with rms_norm over each head (eps) skipped when q_norm / k_norm are undefined, and rope as
  // rope() at positions[n]. heads and head_dim come from q_out, kv_heads from the pools.
  virtual void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                                  const Tensor& k_norm, float eps, const Tensor& positions,
                                  const Tensor& inv_freq, float attention_scaling,
                                  const Tensor& k_pool, const Tensor& v_pool,
                                  const Tensor& slots) = 0;
  // out[n, heads, head_dim] = softmax(q kᵀ * scale) v over the first kv_len positions of one
  // sequence's paged cache (block_table I32 [>= ceil(kv_len.max / block_size)]), masked per
  // `mask`. GQA: query head h reads kv head h / (heads / kv_heads). A query row's result does not
  // depend on the other rows of the call or on kv_len.max (a verify row equals the decode of
  // the same position bit for bit).
  virtual void paged_attention(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                               const Tensor& v_pool, const Tensor& block_table, KvLength kv_len,
                               AttentionMask mask, float scale) = 0;
  // paged_attention for S sequences of n query rows each in one call (batched decode / verify):
  //   out, q:       [S * n, heads, head_dim]; sequence s owns rows [s * n, (s + 1) * n)
  //   block_tables: I32 [S, capacity]; row s is sequence s's block table
  //   kv_lens:      I32 [S] on the backend; sequence s sees its first kv_lens[s] positions
  //                 (n <= kv_lens[s] <= max_kv_len; max_kv_len, like KvLength::max, only bounds
  //                 the work launched, so one captured call serves steps of any length)
  // Every output row is bit-identical to the row that paged_attention(out rows of s, q rows of
  // s, k_pool, v_pool, table row s, kv_lens[s], mask, scale) writes: the same arithmetic per
  // row. That keeps batched generation equal to per-sequence generation (lossless batching).
  virtual void paged_attention_batch(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                                     const Tensor& v_pool, const Tensor& block_tables,
                                     const Tensor& kv_lens, int64_t max_kv_len, AttentionMask mask,
                                     float scale) = 0;
  // A decoder layer's attention from its fused projection in one call: attention_prologue(
  // q_scratch, qkv, ...) then paged_attention_batch(out, q_scratch, k_pool, v_pool, block_tables,
  // kv_lens, ...), with the same results. A backend may fuse the two (the CUDA backend computes
  // the queries and the new keys inside the attention blocks; q_scratch is then left unwritten).
  virtual void prologue_attention(const Tensor& out, const Tensor& q_scratch, const Tensor& qkv,
                                  const Tensor& q_norm, const Tensor& k_norm, float eps,
                                  const Tensor& positions, const Tensor& inv_freq,
                                  float attention_scaling, const Tensor& k_pool,
                                  const Tensor& v_pool, const Tensor& slots,
                                  const Tensor& block_tables, const Tensor& kv_lens,
                                  int64_t max_kv_len, AttentionMask mask, float scale) {
    attention_prologue(q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq, attention_scaling,
                       k_pool, v_pool, slots);
    paged_attention_batch(out, q_scratch, k_pool, v_pool, block_tables, kv_lens, max_kv_len, mask,
                          scale);
  }
  // Dense attention: q[n, heads, d] over k/v[m, kv_heads, d], same mask rule with kv_len = m.
  virtual void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         AttentionMask mask, float scale) = 0;

  // ---- Reductions ----
  // out[n] (I32) = argmax over the last dim of x[n, v] (first index on ties).
  virtual void argmax(const Tensor& out, const Tensor& x) = 0;

  // ---- Ops added for the FlashMap drafter (models/drafters/flashmap.cc) ----
  // General product y = op(a) · op(b), op(t) = tᵀ when the flag is set: a is [n,k] ([k,n] when
  // trans_a), b is [k,m] ([m,k] when trans_b), y is [n,m]. (matmul is the trans_b case.)
  virtual void gemm(const Tensor& y, const Tensor& a, const Tensor& b, bool trans_a,
                    bool trans_b) = 0;
  // dst[n, d] = src[n, D][:, col_offset : col_offset + d] (the inverse of copy_columns).
  virtual void slice_columns(const Tensor& dst, const Tensor& src, int64_t col_offset) = 0;
  // dst[n, V] = fill, then dst[:, ids[j]] = src[:, j] for src[n, V'] and ids I32 [V'].
  virtual void scatter_columns(const Tensor& dst, const Tensor& src, const Tensor& ids,
                               float fill) = 0;
  // Gated residual: y[n,d] += gate[d] * x[n,d].
  virtual void gated_add(const Tensor& y, const Tensor& x, const Tensor& gate) = 0;
  // y = a * x + b * z elementwise (same shape; y may alias x or z).
  virtual void axpby(const Tensor& y, float a, const Tensor& x, float b, const Tensor& z) = 0;
  // Row softmax over the last dim: y[n,v] = softmax(x[n,:] * scale)[v], fp32.
  virtual void softmax(const Tensor& y, const Tensor& x, float scale) = 0;
  // Norm-scaled add: y[n,d] = base[d] + gate / sqrt(sum_e w[e] * z[n,e]^2 + eps) * x[n,d]
  // (FlashMap's one-jump input: the folded noise read-out with its RMSNorm scale).
  virtual void noise_combine(const Tensor& y, const Tensor& base, const Tensor& x, const Tensor& z,
                             const Tensor& w, float gate, float eps) = 0;
  // Counter-based standard normals: out[n, d] (F32) = scale * N(seed, stream, positions[n], c),
  // positions I32 [n]. Every value depends only on its key, so any backend reproduces it:
  //   mix(x)  = splitmix64 finaliser of x + 0x9E3779B97F4A7C15
  //   h       = mix(mix(mix(mix(seed) ^ stream) ^ position) ^ (c / 2))
  //   u1      = ((h >> 40) + 1) * 2^-24 in (0, 1],  u2 = ((h >> 16) & 0xFFFFFF) * 2^-24 in [0, 1)
  //   r       = sqrt(-2 ln u1), computed in double; column c even: r cos(2π u2), odd: r sin(2π u2)
  virtual void seeded_normal(const Tensor& out, const Tensor& positions, uint64_t seed,
                             uint32_t stream, float scale) = 0;

  // ---- Speculative decoding on the device: greedy acceptance (engine/speculative_sequence.cc)
  // ---- accept_greedy (engine/speculative_accept.h) for S verify blocks at once, so that a greedy
  // speculative step reads back only this op's small result. Block s is rows
  // [offsets[s], offsets[s + 1]) of
  //   tokens      I32 [rows]: the verified tokens, the anchor then the drafts d_1 .. d_k
  //               (k = offsets[s + 1] - offsets[s] - 1 >= 0)
  //   target_ids  I32 [rows]: the target's argmax of each verify row (row i predicts the token
  //               after [anchor, d_1 .. d_i])
  // with offsets I32 [S + 1] non-decreasing from 0. Block s's result is row s of
  // out I32 [S, width] (width >= k + 2 for every block):
  //   out[s, 0] = a, the length of the longest prefix with d_{i+1} == target_ids[i] (0 .. k)
  //   out[s, 1] = next = target_ids[a] (the bonus, or the correction at the first rejection)
  //   out[s, 2 .. k + 1] = d_1 .. d_k, out[s, k + 2 ..] = 0.
  // The step commits d_1 .. d_a and then next; the rejected drafts come along for the record.
  virtual void greedy_accept(const Tensor& out, const Tensor& tokens, const Tensor& target_ids,
                             const Tensor& offsets) = 0;

  // ---- Sampling (temperature > 0 decoding on the device; rules in backend/sampling.h) ----
  // The ops run on the backend's stream and copy nothing to the host: a caller uploads the
  // uniforms (drawn from the request's seeded RNG on the host, so a seed reproduces a run on a
  // given backend) and reads back only the token ids. Backends agree up to rounding: top-k cuts
  // exactly, probabilities to a few ulps (expf differs), a top-p cut unless p * Z_k lies within
  // ~1e-6 Z_k of a tie group's cumulative mass, a draw unless u * S lies within rounding of a CDF
  // boundary. Results are deterministic on each backend.
  //
  // probs[n, V] (F32) = sampling::filtered_probs of each row of logits[n, V] (F32, BF16 or F16),
  // with params[r] for row r, or params[0] for every row when params has one entry.
  virtual void filtered_probs(const Tensor& probs, const Tensor& logits,
                              std::span<const sampling::FilterParams> params) = 0;
  // Logits processing (backend/logit_rules.h: logit_bias, min_tokens, presence / frequency /
  // repetition penalties) in place, before a token is chosen from logits [n, V] (F32; on CUDA
  // also BF16 or F16, rounded back after the float rule). Each entry of `requests` owns rows
  // [first_row, first_row + rows) (disjoint, within n); its row r sees e_1 .. e_r =
  // row_tokens[first_row + 1 .. first_row + r] (I32 [n] on the backend: the verify blocks' input
  // tokens), which may be undefined when every entry has one row. Rows of no entry are left as
  // they are.
  virtual void apply_logit_rules(const Tensor& logits, const Tensor& row_tokens,
                                 std::span<const sampling::LogitRules> requests) = 0;
  // out[r] (I32 [n]) = sampling::draw_index(weights[r, :], uniforms[r]) for non-negative
  // weights[n, V] (F32; probs from filtered_probs, or any unnormalised weights) and uniforms F32
  // [n] in [0, 1).
  virtual void sample_from_probs(const Tensor& out, const Tensor& weights,
                                 const Tensor& uniforms) = 0;
  // Speculative rejection sampling of one block of k drafts (sampling::rejection_sample): drafts
  // I32 [k] (in [0, V)) drawn from q F32 [k, V], target distributions p F32 [k + 1, V], uniforms
  // F32 [k + 1] (accept test i uses uniforms[i], the committed draw uniforms[k]). Writes
  // out[0 .. k + 2) of out I32 [>= k + 2] as greedy_accept writes a block's row: [a, next,
  // d_1 .. d_k], the number of accepted drafts a, the token drawn after them (correction or
  // bonus) and the drafts as given; a step commits d_1 .. d_a, then next.
  virtual void rejection_sample(const Tensor& out, const Tensor& drafts, const Tensor& q,
                                const Tensor& p, const Tensor& uniforms) = 0;

  // ---- Ops added for the DSpark / DFlash2 drafters (models/drafters/dspark.cc, dflash2.cc) ----
  // values F32 [n, k] and ids I32 [n, k] = the k largest entries of each row of x[n, V]
  // (1 <= k <= V), sorted by value descending, ties to the lower index.
  virtual void topk(const Tensor& values, const Tensor& ids, const Tensor& x) = 0;
  // y = cap > 0 ? cap * tanh(multiplier * x / cap) : multiplier * x, elementwise (same shape;
  // y may alias x). Logit scaling and soft-capping.
  virtual void scale_softcap(const Tensor& y, const Tensor& x, float multiplier, float cap) = 0;
  // Grouped dynamic causal convolution over blocks of `block_rows` consecutive rows (DFlash2):
  //   y[i, c] (= or +=) sum over t < K with t <= i % block_rows of
  //                     (base[t, c] + dyn[i, which, t, c / group]) * x[i - t, c]
  // x, y [n, H] (n a multiple of block_rows), dyn [n, 2, K, H / group], base [K, H], which 0 or
  // 1. y must not alias x.
  virtual void dynamic_conv(const Tensor& y, const Tensor& x, const Tensor& dyn, int64_t which,
                            const Tensor& base, int64_t group, int64_t block_rows,
                            bool accumulate) = 0;
  // DFlash2's convolutions with their neighbours, one op each so that a backend can fuse them
  // (the defaults run the ops apart; a fused one keeps dynamic_conv's and rms_norm's semantics):
  //   projected_conv:  dyn = x · projᵀ ([n, 2 K G] = [n, 2, K, H / group]);
  //                    y = dynamic_conv(x, dyn, which 0, base [K, H])
  //   dynamic_conv_rms_norm: residual += dynamic_conv(out, dyn, which 1, base);
  //                    xn = rms_norm(residual, norm_w, eps)
  virtual void projected_conv(const Tensor& y, const Tensor& dyn, const Tensor& x,
                              const Tensor& proj, const Tensor& base, int64_t group,
                              int64_t block_rows) {
    matmul(dyn, x, proj);
    dynamic_conv(y, x, dyn, 0, base, group, block_rows, /*accumulate=*/false);
  }
  virtual void dynamic_conv_rms_norm(const Tensor& xn, const Tensor& residual, const Tensor& out,
                                     const Tensor& dyn, const Tensor& base, int64_t group,
                                     int64_t block_rows, const Tensor& norm_w, float eps) {
    dynamic_conv(residual, out, dyn, 1, base, group, block_rows, /*accumulate=*/true);
    rms_norm(xn, residual, norm_w, eps);
  }

  // ---- Fused drafter walks (DSpark's Markov chain, DFlash2's candidate selector; issue 14) ----
  // Neither op copies to or from the host, so both can run inside run_captured.
  //
  // One row of DSpark's full-vocabulary Markov chain: with e = w1[prev[0], :] (prev I32 [1] on the
  // backend, w1 and w2 [V, r]),
  //   z[1, V] (F32) = u[1, V] + w2 · e            (fp32 sums over r)
  //   argmax (I32 [1]) = the first index of the maximum of that row
  // z and argmax may each be undefined (not written); the row is computed either way.
  virtual void markov_row(const Tensor& z, const Tensor& argmax, const Tensor& u,
                          const Tensor& prev, const Tensor& w1, const Tensor& w2) = 0;
  // DSpark's greedy full-vocabulary chain over the k rows of one request (u [k, V]): prev_0 =
  // anchor[0] (I32 [1] on the backend); for j = 0 .. k-1, drafts[j] = markov_row's argmax of row
  // u[j] with prev_j, and prev_{j+1} = drafts[j]. drafts (I32 [k]) must equal those k markov_row
  // argmaxes bit for bit (the same z per id, ties to the lower id). norms (F32 [V], may be
  // undefined) holds an upper bound of each ||w2[v]||_2 (markov_norm_bounds): with it a backend
  // may compute z only for the ids that can reach the row's maximum. The default runs markov_row
  // k times (norms unused).
  virtual void markov_chain(const Tensor& drafts, const Tensor& anchor, const Tensor& u,
                            const Tensor& w1, const Tensor& w2, const Tensor& norms);
  // A left-to-right walk over k rows of T candidates each (one request; DFlash2's selector walk,
  // DSpark's top-t restricted Markov chain), vals F32 [k, T] and ids I32 [k, T] (distinct ids in
  // [0, V) per row, e.g. from topk):
  //   prev_0 = anchor[0] (I32 [1] on the backend); for j = 0 .. k-1:
  //     s_j[c] = vals[j, c] + sum_i pred[prev_j, i] * succ[ids[j, c], i] * scale[j, i]   (fp32)
  //              (scale [k, r] undefined: 1; pred and succ [V, r] undefined: s_j = vals[j])
  //     row_j[V] = -inf except row_j[ids[j, c]] = s_j[c]
  //     greedy (filter.temperature <= 0): d_j = the id of the largest s_j[c], ties to the lower id
  //     sampled: q_j = sampling::filtered_probs(row_j, filter), d_j = draw_index(q_j, uniforms[j])
  //     prev_{j+1} = d_j
  // Writes drafts I32 [k] = d_0 .. d_{k-1}; rows F32 [k, V] = row_j when defined; probs F32
  // [k, V] = q_j when sampled (uniforms F32 [k]; both unused when greedy).
  virtual void candidate_walk(const Tensor& drafts, const Tensor& rows, const Tensor& probs,
                              const Tensor& anchor, const Tensor& vals, const Tensor& ids,
                              const Tensor& pred, const Tensor& succ, const Tensor& scale,
                              const sampling::FilterParams& filter, const Tensor& uniforms) = 0;

 private:
  // The default begin_read / end_read: the pending reads, oldest first (ticket first_read_ +
  // index): their bytes, or the message of the BackendFault their read met.
  struct PendingRead {
    std::vector<unsigned char> bytes;
    std::string fault;
  };
  std::vector<PendingRead> pending_reads_;
  int64_t first_read_ = 0;
};

// The CPU reference backend: fp32 compute on any weight dtype; `threads` <= 0 picks the number
// of hardware threads.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace bs

namespace bs {

// Picks a backend by name: "cpu", "cuda", or "auto" (CUDA when this build has it and a GPU is
// present, else CPU). InvalidArgument / Unimplemented naming the device otherwise.
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads = 0);

}  // namespace bs
