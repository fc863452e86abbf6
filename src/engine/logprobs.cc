#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace bs {

void token_logprobs(std::span<const float> logits, int32_t token, int top_n, TokenLogprobs* out) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  BS_CHECK(token >= 0 && token < vocab);
  BS_CHECK(top_n >= 0 && top_n <= vocab);
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_z = max_logit + std::log(sum);
  const auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - log_z);
  };
  out->token = token;
  out->logprob = logprob(token);
  out->top.clear();
  if (top_n == 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int i = 0; i < top_n; ++i) out->top.push_back({.token = ids[i], .logprob = logprob(ids[i])});
}

}  // namespace bs
