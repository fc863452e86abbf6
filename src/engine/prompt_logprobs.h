// Log-probabilities of a prompt's own tokens (the OpenAI completions API's `echo` with
// `logprobs`, which evaluation harnesses use to score continuations): for every prompt token
// after the first, the log-softmax of the target's logits row at the position before it, with
// the top alternatives, computed as engine/logprobs.h computes a committed token's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/logprobs.h"
#include "models/causal_lm.h"

namespace bs {

// Entries for prompt[1 .. P-1] (P - 1 of them; none for a one-token prompt). Runs its own
// prefill over a temporary KV cache of the prompt's size, in forwards of at most
// `rows_per_forward` rows, each reading its logits rows back. Errors: what validate_prompt
// refuses (against the target's max_position_embeddings), top_n outside [0, kMaxTopLogprobs], and
// (OutOfMemory)
// a cache and logits that do not fit in the memory the backend reports free.
Result<std::vector<TokenLogprobs>> prompt_logprobs(CausalLM& target,
                                                   std::span<const int32_t> prompt, int top_n,
                                                   int64_t rows_per_forward = 256);

}  // namespace bs
