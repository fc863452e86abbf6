// Qwen2 family (Qwen2ForCausalLM: Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen): the Llama decoder
// with biases on the q, k and v projections (always, whatever attention_bias says; none on o)
// and no q/k norm. Sliding-window layers come from the config (use_sliding_window,
// max_window_layers or layer_types; io/hf_config.cc).
#include "models/registry.h"

namespace bs {

TargetSpec qwen2_spec(const io::TransformerConfig& config) {
  TargetSpec spec;
  spec.family = "qwen2";
  spec.qk_norm = false;
  spec.attention_bias = true;
  spec.mlp_bias = config.mlp_bias;
  return spec;
}

}  // namespace bs
