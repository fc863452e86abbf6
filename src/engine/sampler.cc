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
