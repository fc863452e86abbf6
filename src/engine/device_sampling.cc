#include "engine/device_sampling.h"

#include <algorithm>

#include "core/check.h"

namespace bs {

void DeviceSampling::reserve(int64_t rows, int64_t vocab) {
  if (probs_.defined() && probs_.dim(0) >= rows && probs_.dim(1) == vocab) return;
  const int64_t cap = std::max<int64_t>(rows, probs_.defined() ? probs_.dim(0) : 1);
  // probs_ last: it says what was reserved, so an AllocationError leaves a consistent state.
  probs_ = Tensor();
  uniforms_ = backend_.empty({cap + 1}, DType::kF32);
  ids_ = backend_.empty({cap + 2}, DType::kI32);
  probs_ = backend_.empty({cap, vocab}, DType::kF32);
}

void DeviceSampling::upload_uniforms(Sampler& sampler, int64_t n) {
  host_uniforms_.resize(static_cast<size_t>(n));
  for (float& u : host_uniforms_) u = sampler.uniform();
  backend_.copy_from_host(uniforms_.rows(0, n), host_uniforms_.data());
}

void DeviceSampling::choose(Sampler& sampler, const Tensor& logits, const Tensor& out) {
  const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
  BS_CHECK(out.dtype() == DType::kI32 && out.numel() == n);
  if (sampler.params().greedy()) {
    backend_.argmax(out, logits);
    return;
  }
  reserve(n, v);
  rows_ = n;
  vocab_ = v;
  drawn_ = out;
  const sampling::FilterParams filter = sampler.filter();
  backend_.filtered_probs(probs(), logits, {&filter, 1});
  upload_uniforms(sampler, n);
  backend_.sample_from_probs(out, probs(), uniforms_.rows(0, n));
}

DraftDraw DeviceSampling::draw_for_drafter(Sampler& sampler, int64_t n, int64_t vocab,
                                           const Tensor& out) {
  BS_CHECK(out.dtype() == DType::kI32 && out.numel() == n);
  DraftDraw d{.filter = sampler.filter(), .ids = out};
  // The drafters' own draws (DSpark's chain, DFlash2's candidate walk) propose under temperature,
  // top-k and top-p; min-p shapes the target's distribution only (any proposal q is lossless: the
  // acceptance test uses the q handed over with the drafts).
  d.filter.min_p = 0.0f;
  if (sampler.params().greedy()) {
    d.filter.temperature = 0.0f;
    return d;
  }
  reserve(n, vocab);
  rows_ = n;
  vocab_ = vocab;
  drawn_ = out;
  upload_uniforms(sampler, n);
  d.uniforms = uniforms_.rows(0, n);
  d.probs = probs();
  return d;
}

void DeviceSampling::sample(Sampler& sampler, const Tensor& logits, std::vector<int32_t>* ids) {
  BS_CHECK(!sampler.params().greedy());
  const int64_t v = logits.dim(-1), n = v ? logits.numel() / v : 0;
  reserve(n, v);
  choose(sampler, logits, ids_.rows(0, n));
  ids->resize(static_cast<size_t>(n));
  backend_.copy_to_host(ids->data(), ids_.rows(0, n));
}

void DeviceSampling::accept(Sampler& sampler, const DeviceSampling& drafts,
                            const Tensor& verify_logits, const Tensor& out) {
  BS_CHECK(!sampler.params().greedy());
  const int64_t v = verify_logits.dim(-1), k = (v ? verify_logits.numel() / v : 0) - 1;
  BS_CHECK(k >= 0 && (k == 0 || (drafts.rows_ == k && drafts.vocab_ == v)));
  BS_CHECK(out.dtype() == DType::kI32 && out.numel() >= k + 2);
  reserve(k + 1, v);
  rows_ = k + 1;
  vocab_ = v;
  drawn_ = Tensor();
  const sampling::FilterParams filter = sampler.filter();
  backend_.filtered_probs(probs(), verify_logits, {&filter, 1});
  upload_uniforms(sampler, k + 1);
  backend_.rejection_sample(out, k > 0 ? drafts.ids() : Tensor(), k > 0 ? drafts.probs() : Tensor(),
                            probs(), uniforms_.rows(0, k + 1));
}

AcceptResult DeviceSampling::accept(Sampler& sampler, const DeviceSampling& drafts,
                                    const Tensor& verify_logits) {
  const int64_t v = verify_logits.dim(-1), k = (v ? verify_logits.numel() / v : 0) - 1;
  reserve(k + 1, v);
  const Tensor out = ids_.rows(0, k + 2);
  accept(sampler, drafts, verify_logits, out);
  host_out_.resize(static_cast<size_t>(k + 2));
  backend_.copy_to_host(host_out_.data(), out);
  return {.accepted = host_out_[0], .next = host_out_[1]};
}

}  // namespace bs
