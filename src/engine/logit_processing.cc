#include "engine/logit_processing.h"

#include <algorithm>

namespace bs::detail {
namespace {

bool contains(std::span<const int32_t> sorted, int32_t t) {
  return std::binary_search(sorted.begin(), sorted.end(), t);
}

void sort_unique(std::vector<int32_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

}  // namespace

LogitProcessing::LogitProcessing(const GenerateOptions& options, std::span<const int32_t> prompt)
    : active_(options.sampling.processes_logits()),
      repetition_(options.sampling.repetition_penalty),
      frequency_(options.sampling.frequency_penalty),
      presence_(options.sampling.presence_penalty),
      min_tokens_(options.sampling.min_tokens) {
  if (!active_) return;
  const auto split = prompt.end() - options.generated_prefix;
  earlier_.assign(split, prompt.end());
  if (repetition_ != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), split);
    sort_unique(&prompt_tokens_);
  }
  bias_ = options.sampling.logit_bias;
  std::sort(bias_.begin(), bias_.end());
  stops_ = options.stop_ids;
  sort_unique(&stops_);
}

void LogitProcessing::add_rules(std::span<const int32_t> committed, int64_t first_row, int64_t rows,
                                std::vector<sampling::LogitRules>* out) {
  if (!active_) return;
  // The output so far, sorted: each token's count is its run.
  std::vector<int32_t>& generated = scratch_;
  generated.assign(earlier_.begin(), earlier_.end());
  generated.insert(generated.end(), committed.begin(), committed.end());
  const int64_t stop_rows =
      std::max<int64_t>(0, min_tokens_ - static_cast<int64_t>(generated.size()));
  std::sort(generated.begin(), generated.end());
  // Every token a rule names: generated, in the prompt, biased, or a stop token still forbidden.
  std::vector<int32_t> named(generated.begin(), generated.end());
  named.insert(named.end(), prompt_tokens_.begin(), prompt_tokens_.end());
  for (const auto& entry : bias_) named.push_back(entry.first);
  if (stop_rows > 0) named.insert(named.end(), stops_.begin(), stops_.end());
  sort_unique(&named);
  tokens_.clear();
  for (int32_t t : named) {
    const auto run = std::equal_range(generated.begin(), generated.end(), t);
    const auto b = std::lower_bound(bias_.begin(), bias_.end(), std::pair{t, -1e30f});
    tokens_.push_back({.token = t,
                       .count = static_cast<int32_t>(run.second - run.first),
                       .bias = b != bias_.end() && b->first == t ? b->second : 0.0f,
                       .in_prompt = contains(prompt_tokens_, t) ? uint8_t{1} : uint8_t{0},
                       .stop = contains(stops_, t) ? uint8_t{1} : uint8_t{0}});
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
