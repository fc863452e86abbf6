// Log-probabilities of committed tokens (the OpenAI API's logprobs / top_logprobs).
//
// What is reported: the log-softmax of the target's raw logits row that decided the token, at
// temperature 1, before top-k / top-p (what OpenAI reports and vLLM's default "raw_logprobs"
// mode), whatever the request's sampling parameters. Plain decoding and speculative decoding
// read the same row (plain: the step's row; speculative: the prefill row, or verify row i for
// the i-th token committed in a step), so on the CPU both report identical values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace bs {

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// One committed token's log-probability and the `n` most likely tokens of its row.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;  // descending logprob, ties: lower id first; n entries
};

// Fills *out for `token` from its logits row [vocab]: log-softmax computed in double (the log of
// the sum of exp(x - max)), rounded to float. `top_n` in [0, vocab].
void token_logprobs(std::span<const float> logits, int32_t token, int top_n, TokenLogprobs* out);

}  // namespace bs
