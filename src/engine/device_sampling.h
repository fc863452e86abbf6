// Sampled decoding on the backend's device (Backend "Sampling" ops): the filtered distributions,
// the draws and the speculative accept run where the logits are, and only token ids come back to
// the host (one small copy per call). The request's Sampler stays the one owner of the parameters
// and the seeded RNG: it hands out the uniforms, as many and in the same order as its host path
// consumes them (one per drawn row, k + 1 per accept), so the host path (Sampler::sample,
// accept_sampled) and this one give the same tokens wherever the backends' arithmetic agrees (on
// the CPU always: the CPU ops run the same host code).
//
// Speculative decoding keeps two of these per sequence (or one for the drafts per sequence and
// one for the target shared by the sequences of a run):
//   drafts: draft_dev.sample(sampler, draft_logits.rows(0, k), &drafts)  -> the k drafts (host)
//   verify: the target forward over [anchor, drafts]
//   accept: target_dev.accept(sampler, draft_dev, verify_logits)         -> AcceptResult
// which keeps q (the drafts' distributions) and p on the device and reads back k ids, then k + 2.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "engine/speculative_accept.h"

namespace bs {

class DeviceSampling {
 public:
  explicit DeviceSampling(Backend& backend) : backend_(backend) {}
  DeviceSampling(const DeviceSampling&) = delete;
  DeviceSampling& operator=(const DeviceSampling&) = delete;

  // Draws one token per row of logits [n, V] (temperature > 0 only; greedy decoding takes
  // Backend::argmax): probs = filtered_probs(logits, sampler.filter()), n uniforms from `sampler`
  // (row order) uploaded, sample_from_probs; *ids gets the n tokens. The distributions and the
  // ids stay on the device (probs(), ids()) until the next call.
  void sample(Sampler& sampler, const Tensor& logits, std::vector<int32_t>* ids);

  // Speculative accept of the k drafts of `drafts`' last sample() (its ids and distributions q)
  // against the target's verify logits [k + 1, V]: p = filtered_probs(verify_logits), k + 1
  // uniforms from `sampler`, rejection_sample. Reads back k + 2 ids. k = 0 (no drafts) draws from
  // p_0 and does not look at `drafts`.
  AcceptResult accept(Sampler& sampler, const DeviceSampling& drafts, const Tensor& verify_logits);

  // The last sample()'s distributions F32 [n, V] and ids I32 [n], on the device.
  Tensor probs() const { return probs_.rows(0, rows_); }
  Tensor ids() const { return ids_.rows(0, rows_); }

 private:
  // Buffers for `rows` rows of `vocab` (grown, never shrunk).
  void reserve(int64_t rows, int64_t vocab);
  // Uploads `n` uniforms from `sampler`.
  void upload_uniforms(Sampler& sampler, int64_t n);

  Backend& backend_;
  Tensor probs_;     // F32 [capacity, V]
  Tensor uniforms_;  // F32 [capacity + 1]
  Tensor ids_;       // I32 [capacity + 2]
  int64_t rows_ = 0, vocab_ = 0;
  std::vector<float> host_uniforms_;
  std::vector<int32_t> host_out_;
};

}  // namespace bs
