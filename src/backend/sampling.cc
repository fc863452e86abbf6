#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace bs::sampling {

void filtered_probs(std::span<const float> logits, const FilterParams& params,
                    std::span<float> probs) {
  const size_t v = logits.size();
  BS_CHECK(v > 0 && probs.size() == v);
  std::fill(probs.begin(), probs.end(), 0.0f);
  if (!(params.temperature > 0.0f)) {
    probs[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0f;
    return;
  }
  const float m = *std::max_element(logits.begin(), logits.end());
  const float temperature = params.temperature;
  float t = -std::numeric_limits<float>::infinity();  // keep x >= t
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < v) {
    std::vector<float> sorted(logits.begin(), logits.end());
    const auto kth = sorted.begin() + (params.top_k - 1);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<float>());
    t = *kth;
  }
  // probs holds the weights of the kept logits until the end.
  for (size_t i = 0; i < v; ++i) {
    if (logits[i] >= t) probs[i] = std::exp((logits[i] - m) / temperature);
  }
  if (params.top_p < 1.0f) {
    std::vector<int32_t> order;
    double z_k = 0;
    for (size_t i = 0; i < v; ++i) {
      if (logits[i] < t) continue;
      order.push_back(static_cast<int32_t>(i));
      z_k += probs[i];
    }
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const double target = static_cast<double>(params.top_p) * z_k;
    double cum = 0;
    for (size_t g = 0; g < order.size();) {  // one tie group of equal logits per iteration
      const float value = logits[order[g]];
      for (; g < order.size() && logits[order[g]] == value; ++g) cum += probs[order[g]];
      if (cum >= target) {
        t = value;
        break;
      }
    }
  }
  const float min_p = params.min_p > 0.0f ? params.min_p : 0.0f;
  auto kept = [&](size_t i) { return logits[i] >= t && probs[i] >= min_p; };
  double z = 0;
  for (size_t i = 0; i < v; ++i) {
    if (kept(i)) z += probs[i];
  }
  const float inv = static_cast<float>(1.0 / z);
  for (size_t i = 0; i < v; ++i) probs[i] = kept(i) ? probs[i] * inv : 0.0f;
}

int32_t draw_index(std::span<const float> weights, float u) {
  double total = 0;
  for (float w : weights) {
    if (w > 0) total += w;
  }
  if (!(total > 0)) return 0;
  const double target = static_cast<double>(u) * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0)) continue;
    cum += weights[i];
    last = static_cast<int32_t>(i);
    if (cum > target) return last;
  }
  return last;
}

int64_t rejection_sample(std::span<const int32_t> drafts, std::span<const float> q,
                         std::span<const float> p, int64_t vocab, std::span<const float> uniforms,
                         int32_t* next) {
  const int64_t k = static_cast<int64_t>(drafts.size());
  BS_CHECK(static_cast<int64_t>(q.size()) == k * vocab);
  BS_CHECK(static_cast<int64_t>(p.size()) == (k + 1) * vocab);
  BS_CHECK(static_cast<int64_t>(uniforms.size()) == k + 1);
  const auto row = [vocab](std::span<const float> rows, int64_t i) {
    return rows.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
  };
  for (int64_t i = 0; i < k; ++i) {
    const int32_t d = drafts[i];
    BS_CHECK(d >= 0 && d < vocab);
    if (uniforms[i] * q[i * vocab + d] < p[i * vocab + d]) continue;
    // Rejected: the next token comes from the residual max(p_i - q_i, 0).
    std::vector<float> residual(static_cast<size_t>(vocab));
    bool any = false;
    for (int64_t j = 0; j < vocab; ++j) {
      const float diff = p[i * vocab + j] - q[i * vocab + j];
      residual[j] = diff > 0 ? diff : 0.0f;
      any |= diff > 0;
    }
    *next = draw_index(any ? std::span<const float>(residual) : row(p, i), uniforms[k]);
    return i;
  }
  *next = draw_index(row(p, k), uniforms[k]);
  return k;
}

}  // namespace bs::sampling
