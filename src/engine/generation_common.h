// Engine-internal pieces shared by generate_plain, generate_speculative and the Scheduler, so that
// they check their inputs, count and stop exactly alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/generate.h"

namespace bs::detail {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// The context window of a generation: options.max_context, else the target's
// max_position_embeddings.
int64_t context_window(const CausalLM& target, const GenerateOptions& options);

// Validates the sampling parameters and the prompt against `max_context`, and resets `stats`
// for a new generation of this prompt.
Status begin_generation(const CausalLM& target, std::span<const int32_t> prompt,
                        const GenerateOptions& options, int64_t max_context, GenerateStats& stats);

// The committed output: appends tokens one by one and says when generation ends with one (a
// stop token, which is kept, or a callback that returns false).
class CommittedTokens {
 public:
  CommittedTokens(const GenerateOptions& options, const TokenCallback& on_token,
                  const LogprobsCallback& on_logprobs, GenerateStats& stats)
      : options_(options), on_token_(on_token), on_logprobs_(on_logprobs), stats_(stats) {}

  // Appends `token`; true when generation ends with it (stats.finish says why). `logits`: the
  // target's row [vocab] that decided it, required when options.logprobs >= 0 (ignored else):
  // its logprobs go to on_logprobs before on_token sees the token.
  bool commit(int32_t token, std::span<const float> logits = {});
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  std::span<const int32_t> tokens() const { return tokens_; }
  int32_t back() const { return tokens_.back(); }
  // Sets the generated-token count and hands the tokens over.
  std::vector<int32_t> finish();

 private:
  const GenerateOptions& options_;
  const TokenCallback& on_token_;
  const LogprobsCallback& on_logprobs_;
  GenerateStats& stats_;
  TokenLogprobs logprobs_;  // scratch
  std::vector<int32_t> tokens_;
};

}  // namespace bs::detail
