// The only place that maps a checkpoint's config to a model class.
#pragma once

#include <memory>
#include <string>

#include "models/causal_lm.h"

namespace bs {

// Loads a Hugging Face target checkpoint folder (config.json + safetensors).
Result<std::unique_ptr<CausalLM>> load_target(const std::string& dir, Backend& backend);

// Family specs, one file per family under models/target/.
TargetSpec llama_spec(const io::TransformerConfig& config);
TargetSpec qwen3_spec(const io::TransformerConfig& config);
TargetSpec qwen2_spec(const io::TransformerConfig& config);

}  // namespace bs
