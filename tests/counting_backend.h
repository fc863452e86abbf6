// A Backend decorator for tests: forwards every call to another backend and records the
// device-to-host reads (copy_to_host, to_host_f32, begin_read) and synchronize() calls that go
// through it, so that a test can count a step's host round trips. Models loaded on it run all their
// ops through it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bs::test_util {

class CountingBackend : public Backend {
 public:
  struct Read {
    bool f32 = false;    // to_host_f32 (else copy_to_host or begin_read)
    bool async = false;  // begin_read (its end_read is not recorded again)
    DType dtype = DType::kF32;
    int64_t numel = 0;
  };

  explicit CountingBackend(Backend& inner) : b_(inner) {}

  const std::vector<Read>& reads() const { return reads_; }
  int64_t syncs() const { return syncs_; }
  // Paged attention calls for one sequence (paged_attention) and for several at once
  // (paged_attention_batch).
  int64_t attention_calls() const { return attention_calls_; }
  int64_t batched_attention_calls() const { return batched_attention_calls_; }
  void reset() {
    reads_.clear();
    syncs_ = 0;
    attention_calls_ = batched_attention_calls_ = 0;
    allocations_.clear();
  }

  Device device() const override { return b_.device(); }
  std::string name() const override { return b_.name(); }
  DType activation_dtype() const override { return posed_.value_or(b_.activation_dtype()); }
  // Tests of dtype choices on a CPU: activation_dtype() reports `d` (e.g. BF16, as a GPU would),
  // every empty() request is recorded, and requests for `d` are served in the inner backend's
  // own activation dtype (so its F32-only ops still run).
  struct Allocation {
    std::vector<int64_t> shape;
    DType dtype = DType::kF32;  // as requested
  };
  void pose_activation_dtype(DType d) { posed_ = d; }
  const std::vector<Allocation>& allocations() const { return allocations_; }

  // Memory as the inner backend reports it, or what set_memory_info gave (tests of KV sizing).
  MemoryInfo memory_info() const override { return memory_ ? *memory_ : b_.memory_info(); }
  void set_memory_info(MemoryInfo info) { memory_ = info; }

  AllocationStats allocation_stats() const override { return b_.allocation_stats(); }
  void reset_peak_allocated() override { b_.reset_peak_allocated(); }

  using Backend::empty;
  Tensor empty(std::initializer_list<int64_t> shape, DType dtype) override {
    if (!posed_) return b_.empty(shape, dtype);
    allocations_.push_back({std::vector<int64_t>(shape), dtype});
    return b_.empty(shape, dtype == *posed_ ? b_.activation_dtype() : dtype);
  }
  Tensor upload_weight(DType src_dtype, const void* src,
                       std::initializer_list<int64_t> shape) override {
    return b_.upload_weight(src_dtype, src, shape);
  }
  void copy_from_host(const Tensor& dst, const void* src) override { b_.copy_from_host(dst, src); }
  void copy_to_host(void* dst, const Tensor& src) override {
    reads_.push_back({.f32 = false, .dtype = src.dtype(), .numel = src.numel()});
    b_.copy_to_host(dst, src);
  }
  int64_t begin_read(const Tensor& src) override {
    reads_.push_back({.async = true, .dtype = src.dtype(), .numel = src.numel()});
    return b_.begin_read(src);
  }
  void end_read(int64_t ticket, void* dst) override { b_.end_read(ticket, dst); }
  void copy(const Tensor& dst, const Tensor& src) override { b_.copy(dst, src); }
  void fill_zero(const Tensor& t) override { b_.fill_zero(t); }
  void copy_columns(const Tensor& dst, int64_t col_offset, const Tensor& src) override {
    b_.copy_columns(dst, col_offset, src);
  }
  std::vector<float> to_host_f32(const Tensor& t) override {
    reads_.push_back({.f32 = true, .dtype = t.dtype(), .numel = t.numel()});
    return b_.to_host_f32(t);
  }
  void synchronize() override {
    ++syncs_;
    b_.synchronize();
  }
  void run_captured(const std::string& key, const std::function<void()>& ops) override {
    b_.run_captured(key, ops);
  }

  void matmul(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
              bool accumulate) override {
    b_.matmul(y, x, w, bias, accumulate);
  }
  Fp8Weight quantize_fp8_rows(const Tensor& w) override { return b_.quantize_fp8_rows(w); }
  void matmul_fp8(const Tensor& y, const Tensor& x, const Fp8Weight& w, bool accumulate) override {
    b_.matmul_fp8(y, x, w, accumulate);
  }
  void add(const Tensor& y, const Tensor& a, const Tensor& b) override { b_.add(y, a, b); }
  void mul(const Tensor& y, const Tensor& a, const Tensor& b) override { b_.mul(y, a, b); }
  void rms_norm(const Tensor& y, const Tensor& x, const Tensor& w, float eps) override {
    b_.rms_norm(y, x, w, eps);
  }
  void layer_norm(const Tensor& y, const Tensor& x, int64_t d, const Tensor& w, const Tensor& b,
                  float eps) override {
    b_.layer_norm(y, x, d, w, b, eps);
  }
  void modulate(const Tensor& y, const Tensor& x, const Tensor& shift,
                const Tensor& scale) override {
    b_.modulate(y, x, shift, scale);
  }
  void silu_mul(const Tensor& y, const Tensor& gate, const Tensor& up) override {
    b_.silu_mul(y, gate, up);
  }
  void swiglu(const Tensor& y, const Tensor& gate_up) override { b_.swiglu(y, gate_up); }
  void gelu(const Tensor& y, const Tensor& x, bool tanh_approx) override {
    b_.gelu(y, x, tanh_approx);
  }
  void silu(const Tensor& y, const Tensor& x) override { b_.silu(y, x); }
  void embedding(const Tensor& y, const Tensor& ids, const Tensor& table) override {
    b_.embedding(y, ids, table);
  }
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
            float attention_scaling) override {
    b_.rope(x, positions, inv_freq, attention_scaling);
  }
  void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    b_.kv_write(k_pool, v_pool, k, v, slots);
  }
  void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions,
                          const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& slots) override {
    b_.attention_prologue(q_out, qkv, q_norm, k_norm, eps, positions, inv_freq, attention_scaling,
                          k_pool, v_pool, slots);
  }
  void prologue_attention(const Tensor& out, const Tensor& q_scratch, const Tensor& qkv,
                          const Tensor& q_norm, const Tensor& k_norm, float eps,
                          const Tensor& positions, const Tensor& inv_freq, float attention_scaling,
                          const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                          const Tensor& block_tables, const Tensor& kv_lens, int64_t max_kv_len,
                          AttentionMask mask, float scale) override {
    b_.prologue_attention(out, q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq,
                          attention_scaling, k_pool, v_pool, slots, block_tables, kv_lens,
                          max_kv_len, mask, scale);
  }
  void paged_attention(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                       const Tensor& v_pool, const Tensor& block_table, KvLength kv_len,
                       AttentionMask mask, float scale) override {
    ++attention_calls_;
    b_.paged_attention(out, q, k_pool, v_pool, block_table, kv_len, mask, scale);
  }
  void paged_attention_batch(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                             const Tensor& v_pool, const Tensor& block_tables,
                             const Tensor& kv_lens, int64_t max_kv_len, AttentionMask mask,
                             float scale) override {
    ++batched_attention_calls_;
    b_.paged_attention_batch(out, q, k_pool, v_pool, block_tables, kv_lens, max_kv_len, mask,
                             scale);
  }
  void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                 AttentionMask mask, float scale) override {
    b_.attention(out, q, k, v, mask, scale);
  }
  void argmax(const Tensor& out, const Tensor& x) override { b_.argmax(out, x); }
  void gemm(const Tensor& y, const Tensor& a, const Tensor& b, bool trans_a,
            bool trans_b) override {
    b_.gemm(y, a, b, trans_a, trans_b);
  }
  void slice_columns(const Tensor& dst, const Tensor& src, int64_t col_offset) override {
    b_.slice_columns(dst, src, col_offset);
  }
  void scatter_columns(const Tensor& dst, const Tensor& src, const Tensor& ids,
                       float fill) override {
    b_.scatter_columns(dst, src, ids, fill);
  }
  void gated_add(const Tensor& y, const Tensor& x, const Tensor& gate) override {
    b_.gated_add(y, x, gate);
  }
  void axpby(const Tensor& y, float a, const Tensor& x, float b, const Tensor& z) override {
    b_.axpby(y, a, x, b, z);
  }
  void topk(const Tensor& values, const Tensor& ids, const Tensor& x) override {
    b_.topk(values, ids, x);
  }
  void scale_softcap(const Tensor& y, const Tensor& x, float multiplier, float cap) override {
    b_.scale_softcap(y, x, multiplier, cap);
  }
  void dynamic_conv(const Tensor& y, const Tensor& x, const Tensor& dyn, int64_t which,
                    const Tensor& base, int64_t group, int64_t block_rows,
                    bool accumulate) override {
    b_.dynamic_conv(y, x, dyn, which, base, group, block_rows, accumulate);
  }
  void markov_row(const Tensor& z, const Tensor& argmax, const Tensor& u, const Tensor& prev,
                  const Tensor& w1, const Tensor& w2) override {
    b_.markov_row(z, argmax, u, prev, w1, w2);
  }
  void markov_chain(const Tensor& drafts, const Tensor& anchor, const Tensor& u, const Tensor& w1,
                    const Tensor& w2, const Tensor& norms) override {
    b_.markov_chain(drafts, anchor, u, w1, w2, norms);
  }
  void candidate_walk(const Tensor& drafts, const Tensor& rows, const Tensor& probs,
                      const Tensor& anchor, const Tensor& vals, const Tensor& ids,
                      const Tensor& pred, const Tensor& succ, const Tensor& scale,
                      const sampling::FilterParams& filter, const Tensor& uniforms) override {
    b_.candidate_walk(drafts, rows, probs, anchor, vals, ids, pred, succ, scale, filter, uniforms);
  }
  void softmax(const Tensor& y, const Tensor& x, float scale) override { b_.softmax(y, x, scale); }
  void noise_combine(const Tensor& y, const Tensor& base, const Tensor& x, const Tensor& z,
                     const Tensor& w, float gate, float eps) override {
    b_.noise_combine(y, base, x, z, w, gate, eps);
  }
  void seeded_normal(const Tensor& out, const Tensor& positions, uint64_t seed, uint32_t stream,
                     float scale) override {
    b_.seeded_normal(out, positions, seed, stream, scale);
  }
  void greedy_accept(const Tensor& out, const Tensor& tokens, const Tensor& target_ids,
                     const Tensor& offsets) override {
    b_.greedy_accept(out, tokens, target_ids, offsets);
  }
  void filtered_probs(const Tensor& probs, const Tensor& logits,
                      std::span<const sampling::FilterParams> params) override {
    b_.filtered_probs(probs, logits, params);
  }
  void apply_logit_rules(const Tensor& logits, const Tensor& row_tokens,
                         std::span<const sampling::LogitRules> requests) override {
    b_.apply_logit_rules(logits, row_tokens, requests);
  }
  void sample_from_probs(const Tensor& out, const Tensor& weights,
                         const Tensor& uniforms) override {
    b_.sample_from_probs(out, weights, uniforms);
  }
  void rejection_sample(const Tensor& out, const Tensor& drafts, const Tensor& q, const Tensor& p,
                        const Tensor& uniforms) override {
    b_.rejection_sample(out, drafts, q, p, uniforms);
  }

 private:
  Backend& b_;
  std::vector<Read> reads_;
  int64_t syncs_ = 0;
  int64_t attention_calls_ = 0, batched_attention_calls_ = 0;
  std::optional<MemoryInfo> memory_;
  std::optional<DType> posed_;
  std::vector<Allocation> allocations_;
};

}  // namespace bs::test_util
