#include "engine/logit_processing.h"

#include <algorithm>

#include "core/check.h"

namespace bs::detail {

LogitProcessing::LogitProcessing(const GenerateOptions& options, std::span<const int32_t> prompt)
    : active_(options.sampling.processes_logits()),
      repetition_(options.sampling.repetition_penalty),
      frequency_(options.sampling.frequency_penalty),
      presence_(options.sampling.presence_penalty),
      min_tokens_(options.sampling.min_tokens) {
  if (!active_) return;
  const auto split = prompt.end() - options.generated_prefix;
  if (repetition_ != 1.0f) {
    for (auto it = prompt.begin(); it != split; ++it) named_[*it].in_prompt = 1;
  }
  for (const auto& [token, bias] : options.sampling.logit_bias) named_[token].bias = bias;
  for (int32_t t : options.stop_ids) named_[t].stop = 1;
  for (auto it = split; it != prompt.end(); ++it) ++named_[*it].count;
  generated_ = options.generated_prefix;
}

void LogitProcessing::add_rules(std::span<const int32_t> committed, int64_t first_row, int64_t rows,
                                std::vector<sampling::LogitRules>* out) {
  if (!active_) return;
  // Count what was committed since the last call (the output only grows).
  BS_CHECK(std::ssize(committed) >= counted_);
  for (int32_t t : committed.subspan(static_cast<size_t>(counted_))) ++named_[t].count;
  generated_ += std::ssize(committed) - counted_;
  counted_ = std::ssize(committed);
  const int64_t stop_rows = std::max<int64_t>(0, min_tokens_ - generated_);
  tokens_.clear();
  for (auto& [token, rule] : named_) {
    // A stop token is named only while it is forbidden (unless something else names it).
    if (stop_rows == 0 && rule.count == 0 && rule.bias == 0.0f && rule.in_prompt == 0) continue;
    rule.token = token;
    tokens_.push_back(rule);
  }
  out->push_back({.first_row = first_row,
                  .rows = rows,
                  .repetition = repetition_,
                  .frequency = frequency_,
                  .presence = presence_,
                  .stop_rows = stop_rows,
                  .tokens = tokens_});
}

Tensor logits_to_choose_from(Backend& backend, const Tensor& logits, const Tensor& row_tokens,
                             std::span<const sampling::LogitRules> rules) {
  if (rules.empty()) return logits;
  const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
  // In F32 whatever the logits' dtype (BF16 on the GPU), as the rule is defined: a BF16 copy would
  // round a small penalty or bias away on a large logit. scale_softcap by 1 without a cap is the
  // converting copy (x * 1 is exact).
  const Tensor processed = backend.empty({n, v}, DType::kF32);
  backend.scale_softcap(processed, logits.view({n, v}), 1.0f, 0.0f);
  backend.apply_logit_rules(processed, row_tokens, rules);
  return processed;
}

}  // namespace bs::detail
