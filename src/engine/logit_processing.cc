#include "engine/logit_processing.h"

#include <algorithm>
#include <map>

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
  // Every entry the rules name, then sorted and merged by token.
  std::vector<sampling::TokenRule> all;
  if (repetition_ != 1.0f) {
    for (auto it = prompt.begin(); it != split; ++it) all.push_back({.token = *it, .in_prompt = 1});
  }
  std::map<int32_t, float> bias;  // a token biased twice takes the last bias
  for (const auto& [token, b] : options.sampling.logit_bias) bias[token] = b;
  for (const auto& [token, b] : bias) {
    if (b != 0.0f) all.push_back({.token = token, .bias = b});  // a zero bias changes nothing
  }
  generated_ = options.generated_prefix;
  stops_listed_ = min_tokens_ > generated_;
  if (stops_listed_) {
    for (int32_t t : options.stop_ids) all.push_back({.token = t, .stop = 1});
  }
  for (auto it = split; it != prompt.end(); ++it) all.push_back({.token = *it, .count = 1});
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.token < b.token; });
  for (const sampling::TokenRule& r : all) {
    if (tokens_.empty() || tokens_.back().token != r.token) {
      tokens_.push_back(r);
      continue;
    }
    sampling::TokenRule& e = tokens_.back();
    e.count += r.count;
    e.in_prompt |= r.in_prompt;
    e.stop |= r.stop;
    if (r.bias != 0.0f) e.bias = r.bias;  // one bias entry a token at most
  }
}

void LogitProcessing::count(int32_t token) {
  const auto it =
      std::lower_bound(tokens_.begin(), tokens_.end(), token,
                       [](const sampling::TokenRule& r, int32_t t) { return r.token < t; });
  if (it != tokens_.end() && it->token == token) {
    ++it->count;
  } else {
    tokens_.insert(it, {.token = token, .count = 1});
  }
}

void LogitProcessing::add_rules(std::span<const int32_t> committed, int64_t first_row, int64_t rows,
                                std::vector<sampling::LogitRules>* out) {
  if (!active_) return;
  // Count what was committed since the last call (the output only grows).
  BS_CHECK(std::ssize(committed) >= counted_);
  for (int32_t t : committed.subspan(static_cast<size_t>(counted_))) count(t);
  generated_ += std::ssize(committed) - counted_;
  counted_ = std::ssize(committed);
  const int64_t stop_rows = std::max<int64_t>(0, min_tokens_ - generated_);
  if (stop_rows == 0 && stops_listed_) {
    // A stop token is named only while it is forbidden (unless something else names it); the
    // flag no longer matters where it stays.
    std::erase_if(tokens_, [](const sampling::TokenRule& r) {
      return r.count == 0 && r.bias == 0.0f && r.in_prompt == 0;
    });
    stops_listed_ = false;
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
