// One sequence of plain autoregressive decoding taken step by step, so that generate_plain (one
// CausalLM::forward per step) and the Scheduler (one CausalLM::forward_batch over several
// sequences per step) run the same code and give the same tokens. The caller runs the forwards:
//
//   loop: begin_step (false: finished) -> request() -> target forward -> take_step
//
// take_step chooses every sequence's token on the device (greedy: argmax; sampled: a draw with
// the sequence's sampler, DeviceSampling) and reads back only the ids, plus the logits row of a
// sequence that wants logprobs.
//
// The first step feeds the whole prompt (prefill), every later step the last committed token. A
// chunked prefill (the Scheduler's) caches the prompt's head with prefill_chunk first; the first
// step then feeds what is left of it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/device_sampling.h"
#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"
#include "engine/logit_processing.h"

namespace bs::detail {

class PlainSequence {
 public:
  // `options` (validated by begin_generation), `on_token`, `on_logprobs` and `stats` must
  // outlive the sequence; the prompt is copied. KV blocks come from `allocator` as the sequence
  // grows.
  PlainSequence(BlockAllocator& allocator, const GenerateOptions& options, int64_t max_context,
                std::span<const int32_t> prompt, const TokenCallback& on_token,
                const LogprobsCallback& on_logprobs, GenerateStats& stats);
  PlainSequence(const PlainSequence&) = delete;
  PlainSequence& operator=(const PlainSequence&) = delete;

  // Starts a step: false when generation is over (stats.finish says why: max_tokens leaves
  // kLength, the window sets kContext); else reserves the cache for the step's tokens.
  Result<bool> begin_step();
  // The step's forward: its tokens at the cached length, logits of the last row, no taps.
  ForwardRequest request() const;
  // Draws the step's token (temperature > 0) from its logits row [1, vocab] on the device into
  // `out` (I32 [1]) with the sequence's sampler (DeviceSampling); nothing is read back.
  void draw(Backend& backend, const Tensor& logits, const Tensor& out);
  // Ends the step with its token: `logits` [vocab] is its logits row on the host when
  // wants_logits() (logprobs), else empty. Commits the token.
  void take(int32_t token, std::span<const float> logits);
  // The step's logits processing rules (its logits row at `row`), appended when it has some.
  void add_logit_rules(int64_t row, std::vector<sampling::LogitRules>* out) {
    rules_.add_rules(out_.tokens(), row, 1, out);
  }

  bool greedy() const { return options_.sampling.greedy(); }
  // The step's logits row is read back: logprobs are on.
  bool wants_logits() const { return options_.logprobs >= 0; }
  bool done() const { return done_; }
  // Prompt tokens not cached yet (0 once the first step has run).
  int64_t prompt_left() const {
    return out_.size() == 0 && !done_ ? static_cast<int64_t>(step_tokens_.size()) : 0;
  }
  bool prefilled() const { return prompt_left() == 0; }
  // Chunked prefill: caches the next `n` prompt tokens, 1 <= n < prompt_left() (the last chunk is
  // the first step, which samples the first token), through one target forward without logits.
  // The cache ends up as after a whole-prompt prefill (on the CPU, bit for bit).
  Status prefill_chunk(CausalLM& target, KvPool& pool, int64_t n);
  // prefill_chunk with the forward run by the caller (the Scheduler's mixed step, where a chunk
  // shares the running sequences' forward): begin_chunk reserves the cache for the next `n`
  // prompt tokens, 1 <= n < prompt_left(), and gives their forward (no logits, no taps); after
  // that forward ran, end_chunk(n) counts them cached. A failed forward needs no undo.
  Result<ForwardRequest> begin_chunk(int64_t n);
  void end_chunk(int64_t n);
  // Overlap (SchedulerOptions::overlap): the next step's forward queued before this step's
  // token is read back, its input the token still on the device. can_run_ahead: the sequence
  // is decoding (its prompt cached), wants no logprobs, and a next step will follow this one
  // unless its token ends the sequence (EOS, stop string, on_token's false): max_tokens and the
  // context window leave room for it, and it processes no logits (their rules need the token).
  // reserve_ahead reserves the cache for that step's token; ahead_request(token) (I32 [1] on the
  // device: this step's token) is its forward, what request() gives after take(). After take(), the
  // step is begun (no begin_step); when take() ended the sequence, the queued row is dropped and
  // its reserved blocks go with the sequence.
  bool can_run_ahead() const;
  Status reserve_ahead();
  ForwardRequest ahead_request(const Tensor& token) const;
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }
  // The tokens committed so far and the sampler (a preempted request's resumption, Scheduler).
  std::span<const int32_t> committed() const { return out_.tokens(); }
  Sampler& sampler() { return sampler_; }

 private:
  const GenerateOptions& options_;
  int64_t max_context_ = 0;
  GenerateStats& st_;
  SequenceKv kv_;
  Sampler sampler_;
  std::unique_ptr<DeviceSampling> device_;  // the sampler's device buffers, made on first use
  CommittedTokens out_;
  std::vector<int32_t> step_tokens_;  // what the next forward feeds: the prompt, then 1 token
  bool done_ = false;
  LogitProcessing rules_;        // after step_tokens_ (built from the prompt)
  std::vector<int32_t> prompt_;  // prefix caching: the prompt, until its blocks are offered
};

// Ends a step of `seqs` from their logits rows [n, vocab] (row i: seqs[i]'s): every token is
// chosen on the device into ids_scratch rows [0, n) (I32; one argmax over the rows for the greedy
// sequences, a draw for each sampled one), the n ids are read back at once (the step's one read;
// a sequence that wants logprobs reads its logits row too) and committed.
void take_step(Backend& backend, std::span<PlainSequence* const> seqs, const Tensor& logits,
               const Tensor& ids_scratch);

// take_step's device part: every sequence's token chosen into ids_scratch rows [0, n), nothing
// read back (the Scheduler's overlapped steps read them with Backend::begin_read / end_read and
// hand each to PlainSequence::take).
void choose_tokens(Backend& backend, std::span<PlainSequence* const> seqs, const Tensor& logits,
                   const Tensor& ids_scratch);

// One whole step of `seq` alone through CausalLM::forward (generate_plain's step; the
// Scheduler's prefill). `ids_scratch`: I32 [>= 1]. *stepped: false when the sequence was over.
Status plain_step(CausalLM& target, KvPool& pool, const Tensor& ids_scratch, PlainSequence& seq,
                  bool* stepped);

}  // namespace bs::detail
