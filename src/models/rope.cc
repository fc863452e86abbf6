#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace bs {

namespace {

// transformers: `base ** (torch.arange(0, dim, 2).float() / dim)`, an fp32 tensor. The exponent is
// formed in fp32 exactly as torch does; the power is taken in double and rounded once to fp32
// (torch's fp32 pow is within an ulp of that).
std::vector<float> pos_freqs(double theta, int64_t dim) {
  const double base = static_cast<float>(theta);  // torch casts the scalar base to the fp32 dtype
  std::vector<float> out(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    out[i] = static_cast<float>(std::pow(base, static_cast<double>(e)));
  }
  return out;
}

// 1.0 / (base ** exponents), fp32.
std::vector<float> default_inv_freq(double theta, int64_t dim) {
  std::vector<float> inv = pos_freqs(theta, dim);
  for (float& x : inv) x = 1.0f / x;
  return inv;
}

// transformers' _compute_llama3_parameters, every tensor op in fp32 (python scalars are cast to
// fp32 by torch; `s / t` on a tensor t is `t.reciprocal() * s`).
std::vector<float> llama3_inv_freq(const io::RopeConfig& r, int64_t dim, int64_t orig) {
  std::vector<float> inv = default_inv_freq(r.theta, dim);
  const float factor = static_cast<float>(r.factor);
  const float low_ff = static_cast<float>(r.low_freq_factor);
  const double old_len = static_cast<double>(orig);
  const float low_freq_wavelen = static_cast<float>(old_len / r.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_len / r.high_freq_factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  const float old_len_f = static_cast<float>(old_len);
  const float ff_span = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  for (float& x : inv) {
    const float wavelen = (1.0f / x) * two_pi;
    const float scaled = wavelen > low_freq_wavelen ? x / factor : x;
    const float smooth = ((1.0f / wavelen) * old_len_f - low_ff) / ff_span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    x = medium ? smoothed : scaled;
  }
  return inv;
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' _compute_yarn_parameters.
RopeTable yarn(const io::RopeConfig& r, int64_t dim, int64_t orig) {
  RopeTable t;
  const double factor = r.factor;
  double attention_factor;
  if (r.attention_factor.has_value()) {
    attention_factor = *r.attention_factor;
  } else if (r.mscale.value_or(0) != 0 && r.mscale_all_dim.value_or(0) != 0) {
    attention_factor =
        yarn_get_mscale(factor, *r.mscale) / yarn_get_mscale(factor, *r.mscale_all_dim);
  } else {
    attention_factor = yarn_get_mscale(factor, 1);
  }
  t.attention_scaling = static_cast<float>(attention_factor);

  // Inverse dimension formula: the dimension whose wavelength makes `rotations` turns over the
  // original context. Python floats (double) throughout.
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) *
            std::log(static_cast<double>(orig) / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(r.theta));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // prevent singularity
  const float low_f = static_cast<float>(low);
  const float span_f = static_cast<float>(high - low);

  const std::vector<float> pos = pos_freqs(r.theta, dim);
  const float factor_f = static_cast<float>(factor);
  t.inv_freq.resize(pos.size());
  for (size_t j = 0; j < pos.size(); ++j) {
    const float extrapolation = 1.0f / pos[j];
    const float interpolation = 1.0f / (factor_f * pos[j]);
    const float ramp = std::clamp((static_cast<float>(j) - low_f) / span_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    t.inv_freq[j] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return t;
}

}  // namespace

RopeTable compute_rope(const io::RopeConfig& rope, int64_t head_dim,
                       int64_t max_position_embeddings) {
  BS_CHECK(head_dim > 0 && head_dim % 2 == 0);
  const int64_t orig = rope.original_max_position_embeddings > 0
                           ? rope.original_max_position_embeddings
                           : max_position_embeddings;
  RopeTable t;
  switch (rope.type) {
    case io::RopeType::kDefault:
      t.inv_freq = default_inv_freq(rope.theta, head_dim);
      break;
    case io::RopeType::kLinear: {
      t.inv_freq = default_inv_freq(rope.theta, head_dim);
      const float factor = static_cast<float>(rope.factor);
      for (float& x : t.inv_freq) x /= factor;
      break;
    }
    case io::RopeType::kLlama3:
      t.inv_freq = llama3_inv_freq(rope, head_dim, orig);
      break;
    case io::RopeType::kYarn:
      t = yarn(rope, head_dim, orig);
      break;
  }
  return t;
}

Rope upload_rope(Backend& backend, const io::RopeConfig& rope, int64_t head_dim,
                 int64_t max_position_embeddings) {
  const RopeTable t = compute_rope(rope, head_dim, max_position_embeddings);
  return {backend.upload_weight(DType::kF32, t.inv_freq.data(),
                                {static_cast<int64_t>(t.inv_freq.size())}),
          t.attention_scaling};
}

}  // namespace bs
