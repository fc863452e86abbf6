// FlashMap: what seed 000 leaves unspecified (specs/flashmap.md §6, "[unknown]"), decided for
// blockspec's own checkpoints and kept in this one struct so that a released checkpoint's
// convention can be matched later by changing it here (docs/FLASHMAP.md, "Unknowns").
//
// Not here because the seed does specify them: the posterior evidence t/max(1-t,1e-3)², the
// flow-map update between jumps, AdaLN chunk order (scale, shift, gate), the erf GELU, the
// time_scale multiplication, the end-time jump embedding and the head fold.
#pragma once

#include <cstdint>
#include <vector>

namespace bs {

struct FlashMapConventions {
  // Timestep features (the seed's `timestep_embedding`, in its unavailable fold.py), FMLM/DiT
  // form: for h = dim / 2 and f_i = max_period^(-i / h), i = 0..h-1,
  //   features(t) = [cos(t f_0) .. cos(t f_{h-1}), sin(t f_0) .. sin(t f_{h-1})] (+ one 0 if
  // dim is odd), evaluated in double and rounded to fp32 (t already multiplied by time_scale).
  double sinusoid_max_period = 10000.0;
  bool sinusoid_cos_first = true;

  // Block self-attention mask (the seed's `block_self_attention` kernel is unavailable): every
  // slot of the block sees every other slot.
  bool block_causal = false;

  // RoPE: neox rotate-half pairs (i, i + head_dim/2), the backend's `rope` op, for the block's
  // self-attention q/k, the cross-attention q and the context keys alike.

  // Draft noise (the seed's `seeded_normal` kernel is unavailable): Backend::seeded_normal keyed by
  // (request seed, stream, position, column). Slot k of a block anchored at p draws at position
  // p + noise_position_offset + k, i.e. the position it drafts. Streams keep the folded one-jump
  // noise (eigenbasis columns) and the exact path's vocabulary-sized state apart.
  int64_t noise_position_offset = 1;
  uint32_t eigen_noise_stream = 0;
  uint32_t state_noise_stream = 1;

  // Eigenbasis of EᵀE used by the noise fold: eigenvalues descending, each eigenvector's
  // largest-magnitude entry (first on ties) positive; eigenvalues below eigen_floor * λ_max are
  // dropped (their noise columns contribute nothing). Fold arithmetic in double.
  double eigen_floor = 1e-12;

  // Time features of one (already scaled) time value, [dim] fp32.
  std::vector<float> timestep_features(double t, int64_t dim) const;
};

}  // namespace bs
