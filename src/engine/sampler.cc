#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace bs {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return InvalidArgument("temperature must be a finite number >= 0, got {}", temperature);
  }
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got {}", top_p);
  }
  return Status::Ok();
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

void Sampler::probs(std::span<const float> logits, std::vector<float>* out) const {
  const size_t v = logits.size();
  out->assign(v, 0.0f);
  if (params_.greedy()) {
    (*out)[argmax(logits)] = 1.0f;
    return;
  }
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  // Candidate order by descending logit (ties: lower id first) for top-k / top-p.
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  size_t keep = v;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < v) keep = params_.top_k;
  const bool need_sort = keep < v || params_.top_p < 1.0f;
  if (need_sort) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  double total = 0;
  std::vector<double> e(keep);
  for (size_t i = 0; i < keep; ++i) {
    e[i] = std::exp(static_cast<double>((logits[order[i]] - max_logit) * inv_t));
    total += e[i];
  }
  if (params_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += e[i] / total;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(e.begin(), e.begin() + static_cast<long>(keep), 0.0);
  }
  for (size_t i = 0; i < keep; ++i) (*out)[order[i]] = static_cast<float>(e[i] / total);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.greedy()) return argmax(logits);
  probs(logits, &scratch_);
  return sample_from(scratch_);
}

int32_t Sampler::sample_from(std::span<const float> probs) {
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double total = 0;
  for (float p : probs) total += p;
  double cum = 0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i] / total;
    last_nonzero = static_cast<int32_t>(i);
    if (u < cum) return last_nonzero;
  }
  return last_nonzero;
}

float Sampler::uniform() { return std::uniform_real_distribution<float>(0.0f, 1.0f)(rng_); }

}  // namespace bs
