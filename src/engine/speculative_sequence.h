// One sequence of lossless speculative decoding taken step by step, and the step that runs any
// number of them together, so that generate_speculative (one sequence) and the Scheduler (several
// per step; generate_speculative_batch runs on it) run the same prefill / propose / verify /
// accept / observe code and therefore give the same tokens:
//
//   prefill (whole, or in chunks)
//   loop: begin_step (false: finished) -> speculative_step(run, every sequence still stepping)
//
// A greedy step (without logprobs) keeps its tokens on the device and reads back one small
// tensor per step for all its sequences (see speculative_step); sampled steps and steps that
// report logprobs read the draft and verify logits back to the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"
#include "engine/speculative_accept.h"

namespace bs::detail {

// begin_generation plus the speculative checks: draft_tokens within the drafter's range; sizes the
// per-position counters of `stats`. Returns the draft budget (drafts per step before the
// max_tokens / context limits).
Result<int64_t> begin_speculative(const CausalLM& target, const Drafter& drafter,
                                  std::span<const int32_t> prompt, const GenerateOptions& options,
                                  int64_t max_context, GenerateStats& stats);

// What the sequences of one run share: the models and both caches (indexed by each sequence's
// block table, one table serving both) with their block allocator, and the device buffers and
// host staging of a step of up to `max_seqs` sequences. Each sequence has its own options.
struct SpeculativeRun {
  SpeculativeRun(CausalLM& target, Drafter& drafter, int64_t num_blocks, int64_t max_seqs = 1);
  SpeculativeRun(const SpeculativeRun&) = delete;
  SpeculativeRun& operator=(const SpeculativeRun&) = delete;

  CausalLM& target;
  Drafter& drafter;
  KvPool target_kv;
  KvPool draft_kv;
  BlockAllocator allocator;
  int64_t max_seqs = 1;
  bool batched_propose = true;  // until the drafter says it has no batched pass
  // Device buffers of a step; R = max(block size, max drafts) + 1 rows per sequence.
  Tensor argmax_ids;     // I32 [max_seqs * R]: device argmax of rows read back (host path)
  Tensor verify_tokens;  // I32 [max_seqs * R]: the verify blocks [anchor, d_1..d_k] back to back
  Tensor target_ids;     // I32 [max_seqs * R]: the target's argmax of every verify row
  Tensor offsets;        // I32 [max_seqs + 1]: block boundaries (Backend::greedy_accept)
  Tensor accepted;       // I32 [max_seqs, R + 1]: greedy_accept's result, the step's read-back
  // Host staging of a step.
  std::vector<int32_t> offsets_host, tokens_host, accepted_host, ids_host;
  std::vector<float> logits_host;
  std::vector<ForwardRequest> reqs;
  BatchForwardResult res;
};

// KV blocks one sequence may hold at once: the prompt plus max_tokens within the window, and the
// drafter's block of B positions past the anchor (propose writes K/V up to s + B - 1).
int64_t speculative_blocks(const Drafter& drafter, int64_t prompt_tokens,
                           const GenerateOptions& options, int64_t max_context);

// The trace record of the latest step (generate_speculative's trace_path lines). Times are host
// wall time, as GenerateStats's: issuing the drafts, issuing the verify until the step's
// read-back, issuing the context update (docs/ARCHITECTURE.md, "Step timing").
struct SpeculativeStep {
  int64_t anchor_pos = 0;
  int32_t anchor = 0;
  std::span<const int32_t> drafts;
  int64_t accepted = 0;
  int32_t next = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double observe_seconds = 0;
};

class SpeculativeSequence {
 public:
  // `options` (validated by begin_speculative), `prompt`, `on_token`, `on_logprobs` and `stats`
  // must outlive the sequence.
  SpeculativeSequence(SpeculativeRun& run, const GenerateOptions& options,
                      std::span<const int32_t> prompt, const TokenCallback& on_token,
                      const LogprobsCallback& on_logprobs, GenerateStats& stats);
  SpeculativeSequence(const SpeculativeSequence&) = delete;
  SpeculativeSequence& operator=(const SpeculativeSequence&) = delete;

  // The prompt through the target (every row tapped, logits of the last row), observed by the
  // drafter; the first token is sampled. Chunked (the Scheduler's chunked prefill): each call
  // feeds the next at most `max_tokens` prompt tokens (0: all that are left) at their positions
  // and the drafter observes their taps, so both caches end up as after a whole-prompt prefill;
  // only the call that feeds the prompt's last token reads logits and samples the first token.
  Status prefill(int64_t max_tokens = 0);
  // Prompt tokens not cached yet.
  int64_t prompt_left() const {
    return std::max<int64_t>(static_cast<int64_t>(prompt_.size()) - kv_.length(), 0);
  }

  // Starts a step: false when generation is over (stats.finish says why); else reserves the
  // cache for this step's k drafts (k may be 0). speculative_step runs the rest.
  Result<bool> begin_step();

  // ---- The step's parts (speculative_step calls them, in this order) ----
  // Greedy without logprobs: the step's tokens stay on the device, its drafts are argmaxed into
  // rows [row, row + verify_rows()) of run.verify_tokens (set_verify_row) and its acceptance comes
  // from Backend::greedy_accept (accept_device). Else the host path: drafts and verify logits are
  // read back (take_drafts / accept).
  bool device_accept() const { return greedy() && !wants_logits(); }
  bool greedy() const { return options_.sampling.greedy(); }
  void set_verify_row(int64_t row) { verify_row_ = row; }
  int32_t anchor() const { return verify_tokens_[0]; }
  int64_t drafts_wanted() const { return k_; }
  ProposeRequest propose_request() const;
  // The step's drafts from the drafter's logits rows [>= k, vocab]: device path, their argmax
  // into run.verify_tokens on the device; host path, the argmax read back when greedy, else
  // sampled from the sampling distribution (kept for the acceptance test).
  void take_drafts(const Tensor& draft_logits);
  // The host time of proposing and taking this step's drafts (its share of a batched propose).
  void take_draft_seconds(double seconds) { step_.draft_seconds = seconds; }
  // The verify forward of the step: [anchor, drafts...] at s.., k + 1 logit rows, with taps
  // (device path: the tokens as ForwardRequest::device_tokens).
  ForwardRequest verify_request() const;
  int64_t verify_rows() const { return k_ + 1; }
  // After the verify forward, host path: accepts (target_argmax [k + 1] when greedy,
  // target_logits [k + 1, vocab] when sampled or wants_logits(): the i-th token committed
  // reports row i's logprobs), commits and rolls the cache back; the drafter's observe of the
  // accepted positions from `taps` (the verify rows' taps) is left in pending_observe().
  // `verify_seconds`: the step's verify time, for the statistics.
  Status accept(const Tensor& taps, std::span<const int32_t> target_argmax,
                std::span<const float> target_logits, double verify_seconds);
  // The same on the device path from this sequence's row of Backend::greedy_accept's result:
  // [a, next, d_1 .. d_k, ...].
  Status accept_device(const Tensor& taps, std::span<const int32_t> result, double verify_seconds);
  const std::optional<ObserveRequest>& pending_observe() const { return pending_observe_; }
  // The caller ran pending_observe() (in `seconds`, its share of a batched observe).
  void observed(double seconds) {
    pending_observe_.reset();
    st_.observe_seconds += seconds;
    step_.observe_seconds = seconds;
  }

  // The verify rows' host logits are needed even when greedy: logprobs are on.
  bool wants_logits() const { return options_.logprobs >= 0; }
  bool done() const { return done_; }
  const SpeculativeStep& last_step() const { return step_; }
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }

 private:
  Status observe(const Tensor& taps, int64_t start);
  // Counts, commits and rolls back an accepted step; leaves the drafter's observe pending.
  Status commit_step(const AcceptResult& acc, const Tensor& taps,
                     std::span<const float> target_logits, double verify_seconds);

  SpeculativeRun& run_;
  const GenerateOptions& options_;
  int64_t max_context_ = 0;
  int64_t draft_budget_ = 0;
  GenerateStats& st_;
  std::span<const int32_t> prompt_;
  SequenceKv kv_;
  Sampler sampler_;
  CommittedTokens out_;
  bool done_ = false;
  // The current step.
  int64_t s_ = 0;                       // anchor position = tokens cached
  int64_t k_ = 0;                       // drafts verified
  std::vector<int32_t> verify_tokens_;  // [anchor, d_1..d_k] (device path: drafts at accept)
  int64_t verify_row_ = 0;              // device path: first row of the block in run.verify_tokens
  std::vector<float> draft_logits_, q_, p_;
  SpeculativeStep step_;
  std::optional<ObserveRequest> pending_observe_;
};

// One speculative step of `seqs` (each begun by begin_step, at most run.max_seqs): drafts for
// every sequence that wants some (one Drafter::propose_batch when the drafter has it, else one
// propose each), one CausalLM::forward_batch verifying every block, each sequence accepting on
// its own, one Drafter::observe_batch of the accepted positions. Device path sequences (greedy,
// no logprobs): their anchors and block boundaries are uploaded with the step's indices, drafts
// argmaxed on the device straight into the verify input, the target's argmax and
// Backend::greedy_accept run on the device, and the only device-to-host read of the step is
// greedy_accept's result (I32 [sequences, R + 1], run.accepted); the context update is launched
// after it, and the next step's read-back waits for it.
Status speculative_step(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs);

}  // namespace bs::detail
