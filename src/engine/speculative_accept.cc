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
                            std::span<const float> p, int64_t vocab,
                            std::span<const float> uniforms) {
  AcceptResult r;
  r.accepted = sampling::rejection_sample(drafts, q, p, vocab, uniforms, &r.next);
  return r;
}

AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const float> q,
                            std::span<const float> p, int64_t vocab, Sampler& sampler) {
  std::vector<float> uniforms(drafts.size() + 1);
  for (float& u : uniforms) u = sampler.uniform();
  return accept_sampled(drafts, q, p, vocab, uniforms);
}

}  // namespace bs
