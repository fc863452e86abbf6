// Per-request logits processing before a token is chosen: OpenAI's logit_bias, vLLM's
// min_tokens, OpenAI's presence / frequency penalties and the repetition penalty of transformers
// and vLLM. The rule is defined here once, on the host; the CPU backend runs it and the CUDA
// kernel (sampling.cu) calls the same inline function for each token it touches.
//
// For one request, a logits row r of a block of rows [first_row, first_row + rows) predicts the
// token after the request's generated tokens G followed by e_1 .. e_r, the block's input tokens
// after its first one (a speculative verify block [anchor, d_1 .. d_k]: its drafts; a single
// row: none). For token t:
//   c      = count of t in G plus count of t in e_1 .. e_r (the output so far, as row r sees it)
//   x      = -inf when t is a stop token and r < stop_rows (min_tokens not reached); else
//   x     += bias(t)                                       (logit_bias)
//   x      = x > 0 ? x / rep : x * rep when rep != 1 and (t is in the prompt or c > 0)
//   x     -= frequency * c + presence * (c > 0 ? 1 : 0)
// in float, in this order (vLLM's: logits processors, then the penalties; repetition first).
// Tokens with no bias, not in the prompt, no stop token and c = 0 keep their logit exactly; rule
// tokens outside [0, V) (a stop id beyond the vocabulary) are ignored.
// Presence / frequency count generated tokens only; repetition also the prompt's (vLLM's rule).
#pragma once

#include <cstdint>
#include <span>

#include "backend/token_rule.h"

namespace bs::sampling {

// One request's rows and rules. `tokens` is sorted by token id, each token at most once.
struct LogitRules {
  int64_t first_row = 0;
  int64_t rows = 0;
  float repetition = 1.0f;  // 1: off
  float frequency = 0.0f;
  float presence = 0.0f;
  int64_t stop_rows = 0;  // rows [0, stop_rows) of the block forbid the stop tokens
  std::span<const TokenRule> tokens;
};

// Applies `rules` to row r (0-based within the block) of its block: `row` [V] in place, `extra`
// = e_1 .. e_r (the block's input tokens after its first, as many as r).
void apply_logit_rules(std::span<float> row, int64_t r, const LogitRules& rules,
                       std::span<const int32_t> extra);

}  // namespace bs::sampling
