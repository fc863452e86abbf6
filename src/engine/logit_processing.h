// One sequence's logits processing (SamplingParams' presence / frequency / repetition
// penalties, min_tokens and logit_bias; the rule is backend/logit_rules.h): the rules of each
// block of logits rows the sequence chooses tokens from, built from what it has generated. The
// sequences hand them to one Backend::apply_logit_rules per step, before the argmax or the
// filtered distribution, in plain decoding and in the speculative verify alike, so that a greedy
// speculative run stays token for token the plain one and a sampled one keeps its distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/logit_rules.h"
#include "engine/generate.h"

namespace bs::detail {

class LogitProcessing {
 public:
  // `prompt` is the sequence's whole input (options.generated_prefix of its last tokens being
  // output generated before a preemption); `options` validated by begin_generation. Both are
  // copied from as needed.
  LogitProcessing(const GenerateOptions& options, std::span<const int32_t> prompt);

  bool active() const { return active_; }
  // The rules of a block of `rows` logits rows at `first_row` whose row 0 follows `committed`
  // (the tokens generated since the sequence began; row r also follows the block's r input
  // tokens after its first). Valid until the next call. Appended to *out when active().
  void add_rules(std::span<const int32_t> committed, int64_t first_row, int64_t rows,
                 std::vector<sampling::LogitRules>* out);

 private:
  bool active_ = false;
  float repetition_ = 1.0f, frequency_ = 0.0f, presence_ = 0.0f;
  int64_t min_tokens_ = 0;
  // Adds one output occurrence of `token` to its entry (made if it has none).
  void count(int32_t token);

  // Every token a rule names (in the prompt when repetition != 1, biased, a stop id while
  // min_tokens forbids it, or generated), sorted by id, one entry each: its flags, bias and
  // output count so far. Kept from step to step (a step adds its new tokens: O(new log n), not a
  // walk over a long prompt's thousands of entries); add_rules hands it out as it is.
  std::vector<sampling::TokenRule> tokens_;
  bool stops_listed_ = false;  // stop-only entries are in tokens_ (dropped once min_tokens is met)
  int64_t generated_ = 0;      // output tokens counted (those before a preemption included)
  int64_t counted_ = 0;        // of `committed` (add_rules), those counted
};

// The logits rows [n, V] a step chooses its tokens from: `logits` itself when `rules` is empty,
// else a processed F32 copy (Backend::apply_logit_rules on it; row_tokens as there), so that the
// raw rows stay for logprobs, which report the model's own distribution (vLLM's default, and
// OpenAI's since logit_bias stopped showing in logprobs).
Tensor logits_to_choose_from(Backend& backend, const Tensor& logits, const Tensor& row_tokens,
                             std::span<const sampling::LogitRules> rules);

}  // namespace bs::detail
