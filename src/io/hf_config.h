// Hugging Face config.json for decoder-only language models (Llama, Qwen3, and drafters built on
// them). This file only parses and validates numbers; which architectures are served is decided by
// the model registry, which also reads drafter-specific fields from `raw`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace bs::io {

enum class RopeType { kDefault, kLinear, kLlama3, kYarn };

// RoPE inverse-frequency parameters, named as in transformers' modeling_rope_utils.py. Only the
// fields of `type` are meaningful.
struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000;  // rope_theta (base)
  double factor = 1;     // linear / llama3 / yarn scaling factor
  // llama3: wavelength band edges are original_max_position_embeddings / {low,high}_freq_factor.
  double low_freq_factor = 1, high_freq_factor = 4;
  // llama3 / yarn: pretraining context length. Filled by the parser (top-level
  // `original_max_position_embeddings` first, then the rope dict, then max_position_embeddings);
  // 0 means "use max_position_embeddings".
  int64_t original_max_position_embeddings = 0;
  // yarn: correction range in rotations, attention scaling overrides, and whether the correction
  // range is floored/ceiled to integers.
  double beta_fast = 32, beta_slow = 1;
  std::optional<double> attention_factor, mscale, mscale_all_dim;
  bool truncate = true;
};

struct TransformerConfig {
  std::string architecture;  // architectures[0], "" when absent
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads, defaults to num_heads
  int64_t head_dim = 0;      // defaults to hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  int64_t bos_token_id = -1;           // -1 when absent or null
  std::vector<int64_t> eos_token_ids;  // config's eos_token_id, an int or a list
  // One entry per layer ("full_attention", "sliding_attention", ...). When the config has none:
  // all "full_attention", except Qwen2/Qwen3-style configs with use_sliding_window=true, where
  // layers >= max_window_layers are "sliding_attention" (as transformers does).
  std::vector<std::string> layer_types;
  // Attention window in tokens; nullopt when absent, null, or use_sliding_window is false.
  std::optional<int64_t> sliding_window;
  nlohmann::json raw;  // the whole document, for drafter-specific fields
};

// Parses a config document. `file` names it in errors. When the top level has no hidden_size but
// a `text_config` object (multimodal wrappers), the model fields are read from text_config;
// architecture and `raw` still come from the top level.
//
// RoPE: `rope_parameters` (transformers 5, which also holds rope_theta) is preferred over
// `rope_scaling` (transformers 4); the type is under `rope_type` or `type`. default/none/null are
// kDefault; linear, llama3 and yarn are supported; any other type (dynamic, longrope, ...), per-
// layer-type rope dicts and partial_rotary_factor != 1 are Unimplemented errors naming them. For
// yarn without `factor`, factor = max_position_embeddings / original_max_position_embeddings.
Result<TransformerConfig> parse_transformer_config(const nlohmann::json& j,
                                                   const std::string& file);

// Reads dir/config.json, and dir/generation_config.json when present. Token ids: when
// generation_config.json has eos_token_id, eos_token_ids is its ids followed by any config.json ids
// it lacks (generate() stops on generation_config's ids; keeping config's too never misses a stop
// the model was trained with); a non-null bos_token_id there replaces config.json's.
Result<TransformerConfig> load_transformer_config(const std::string& dir);

std::string_view rope_type_name(RopeType t);

}  // namespace bs::io
