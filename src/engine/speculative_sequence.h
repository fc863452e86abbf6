// One sequence of lossless speculative decoding taken step by step, so that generate_speculative
// (one sequence, CausalLM::forward) and the Scheduler (several sequences, one
// CausalLM::forward_batch per step; generate_speculative_batch runs on it) run the same prefill /
// propose / accept / observe code and therefore give the same tokens. The caller runs the verify
// forwards:
//
//   prefill
//   loop: begin_step (false: finished) -> verify_request -> target forward -> read_logit_rows
//         -> accept
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"

namespace bs::detail {

// begin_generation plus the speculative checks: draft_tokens within the drafter's range; sizes the
// per-position counters of `stats`. Returns the draft budget (drafts per step before the
// max_tokens / context limits).
Result<int64_t> begin_speculative(const CausalLM& target, const Drafter& drafter,
                                  std::span<const int32_t> prompt, const GenerateOptions& options,
                                  int64_t max_context, GenerateStats& stats);

// What the sequences of one run share: the models and both caches (indexed by each sequence's
// block table, one table serving both) with their block allocator. Each sequence has its own
// options.
struct SpeculativeRun {
  SpeculativeRun(CausalLM& target, Drafter& drafter, int64_t num_blocks);
  SpeculativeRun(const SpeculativeRun&) = delete;
  SpeculativeRun& operator=(const SpeculativeRun&) = delete;

  CausalLM& target;
  Drafter& drafter;
  KvPool target_kv;
  KvPool draft_kv;
  BlockAllocator allocator;
  Tensor argmax_ids;  // I32 [max(block size, max drafts) + 1]: device argmax of a block's rows
};

// KV blocks one sequence may hold at once: the prompt plus max_tokens within the window, and the
// drafter's block of B positions past the anchor (propose writes K/V up to s + B - 1).
int64_t speculative_blocks(const Drafter& drafter, int64_t prompt_tokens,
                           const GenerateOptions& options, int64_t max_context);

// The trace record of the latest step (generate_speculative's trace_path lines).
struct SpeculativeStep {
  int64_t anchor_pos = 0;
  int32_t anchor = 0;
  std::span<const int32_t> drafts;
  int64_t accepted = 0;
  int32_t next = 0;
  double draft_seconds = 0;
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
  // cache and, with `propose`, proposes this step's drafts (k of them, k may be 0). Without it
  // the caller proposes propose_request() (when drafts_wanted() > 0) and hands the drafter's
  // logits to take_drafts (several sequences' proposals in one Drafter::propose_batch).
  Result<bool> begin_step(bool propose = true);
  int64_t drafts_wanted() const { return k_; }
  ProposeRequest propose_request() const;
  // The step's drafts from the drafter's logits rows [>= k, vocab]: argmax when greedy, else
  // sampled from the sampling distribution (kept for the acceptance test).
  void take_drafts(const Tensor& draft_logits, double draft_seconds);
  // The verify forward of the step: [anchor, drafts...] at s.., k + 1 logit rows, with taps.
  ForwardRequest verify_request() const;
  int64_t verify_rows() const { return k_ + 1; }
  // After the verify forward: accepts (target_argmax [k + 1] when greedy, target_logits
  // [k + 1, vocab] when sampled or wants_logits(): the i-th token committed reports row i's
  // logprobs), commits, rolls the cache back and lets the drafter observe the
  // accepted positions from `taps` (the verify rows' taps); with observe_now false that observe
  // is left in pending_observe() for the caller (several sequences' in one observe_batch).
  Status accept(const Tensor& taps, std::span<const int32_t> target_argmax,
                std::span<const float> target_logits, bool observe_now = true);
  const std::optional<ObserveRequest>& pending_observe() const { return pending_observe_; }
  // The caller ran pending_observe() (in `seconds`, its share of a batched observe).
  void observed(double seconds) {
    pending_observe_.reset();
    st_.observe_seconds += seconds;
  }

  // The verify rows' host logits are needed even when greedy: logprobs are on.
  bool wants_logits() const { return options_.logprobs >= 0; }
  bool done() const { return done_; }
  const SpeculativeStep& last_step() const { return step_; }
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }

 private:
  Status observe(const Tensor& taps, int64_t start);

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
  std::vector<int32_t> verify_tokens_;  // [anchor, d_1..d_k]
  std::vector<float> draft_logits_, q_, p_;
  SpeculativeStep step_;
  std::optional<ObserveRequest> pending_observe_;
};

}  // namespace bs::detail
