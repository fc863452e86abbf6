// Verification of one block of drafts against the target's rows: the acceptance rule of lossless
// speculative decoding (specs/dflash.md §2, serving.md §0 step 2).
//
// Row i of the target verify pass (i = 0..k) is the target's prediction for the position after
// [anchor, d_1 .. d_i]; draft d_{i+1} is checked against row i. Exactly one token comes from the
// target per step: the bonus (every draft accepted) or the correction at the first rejection.
#pragma once

#include <cstdint>
#include <span>

#include "engine/sampler.h"

namespace bs {

struct AcceptResult {
  int64_t accepted = 0;  // length of the accepted draft prefix, 0..k
  int32_t next = 0;      // token committed after the accepted drafts (bonus or correction)
};

// Greedy: accept while d_{i+1} == target_argmax[i]; next = target_argmax[accepted].
// drafts [k], target_argmax [k + 1].
AcceptResult accept_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target_argmax);

// Standard speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023). drafts [k]
// were drawn from q [k, vocab] (row i = distribution of d_{i+1}); p [k + 1, vocab] are the
// target's filtered distributions (Sampler::probs). Draft d_{i+1} is accepted iff
// u_i * q_i(d) < p_i(d) with u_i = uniforms[i] ~ U[0, 1) (i.e. u < p/q). At the first rejection
// the next token is drawn with uniforms[k] from norm(max(p_i - q_i, 0)) (from p_i when that is all
// zero); when every draft is accepted, from p_k. Every committed token is then distributed exactly
// as the target's sampler would have drawn it. This is the host reference of
// Backend::rejection_sample (the rule and its rounding: sampling::rejection_sample).
AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const float> q,
                            std::span<const float> p, int64_t vocab,
                            std::span<const float> uniforms);
// The same with k + 1 uniforms drawn from `sampler` (in order; every step draws all k + 1, as the
// device path, engine/device_sampling.h, does).
AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const float> q,
                            std::span<const float> p, int64_t vocab, Sampler& sampler);

}  // namespace bs
