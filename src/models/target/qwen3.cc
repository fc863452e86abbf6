// Qwen3 family (Qwen3ForCausalLM): the Llama decoder plus per-head RMSNorm on q and k
// (q_norm/k_norm over head_dim) before RoPE; head_dim may differ from hidden / heads.
#include "models/registry.h"

namespace bs {

TargetSpec qwen3_spec(const io::TransformerConfig& config) {
  TargetSpec spec;
  spec.family = "qwen3";
  spec.qk_norm = true;
  spec.attention_bias = config.attention_bias;
  spec.mlp_bias = false;
  return spec;
}

}  // namespace bs
