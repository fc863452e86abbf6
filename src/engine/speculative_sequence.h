// One sequence of lossless speculative decoding taken step by step, and the step that runs any
// number of them together, so that generate_speculative (one sequence) and the Scheduler (several
// per step; generate_speculative_batch runs on it) run the same prefill / propose / verify /
// accept / observe code and therefore give the same tokens:
//
//   prefill (whole, or in chunks)
//   loop: begin_step (false: finished) -> speculative_step(run, every sequence still stepping)
//
// A step keeps its tokens on the device, greedy or sampled, and reads back one small tensor for
// all its sequences (see speculative_step); a sequence that reports logprobs also reads the
// logits rows of the tokens it commits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/device_sampling.h"
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
  Tensor verify_tokens;  // I32 [max_seqs * R]: the verify blocks [anchor, d_1..d_k] back to back
  Tensor target_ids;     // I32 [max_seqs * R]: the target's argmax of every verify row (greedy)
  Tensor offsets;        // I32 [max_seqs + 1]: block boundaries (Backend::greedy_accept)
  // I32 [max_seqs, R + 1]: row i = sequence i's [a, next, d_1 .. d_k] (greedy_accept, or the
  // sampled accept, Backend::rejection_sample), the step's one read-back.
  Tensor accepted;
  Tensor first_token;  // I32 [1]: a prefill's first token, chosen on the device
  // The target's distributions of a sampled sequence's verify rows (and of a prefill's first
  // token), made by each sampled accept in turn.
  DeviceSampling target_sampling;
  // Host staging of a step.
  std::vector<int32_t> offsets_host, tokens_host, accepted_host;
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
  // drafter; the first token is chosen on the device (argmax or draw) and its id read back (its
  // logits row too with logprobs). Chunked (the Scheduler's chunked prefill): each call feeds the
  // next at most `max_tokens` prompt tokens (0: all that are left) at their positions and the
  // drafter observes their taps, so both caches end up as after a whole-prompt prefill; only the
  // call that feeds the prompt's last token computes logits and chooses the first token.
  Status prefill(int64_t max_tokens = 0);
  // Prompt tokens not cached yet.
  int64_t prompt_left() const {
    return std::max<int64_t>(static_cast<int64_t>(prompt_.size()) - kv_.length(), 0);
  }

  // Starts a step: false when generation is over (stats.finish says why); else reserves the
  // cache for this step's k drafts (k may be 0). speculative_step runs the rest.
  Result<bool> begin_step();

  // ---- The step's parts (speculative_step calls them, in this order) ----
  // The step's tokens stay on the device: its block is rows [row, row + verify_rows()) of
  // run.verify_tokens (set_verify_row; speculative_step uploads the anchor), its drafts are
  // chosen into the rows after the anchor (take_drafts), the verify forward reads them there, and
  // its row of run.accepted gets [a, next, drafts] (greedy: Backend::greedy_accept for every
  // greedy block at once; sampled: accept_on_device).
  bool greedy() const { return options_.sampling.greedy(); }
  void set_verify_row(int64_t row) { verify_row_ = row; }
  int32_t anchor() const { return anchor_; }
  int64_t drafts_wanted() const { return k_; }
  ProposeRequest propose_request() const;
  // The step's drafts from the drafter's logits rows [>= k, vocab], into run.verify_tokens on the
  // device: their argmax when greedy, else drawn with the sequence's sampler (the distributions
  // q stay on the device for the accept).
  void take_drafts(const Tensor& draft_logits);
  // Drafters that draw their own drafts (Drafter::draws_drafts): the buffers and randomness of
  // this step's k drafts, drawn straight into run.verify_tokens as take_drafts does.
  DraftDraw draft_draw();
  // A confidence cut is on (GenerateOptions::draft_confidence_min) and the drafter can report.
  bool wants_confidence() const;
  // Verifies only drafts 1..j with survival[j - 1] >= draft_confidence_min (survival = a_1..a_k
  // of this step's drafts): k shrinks to the first j whose a_j falls below. speculative_step then
  // moves the block (move_block).
  void cut_drafts(std::span<const float> survival);
  // The block now starts at `row` of run.verify_tokens (after cuts compacted the blocks).
  void move_block(int64_t row);
  // The host time of proposing and taking this step's drafts (its share of a batched propose).
  void take_draft_seconds(double seconds) { step_.draft_seconds = seconds; }
  // The verify forward of the step: its block of run.verify_tokens as ForwardRequest::
  // device_tokens at s.., k + 1 logit rows, with taps.
  ForwardRequest verify_request() const;
  int64_t verify_rows() const { return k_ + 1; }
  // Sampled: rejection sampling of the drafts against the verify logits [k + 1, vocab] on the
  // device, writing [a, next, d_1 .. d_k] into `result` (I32 [>= k + 2]); nothing is read back.
  void accept_on_device(const Tensor& verify_logits, const Tensor& result);
  // After the step's read-back: commits d_1 .. d_a and next from this sequence's row of it,
  // `result` = [a, next, d_1 .. d_k, ...], and rolls the cache back; the drafter's observe of the
  // accepted positions from `taps` (the verify rows' taps) is left in pending_observe().
  // `verify_logits` [k + 1, vocab] (device): when wants_logits(), rows 0..a are read back, the
  // i-th token committed reporting row i's logprobs. `verify_seconds`: for the statistics.
  Status accept(const Tensor& taps, std::span<const int32_t> result, const Tensor& verify_logits,
                double verify_seconds);
  const std::optional<ObserveRequest>& pending_observe() const { return pending_observe_; }
  // The caller ran pending_observe() (in `seconds`, its share of a batched observe).
  void observed(double seconds) {
    pending_observe_.reset();
    st_.observe_seconds += seconds;
    step_.observe_seconds = seconds;
  }

  // The committed tokens' logits rows are read back: logprobs are on.
  bool wants_logits() const { return options_.logprobs >= 0; }
  bool done() const { return done_; }
  const SpeculativeStep& last_step() const { return step_; }
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }
  // The tokens committed so far and the sampler (a preempted request's resumption, Scheduler).
  std::span<const int32_t> committed() const { return out_.tokens(); }
  Sampler& sampler() { return sampler_; }

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
  DeviceSampling draft_sampling_;  // sampled: the step's drafts and their distributions q
  CommittedTokens out_;
  bool done_ = false;
  // The current step.
  int64_t s_ = 0;                // anchor position = tokens cached
  int64_t k_ = 0;                // drafts verified
  int32_t anchor_ = 0;           // the last committed token, at s
  int64_t verify_row_ = 0;       // first row of the block in run.verify_tokens
  std::vector<int32_t> drafts_;  // [k]: the drafts, from the read-back (for the record)
  SpeculativeStep step_;
  std::optional<ObserveRequest> pending_observe_;
};

// One speculative step of `seqs` (each begun by begin_step, at most run.max_seqs), greedy and
// sampled alike: their anchors and block boundaries are uploaded with the step's indices; drafts
// for every sequence that wants some (one Drafter::propose_batch when the drafter has it, else
// one propose each), chosen on the device straight into the verify input (argmax, or a draw with
// the sequence's sampler); one CausalLM::forward_batch verifying every block; the acceptance on
// the device (greedy: the target's argmax and one Backend::greedy_accept for every greedy block;
// sampled: each sequence's rejection sampling); the step's only device-to-host read, every
// sequence's [a, next, drafts] (I32 [sequences, R + 1], run.accepted), plus the committed rows'
// logits of sequences that want logprobs; each sequence committing on its own; one
// Drafter::observe_batch of the accepted positions, launched after the read-back (the next
// step's read-back waits for it).
Status speculative_step(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs);

}  // namespace bs::detail
