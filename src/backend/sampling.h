// The definition of token sampling, on the host: the filtered distribution (temperature, top-k,
// top-p, min-p), the inverse-CDF draw and speculative rejection sampling. The CPU backend's
// sampling ops (backend.h, "Sampling") run these functions, the engine's Sampler uses them for its
// host path, and the CUDA kernels implement the same rules; so host and device sampling are one
// rule.
#pragma once

#include <cstdint>
#include <span>

namespace bs::sampling {

// What a filtered distribution is made of (SamplingParams without the seed).
struct FilterParams {
  float temperature = 1.0f;  // <= 0: one-hot at the argmax (first index on ties)
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  float top_p = 1.0f;        // >= 1: off; else in (0, 1)
  float min_p = 0.0f;        // <= 0: off; else in (0, 1]
};

// probs = the filtered distribution of one row of logits (same length), defined on the logit
// VALUES, so equal logits (ties, frequent with BF16 logits) are always kept or dropped together:
//   temperature <= 0: probs = one-hot at the first index of the maximum.
//   m = max logit; w_i = expf((x_i - m) / T) in float (x_i - m, then IEEE division by T).
//   top-k (0 < k < V): t_k = the k-th largest logit counted with multiplicity; keep x_i >= t_k
//     (every logit tied with the k-th is kept: HF's TopKLogitsWarper rule). Else t_k = -inf.
//   top-p (p < 1): Z_k = sum of w over the kept x_i >= t_k; t_p = the largest logit value v with
//     sum_{kept x_i >= v} w_i >= p * Z_k (the smallest set of whole tie groups, taken from the
//     largest logit down, whose mass reaches p; at least the maximum's group). Else t_p = t_k.
//   min-p (p > 0, after top-k and top-p, as transformers' MinPLogitsWarper follows them): keep
//     only the kept x_i with w_i >= min_p, i.e. probability at least min_p times the maximum's
//     (w of the maximum is 1, so it always stays). Off: every w_i >= 0 passes.
//   probs_i = w_i * float(1 / Z) for the kept x_i (x_i >= t_p and w_i >= min_p), exactly 0
//     otherwise, Z = sum of the kept w_i.
// Sums are in double on the host. Logits must not be NaN or +inf; -inf logits get weight 0.
// -0 and +0 are the same value.
void filtered_probs(std::span<const float> logits, const FilterParams& params,
                    std::span<float> probs);

// The inverse-CDF draw from non-negative weights (normalised or not) and a uniform u in [0, 1):
// the smallest index i with w_i > 0 and C_i > u * S, where C_i = sum_{j <= i} w_j and S = C_last
// (real arithmetic; the host sums in double in index order, so a backend may return a
// neighbouring index only when u * S lies within rounding of a C_i). The last index with w_i > 0
// when rounding leaves none; 0 when no weight is positive. Negative and NaN weights count as 0.
int32_t draw_index(std::span<const float> weights, float u);

// Speculative rejection sampling (Leviathan et al. 2023): drafts [k] drawn from q [k, vocab],
// target distributions p [k + 1, vocab], uniforms [k + 1]. Draft i is accepted iff
// uniforms[i] * q_i(d_i) < p_i(d_i) (float product); at the first rejection, at row a, the next
// token is draw_index(max(p_a - q_a, 0), uniforms[k]) (float differences), or
// draw_index(p_a, uniforms[k]) when that residual is all zero; when every draft is accepted
// (a = k), draw_index(p_k, uniforms[k]). Returns a (0..k) and sets *next.
int64_t rejection_sample(std::span<const int32_t> drafts, std::span<const float> q,
                         std::span<const float> p, int64_t vocab, std::span<const float> uniforms,
                         int32_t* next);

}  // namespace bs::sampling
