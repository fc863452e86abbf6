// Sampled decoding on the backend's device (Backend "Sampling" ops): the filtered distributions,
// the draws and the speculative accept run where the logits are, and nothing but token ids
// comes back to the host. The request's Sampler stays the one owner of the parameters and the
// seeded RNG: it hands out the uniforms, as many and in the same order as its host path consumes
// them (one per drawn row, k + 1 per accept), so the host path (Sampler::sample, accept_sampled)
// and this one give the same tokens wherever the backends' arithmetic agrees (on the CPU always:
// the CPU ops run the same host code).
//
// A speculative step keeps two of these: one per sequence for its drafts (q stays on the device
// from the draw to the accept), one for the target's distributions (shared by a run's sequences,
// whose accepts follow one another on the stream):
//   drafts: draft_dev.choose(sampler, draft_logits.rows(0, k), verify_tokens rows 1..k)
//   verify: the target forward over [anchor, drafts] (ForwardRequest::device_tokens)
//   accept: target_dev.accept(sampler, draft_dev, verify_logits, result row) -> [a, next, drafts]
// and the step reads back only the result rows (engine/speculative_sequence.h).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "engine/speculative_accept.h"
#include "models/drafter.h"

namespace bs {

class DeviceSampling {
 public:
  explicit DeviceSampling(Backend& backend) : backend_(backend) {}
  DeviceSampling(const DeviceSampling&) = delete;
  DeviceSampling& operator=(const DeviceSampling&) = delete;

  // The sampler's token for every row of logits [n, V], written to `out` (I32 [n] on the
  // backend, e.g. rows of a forward's device_tokens); nothing is read back. Greedy: the argmax
  // (Backend::argmax; no uniform, no distributions kept). Else a draw: probs =
  // filtered_probs(logits, sampler.filter()), n uniforms from `sampler` (row order) uploaded,
  // sample_from_probs into `out`; the distributions and `out` stay this object's probs() / ids()
  // until the next call (accept() of the drafts reads them).
  void choose(Sampler& sampler, const Tensor& logits, const Tensor& out);
  // choose() (temperature > 0) into this object's own buffer, and the n ids read back into *ids.
  void sample(Sampler& sampler, const Tensor& logits, std::vector<int32_t>* ids);

  // Speculative accept of the k drafts of `drafts`' last draw (its ids and distributions q)
  // against the target's verify logits [k + 1, V]: p = filtered_probs(verify_logits), k + 1
  // uniforms from `sampler`, Backend::rejection_sample into `out` (I32 [>= k + 2] on the backend)
  // = [a, next, d_1 .. d_k], Backend::greedy_accept's row layout; nothing is read back. k = 0 (no
  // drafts) draws from p_0 and does not look at `drafts`. Temperature > 0.
  void accept(Sampler& sampler, const DeviceSampling& drafts, const Tensor& verify_logits,
              const Tensor& out);
  // The same into this object's own buffer, read back.
  AcceptResult accept(Sampler& sampler, const DeviceSampling& drafts, const Tensor& verify_logits);

  // The buffers a drafter that draws its own drafts (Drafter::draws_drafts) fills, for n drafts
  // over `vocab` into `out` (I32 [n] on the backend): greedy, only the filter (temperature 0) and
  // `out`; sampled, also n uniforms from `sampler` (as choose() takes them) and this object's
  // probs for q, so that accept() then reads the drafter's draws as choose()'s.
  DraftDraw draw_for_drafter(Sampler& sampler, int64_t n, int64_t vocab, const Tensor& out);
  // Keeps only the first n drafts of the last draw, whose ids now live in `out` (I32 [n]).
  void keep_drafts(int64_t n, const Tensor& out) {
    rows_ = n;
    drawn_ = out;
  }

  // On the device: the last call's distributions F32 [n, V] (a draw's n rows, an accept's p) and
  // the last draw's ids I32 [n] (undefined after an accept).
  Tensor probs() const { return probs_.rows(0, rows_); }
  Tensor ids() const { return drawn_; }

 private:
  // Buffers for `rows` rows of `vocab` (grown, never shrunk).
  void reserve(int64_t rows, int64_t vocab);
  // Uploads `n` uniforms from `sampler`.
  void upload_uniforms(Sampler& sampler, int64_t n);

  Backend& backend_;
  Tensor probs_;     // F32 [capacity, V]
  Tensor uniforms_;  // F32 [capacity + 1]
  Tensor ids_;       // I32 [capacity + 2]: sample()'s and the read-back accept()'s output
  Tensor drawn_;     // I32 [rows_]: the last draw's output (ids_ or the caller's `out`)
  int64_t rows_ = 0, vocab_ = 0;
  std::vector<float> host_uniforms_;
  std::vector<int32_t> host_out_;
};

}  // namespace bs
