// Token sampling: greedy, temperature, top-k, top-p; seeded and reproducible. The filtered
// distribution (probs) is also what speculative rejection sampling compares. The rules are
// backend/sampling.h's, shared with the Backend's sampling ops, so drawing on the host (here) and
// on the device (engine/device_sampling.h, with this sampler's uniforms) is one rule.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "core/status.h"

namespace bs {

struct SamplingParams {
  float temperature = 0.0f;      // 0: greedy (argmax, first index on ties)
  int top_k = 0;                 // 0: off
  float top_p = 1.0f;            // 1: off
  float min_p = 0.0f;            // 0: off; else keep tokens >= min_p x the most likely one's
  std::optional<uint64_t> seed;  // none: fresh randomness
  // Logits processing before the choice, greedy or sampled (the rule: backend/logit_rules.h;
  // engine/logit_processing.h keeps each sequence's state).
  float presence_penalty = 0.0f;    // [-2, 2]; 0: off (generated tokens)
  float frequency_penalty = 0.0f;   // [-2, 2]; 0: off (generated tokens, per occurrence)
  float repetition_penalty = 1.0f;  // > 0; 1: off (prompt and generated tokens)
  int64_t min_tokens = 0;           // the stop ids are forbidden before this many tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id, added to its logit [-100, 100]

  bool greedy() const { return temperature <= 0.0f; }
  // Any of the logits processing above is on.
  bool processes_logits() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
           min_tokens > 0 || !logit_bias.empty();
  }
  // InvalidArgument naming the field for out-of-range values.
  Status validate() const;
};

// argmax, first index on ties.
int32_t argmax(std::span<const float> logits);

// The one owner of a request's sampling parameters and seeded RNG, on the host and (through the
// uniforms it hands out) on the device.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // The parameters of the filtered distribution (Backend::filtered_probs takes them).
  sampling::FilterParams filter() const {
    return {.temperature = params_.temperature,
            .top_k = params_.top_k,
            .top_p = params_.top_p,
            .min_p = params_.min_p};
  }
  // Distribution after temperature, then top-k, then top-p, then min-p (HF order), renormalised;
  // entries outside the kept set are exactly 0; ties at a cut are kept together
  // (sampling::filtered_probs has the exact rule). Greedy: one-hot at the argmax.
  void probs(std::span<const float> logits, std::vector<float>* out) const;
  // Draws from `logits` (argmax when greedy, consuming no uniform; else one uniform).
  int32_t sample(std::span<const float> logits);
  // Draws an index from non-negative weights: sampling::draw_index(probs, uniform()).
  int32_t sample_from(std::span<const float> probs);
  // The next uniform in [0, 1): the top 24 bits of the next mt19937_64 output times 2^-24, so
  // exact in float (on the host and the device alike) and never 1.
  float uniform();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
};

}  // namespace bs
