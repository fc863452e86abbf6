#include "models/drafters/flashmap_conventions.h"

#include <cmath>

namespace bs {

std::vector<float> FlashMapConventions::timestep_features(double t, int64_t dim) const {
  std::vector<float> out(static_cast<size_t>(dim), 0.0f);
  const int64_t half = dim / 2;
  const double log_period = std::log(sinusoid_max_period);
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::exp(-log_period * static_cast<double>(i) / static_cast<double>(half));
    const double c = std::cos(t * freq), s = std::sin(t * freq);
    out[i] = static_cast<float>(sinusoid_cos_first ? c : s);
    out[half + i] = static_cast<float>(sinusoid_cos_first ? s : c);
  }
  return out;
}

}  // namespace bs
