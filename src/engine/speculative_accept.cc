#include "engine/speculative_accept.h"

#include <vector>

#include "core/check.h"

namespace bs {

AcceptResult accept_greedy(std::span<const int32_t> drafts,
                           std::span<const int32_t> target_argmax) {
  BS_CHECK(target_argmax.size() == drafts.size() + 1);
  AcceptResult r;
  while (r.accepted < static_cast<int64_t>(drafts.size()) &&
         drafts[r.accepted] == target_argmax[r.accepted]) {
    ++r.accepted;
  }
  r.next = target_argmax[r.accepted];
  return r;
}

AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const float> q,
                            std::span<const float> p, int64_t vocab, Sampler& sampler) {
  const int64_t k = static_cast<int64_t>(drafts.size());
  BS_CHECK(static_cast<int64_t>(q.size()) == k * vocab);
  BS_CHECK(static_cast<int64_t>(p.size()) == (k + 1) * vocab);
  AcceptResult r;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t d = drafts[i];
    BS_CHECK(d >= 0 && d < vocab);
    const float pd = p[i * vocab + d], qd = q[i * vocab + d];
    const float u = sampler.uniform();
    if (u * qd < pd) {
      ++r.accepted;
      continue;
    }
    // Rejected: draw the correction from the residual max(p - q, 0).
    std::vector<float> residual(static_cast<size_t>(vocab));
    double total = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const float diff = p[i * vocab + v] - q[i * vocab + v];
      residual[v] = diff > 0 ? diff : 0.0f;
      total += residual[v];
    }
    r.next = total > 0 ? sampler.sample_from(residual)
                       : sampler.sample_from(p.subspan(i * vocab, vocab));
    return r;
  }
  r.next = sampler.sample_from(p.subspan(k * vocab, vocab));
  return r;
}

}  // namespace bs
