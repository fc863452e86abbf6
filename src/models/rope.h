// RoPE inverse-frequency tables, computed as transformers' modeling_rope_utils.py does (fp32
// tensor arithmetic reproduced step by step), for the default, linear, llama3 and yarn types.
//
// The rotary embedding of position p uses angle p * inv_freq[i] for the pair (i, i + head_dim/2)
// (neox rotate-half), and cos/sin are multiplied by attention_scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"

namespace bs {

struct RopeTable {
  std::vector<float> inv_freq;  // [head_dim / 2], radians per position
  float attention_scaling = 1;  // multiplies cos and sin (yarn's attention factor; else 1)
};

// `head_dim` is the rotary dimension (even, > 0). `max_position_embeddings` is the model's
// (used by yarn/llama3 when rope.original_max_position_embeddings is 0).
RopeTable compute_rope(const io::RopeConfig& rope, int64_t head_dim,
                       int64_t max_position_embeddings);

// A RoPE table on a backend (what the rope / attention ops take).
struct Rope {
  Tensor inv_freq;  // F32 [head_dim / 2]
  float attention_scaling = 1.0f;
};
Rope upload_rope(Backend& backend, const io::RopeConfig& rope, int64_t head_dim,
                 int64_t max_position_embeddings);

}  // namespace bs
