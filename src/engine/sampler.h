// Token sampling: greedy, temperature, top-k, top-p; seeded and reproducible. The filtered
// distribution (probs) is also what speculative rejection sampling compares.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"

namespace bs {

struct SamplingParams {
  float temperature = 0.0f;      // 0: greedy (argmax, first index on ties)
  int top_k = 0;                 // 0: off
  float top_p = 1.0f;            // 1: off
  std::optional<uint64_t> seed;  // none: fresh randomness

  bool greedy() const { return temperature <= 0.0f; }
  // InvalidArgument naming the field for out-of-range values.
  Status validate() const;
};

// argmax, first index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // Distribution after temperature, then top-k, then top-p (HF order), renormalised; entries
  // outside the kept set are exactly 0. Greedy: one-hot at the argmax.
  void probs(std::span<const float> logits, std::vector<float>* out) const;
  // Draws from `logits` (argmax when greedy).
  int32_t sample(std::span<const float> logits);
  // Draws an index from a normalised distribution.
  int32_t sample_from(std::span<const float> probs);
  // Uniform in [0, 1).
  float uniform();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
};

}  // namespace bs
