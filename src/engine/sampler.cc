#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace bs {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return InvalidArgument("temperature must be a finite number >= 0, got {}", temperature);
  }
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got {}", top_p);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got {}", min_p);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  }
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be a finite number > 0, got {}",
                           repetition_penalty);
  }
  if (min_tokens < 0) return InvalidArgument("min_tokens must be >= 0, got {}", min_tokens);
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) return InvalidArgument("logit_bias token id {} is negative", token);
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgument("logit_bias value of token {} must be in [-100, 100], got {}", token,
                             bias);
    }
  }
  std::vector<int32_t> ids;
  for (const auto& entry : logit_bias) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
    return InvalidArgument("logit_bias gives token id {} twice", *dup);
  }
  return Status::Ok();
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

void Sampler::probs(std::span<const float> logits, std::vector<float>* out) const {
  out->resize(logits.size());
  sampling::filtered_probs(logits, filter(), *out);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.greedy()) return argmax(logits);
  probs(logits, &scratch_);
  return sample_from(scratch_);
}

int32_t Sampler::sample_from(std::span<const float> probs) {
  return sampling::draw_index(probs, uniform());
}

float Sampler::uniform() { return static_cast<float>(rng_() >> 40) * 0x1p-24f; }

}  // namespace bs
