// The logits-processing rule (backend/logit_rules.h) written out naively for tests: every
// vocabulary entry, its counts recounted from the output so far.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace bs::test_util {

inline void naive_penalize(std::vector<float>& logits, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& output, const SamplingParams& p) {
  for (int32_t t = 0; t < static_cast<int32_t>(logits.size()); ++t) {
    const auto c = static_cast<int32_t>(std::count(output.begin(), output.end(), t));
    const bool in_prompt = std::find(prompt.begin(), prompt.end(), t) != prompt.end();
    float x = logits[t];
    for (const auto& [token, bias] : p.logit_bias) {
      if (token == t) x += bias;
    }
    if (p.repetition_penalty != 1.0f && (in_prompt || c > 0)) {
      x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    }
    x -= p.frequency_penalty * static_cast<float>(c) + (c > 0 ? p.presence_penalty : 0.0f);
    logits[t] = x;
  }
}

}  // namespace bs::test_util
