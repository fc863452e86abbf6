// Llama family (LlamaForCausalLM, also Mistral-style checkpoints with the same tensor names):
// pre-norm decoder, GQA, SwiGLU, RoPE (default / llama3 / yarn), optional biases.
#include "models/registry.h"

namespace bs {

TargetSpec llama_spec(const io::TransformerConfig& config) {
  TargetSpec spec;
  spec.family = "llama";
  spec.qk_norm = false;
  spec.attention_bias = config.attention_bias;
  spec.mlp_bias = config.mlp_bias;
  return spec;
}

}  // namespace bs
