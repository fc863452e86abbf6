// One sequence of plain autoregressive decoding taken step by step, so that generate_plain (one
// CausalLM::forward per step) and the Scheduler (one CausalLM::forward_batch over several
// sequences per step) run the same code and give the same tokens. The caller runs the forwards:
//
//   loop: begin_step (false: finished) -> request() -> target forward -> read_logit_rows -> take
//
// (plain_step, generate_plain's step, ends a sampled step with take_on_device instead: the token is
// drawn on the device and only its id is read back.)
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
  // Ends the step with its logit row: `argmax` [1] (device argmax) when greedy, `logits`
  // [vocab] when sampled (drawn with the sequence's own sampler) or wants_logits(). Commits the
  // token.
  void take(std::span<const int32_t> argmax, std::span<const float> logits);
  // Ends a sampled step with its logit row on the device, `logits` [1, vocab]: the token is drawn
  // there with the sequence's sampler (DeviceSampling; the same uniform as take() would use), only
  // its id is read back. `host_logits` [vocab]: the row on the host when wants_logits()
  // (logprobs), else empty. Commits the token.
  void take_on_device(Backend& backend, const Tensor& logits, std::span<const float> host_logits);

  bool greedy() const { return options_.sampling.greedy(); }
  // The host logits row is needed even when greedy: logprobs are on.
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
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish() { return out_.finish(); }

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

  // Ends the step with `token`.
  void end_step(int32_t token, std::span<const float> logits);
};

// One whole step of `seq` alone through CausalLM::forward (generate_plain's step; the
// Scheduler's prefill). `ids_scratch`: I32 [>= 1]. *stepped: false when the sequence was over.
Status plain_step(CausalLM& target, KvPool& pool, const Tensor& ids_scratch, PlainSequence& seq,
                  bool* stepped);

}  // namespace bs::detail
