// One sequence of lossless speculative decoding taken step by step, and the step that runs any
// number of them together, so that generate_speculative (one sequence) and the Scheduler (several
// per step; generate_speculative_batch runs on it) run the same prefill / propose / verify /
// accept / commit / observe code and therefore give the same tokens:
//
//   prefill (whole, or in chunks)
//   loop: begin_step (false: finished) -> SpeculativeStep(run, every sequence still stepping).run()
//
// A step keeps its tokens on the device, greedy or sampled, and reads back one small tensor for
// all its sequences (the accept phase); a sequence that reports logprobs also reads the logits
// rows of the tokens it commits.
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
#include "engine/logit_processing.h"
#include "engine/speculative_accept.h"
#include "engine/verify_budget.h"

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
  SpeculativeRun(CausalLM& target, Drafter& drafter, int64_t num_blocks, int64_t max_seqs = 1,
                 bool prefix_caching = false);
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
  // I32 [max_seqs]: the first tokens of a prefill (row 0) or of a batched prefill (row i for its
  // i-th sequence), chosen on the device.
  Tensor first_tokens;
  // The target's distributions of a sampled sequence's verify rows (and of a prefill's first
  // token), made by each sampled accept in turn.
  DeviceSampling target_sampling;
  // Host staging of a step.
  std::vector<int32_t> offsets_host, tokens_host, accepted_host;
  std::vector<ForwardRequest> reqs;
  BatchForwardResult res;
  // Verify-length scheduling (GenerateOptions::verify_budget): the step-time model t(B_v). Unless
  // given (step_time_given), its verify part is measured at the first step that needs it
  // (measure_verify_time) and its fixed part follows the steps' measured times (an exponential
  // average of a step's five phases less the modelled verify); the rule runs once both exist.
  StepTimeModel step_time;
  bool step_time_given = false;
  int64_t fixed_samples = 0;  // steps that measured the fixed part
};

// Times the target's verify forward at 1, 2, 4, ... up to run.max_seqs blocks of the step's
// largest size (rows), each as blocks of that size at position 0 in KV blocks borrowed from the
// run's allocator (as many as are free: fewer points when the pool is busy), one untimed run
// first (plans, CUDA graphs). Returns the (rows, seconds) points; empty when not even one block
// fits. Leaves run.verify_tokens zeroed.
std::vector<std::pair<int64_t, double>> measure_verify_time(SpeculativeRun& run);

// KV blocks one sequence may hold at once: the prompt plus max_tokens within the window, and the
// drafter's block of B positions past the anchor (propose writes K/V up to s + B - 1).
int64_t speculative_blocks(const Drafter& drafter, int64_t prompt_tokens,
                           const GenerateOptions& options, int64_t max_context);

// Host wall time of each phase of one step (SpeculativeStep; GenerateStats's fields).
struct StepTimes {
  double propose = 0, verify = 0, accept = 0, commit = 0, observe = 0;
  double total() const { return propose + verify + accept + commit + observe; }
};

// The trace record of the latest step (generate_speculative's trace_path lines). Times are the
// step's phases (StepTimes, docs/ARCHITECTURE.md, "Step timing").
struct StepRecord {
  int64_t anchor_pos = 0;
  int32_t anchor = 0;
  std::span<const int32_t> drafts;
  int64_t accepted = 0;
  int32_t next = 0;
  StepTimes times;
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
  // ---- prefill()'s parts, which prefill_batch runs for several sequences at once ----
  // Reserves the cache for the next n prompt tokens (at most `max_tokens`; 0: all that are left)
  // and returns their target forward (every row tapped; the last row's logits when they end the
  // prompt). Nothing else changes until prefilled().
  Result<ForwardRequest> prefill_request(int64_t max_tokens);
  // The drafter's observe of that forward's taps [n, cols] (at the chunk's positions).
  ObserveRequest prefill_observe(const Tensor& taps) const;
  // The forward and the observe of prefill_request's tokens ran (`observe_seconds` long): they
  // are cached. True when they were the prompt's last (choose_first_token comes next).
  bool prefilled(double observe_seconds);
  // The first token from the prompt's last logits row [1, vocab], into `out` (I32 [1] on the
  // device): the argmax, or a draw with the sequence's sampler (one uniform).
  void choose_first_token(const Tensor& logits, const Tensor& out);
  // The logits processing rules of `rows` logits rows at `first_row` that follow what the
  // sequence committed (the first token's row, or a verify block whose row r also follows its
  // drafts 1..r), appended when it has some; Backend::apply_logit_rules takes them.
  void add_logit_rules(int64_t first_row, int64_t rows, std::vector<sampling::LogitRules>* out) {
    rules_.add_rules(out_.tokens(), first_row, rows, out);
  }
  // The first token, read back, is committed (with its logits row [1, vocab] when logprobs are
  // on).
  void take_first_token(int32_t token, const Tensor& logits);
  // Prompt tokens not cached yet.
  int64_t prompt_left() const {
    return std::max<int64_t>(static_cast<int64_t>(prompt_.size()) - kv_.length(), 0);
  }

  // Starts a step: false when generation is over (stats.finish says why); else reserves the
  // cache for this step's k drafts (k may be 0). SpeculativeStep runs the rest.
  Result<bool> begin_step();

  // ---- The step's parts (SpeculativeStep calls them, phase by phase) ----
  // The step's tokens stay on the device: its block is rows [row, row + verify_rows()) of
  // run.verify_tokens (set_verify_row; the step uploads the anchor), its drafts are chosen into
  // the rows after the anchor (take_drafts / draft_draw), the verify forward reads them there, and
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
  // The step's verify length is the batch's to choose (GenerateOptions::verify_budget).
  bool in_verify_budget() const { return options_.verify_budget == VerifyBudget::kAuto; }
  // Verifies only drafts 1..j with survival[j - 1] >= draft_confidence_min (survival = a_1..a_k
  // of this step's drafts): k shrinks to the first j whose a_j falls below.
  void cut_drafts(std::span<const float> survival);
  // Verifies only the first n drafts (the verify budget's choice); n >= k changes nothing. The
  // step then moves the block (move_block).
  void keep_drafts(int64_t n) { k_ = std::min(k_, n); }
  // The block now starts at `row` of run.verify_tokens (after cuts compacted the blocks).
  void move_block(int64_t row);
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
  // i-th token committed reporting row i's logprobs.
  Status commit(const Tensor& taps, std::span<const int32_t> result, const Tensor& verify_logits);
  const std::optional<ObserveRequest>& pending_observe() const { return pending_observe_; }
  // The caller ran pending_observe().
  void observed() { pending_observe_.reset(); }
  // The step's phase times, into the statistics and the step's record.
  void record_times(const StepTimes& times);

  // The committed tokens' logits rows are read back: logprobs are on.
  bool wants_logits() const { return options_.logprobs >= 0; }
  bool done() const { return done_; }
  const StepRecord& last_step() const { return step_; }
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }
  // The tokens committed so far and the sampler (a preempted request's resumption, Scheduler).
  std::span<const int32_t> committed() const { return out_.tokens(); }
  Sampler& sampler() { return sampler_; }

 private:
  // Counts, commits and rolls back an accepted step; leaves the drafter's observe pending.
  Status commit_step(const AcceptResult& acc, const Tensor& taps,
                     std::span<const float> target_logits);

  SpeculativeRun& run_;
  const GenerateOptions& options_;
  int64_t max_context_ = 0;
  int64_t draft_budget_ = 0;
  GenerateStats& st_;
  std::span<const int32_t> prompt_;
  SequenceKv kv_;
  int64_t prefill_n_ = 0;  // prompt tokens of the prefill_request in flight
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
  StepRecord step_;
  std::optional<ObserveRequest> pending_observe_;
  LogitProcessing rules_;
};

// One speculative step of `seqs` (each begun by begin_step, at most run.max_seqs), greedy and
// sampled alike, as five phases, each timed (StepTimes) and run once for the whole batch:
//   propose  the anchors and block boundaries uploaded with the step's indices; drafts for every
//            sequence that wants some (one Drafter::propose_batch / propose_draw when the drafter
//            has it, else one propose each), chosen on the device straight into the verify input
//            (argmax, or a draw with the sequence's sampler); then each block's length: the
//            confidence cut (draft_confidence_min) and the verify budget (verify_budget), the
//            blocks compacted back to back;
//   verify   one CausalLM::forward_batch over every block;
//   accept   the acceptance on the device (greedy: the target's argmax and one
//            Backend::greedy_accept for every greedy block; sampled: each sequence's rejection
//            sampling) and the step's only device-to-host read, every sequence's [a, next,
//            drafts] (I32 [sequences, R + 1], run.accepted);
//   commit   each sequence committing its tokens on its own (plus the committed rows' logits of
//            sequences that want logprobs) and rolling its cache back;
//   observe  one Drafter::observe_batch of the accepted positions, launched after the read-back
//            (the next step's read-back waits for it).
// The phases run in that order (run(), or one call each); each needs the one before.
// A mixed step (the Scheduler's) also feeds prompt rows: prompts[j]'s next prompt_tokens[j] prompt
// tokens (its prefill_request) go into the verify forward after the blocks (tapped, the last
// row's logits when they end the prompt), the completed prompts' first tokens are chosen on the
// device beside the accept and read back after it, and the observe phase's observe_batch takes
// the prompt rows' taps too, after which each prompt sequence is prefilled() and a completed one
// takes its first token: each as its prefill() would.
class SpeculativeStep {
 public:
  SpeculativeStep(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs,
                  std::span<SpeculativeSequence* const> prompts = {},
                  std::span<const int64_t> prompt_tokens = {});
  SpeculativeStep(const SpeculativeStep&) = delete;
  SpeculativeStep& operator=(const SpeculativeStep&) = delete;

  Status propose();
  Status verify();
  Status accept();
  Status commit();
  Status observe();
  // The five phases, then every sequence's record_times and the step-time model's fixed part.
  Status run();

  const StepTimes& times() const { return times_; }
  int64_t verify_rows() const { return rows_; }

 private:
  // The drafts of every sequence that wants some; survival[i] = a_1..a_k of seqs_[i] when the
  // drafter reported confidences (else empty).
  Status draft(std::vector<std::vector<float>>* survival);
  // The confidence cut and the verify budget, from the drafts' survival.
  void choose_lengths(const std::vector<std::vector<float>>& survival);
  // A mixed step's completed prompts: their first tokens chosen on the device and read back into
  // first_tokens_ (in prompt order).
  void read_first_tokens();

  SpeculativeRun& run_;
  std::span<SpeculativeSequence* const> seqs_;
  std::span<SpeculativeSequence* const> prompts_;
  std::span<const int64_t> prompt_tokens_;
  std::vector<int64_t> first_rows_;  // per prompt: its first token's row of run.first_tokens, or -1
  std::vector<int32_t> first_tokens_;  // the completed prompts' first tokens, read back
  StepTimes times_;
  bool any_greedy_ = false;
  int64_t rows_ = 0;  // verify rows in all (B_v)
};

// SpeculativeStep(run, seqs).run().
Status speculative_step(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs);

// Several sequences' whole remaining prompts prefilled together (the Scheduler's batched prefill;
// at most run.max_seqs): one CausalLM::forward_batch over every prompt (every row tapped, the
// last row's logits), one Drafter::observe_batch of all their taps, the first tokens chosen on
// the device (one argmax for the greedy ones, a draw with each sampled sequence's sampler) and
// read back at once, each committed as its prefill() commits it; each sequence's output equals
// its prefill()'s (on the CPU bit for bit). On an error nothing has changed but the caches'
// reservations (which a later prefill reuses): the sequences may prefill again, together or
// alone.
Status prefill_batch(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs);

}  // namespace bs::detail
