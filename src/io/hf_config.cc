#include "io/hf_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "io/json_file.h"

namespace bs::io {

using nlohmann::json;

namespace {

Result<int64_t> get_positive_int(const json& j, std::string_view field, std::string_view file) {
  BS_ASSIGN_OR_RETURN(int64_t v, get_int(j, field, file));
  if (v <= 0) return InvalidArgument("{}: field '{}' must be positive, got {}", file, field, v);
  return v;
}

Result<double> get_positive_float(const json& j, std::string_view field, std::string_view file) {
  BS_ASSIGN_OR_RETURN(double v, get_float(j, field, file));
  if (!(v > 0)) return InvalidArgument("{}: field '{}' must be positive, got {}", file, field, v);
  return v;
}

// Optional positive float; nullopt when missing or null.
Result<std::optional<double>> get_optional_float(const json& j, std::string_view field,
                                                 std::string_view file) {
  if (!has_field(j, field)) return std::optional<double>();
  BS_ASSIGN_OR_RETURN(double v, get_float(j, field, file));
  return std::optional<double>(v);
}

// True when `dict` looks like transformers 5's per-layer-type form:
// {"full_attention": {...}, "sliding_attention": {...}}.
bool is_per_layer_type_dict(const json& dict) {
  if (dict.empty()) return false;
  for (auto it = dict.begin(); it != dict.end(); ++it) {
    if (!it->is_object() && !it->is_null()) return false;
    if (it.key().find("attention") == std::string::npos) return false;
  }
  return true;
}

Result<RopeConfig> parse_rope(const json& j, const std::string& file,
                              int64_t max_position_embeddings) {
  RopeConfig rope;
  std::string dict_name;
  const json* dict = nullptr;
  for (const char* name : {"rope_parameters", "rope_scaling"}) {
    if (has_field(j, name)) {
      dict_name = name;
      dict = &j[name];
      break;
    }
  }
  const std::string where = fmt::format("{} ({})", file, dict_name);
  if (dict != nullptr) {
    if (!dict->is_object()) {
      return InvalidArgument("{}: field '{}' must be an object, got {}", file, dict_name,
                             json_type_name(*dict));
    }
    if (is_per_layer_type_dict(*dict)) {
      std::vector<std::string> keys;
      for (auto it = dict->begin(); it != dict->end(); ++it) keys.push_back(it.key());
      return Unimplemented("{}: per-layer-type '{}' ({}) is not supported", file, dict_name,
                           fmt::join(keys, ", "));
    }
  }
  const json empty = json::object();
  const json& d = dict != nullptr ? *dict : empty;

  // Theta: inside the dict (transformers 5), else top level, else 10000.
  if (has_field(d, "rope_theta")) {
    BS_ASSIGN_OR_RETURN(rope.theta, get_positive_float(d, "rope_theta", where));
  } else if (has_field(j, "rope_theta")) {
    BS_ASSIGN_OR_RETURN(rope.theta, get_positive_float(j, "rope_theta", file));
  }

  for (const json* src : {&d, &j}) {
    BS_ASSIGN_OR_RETURN(double prf,
                        get_float_or(*src, "partial_rotary_factor", src == &d ? where : file, 1.0));
    if (prf != 1.0) {
      return Unimplemented("{}: partial_rotary_factor {} is not supported (only 1)",
                           src == &d ? where : file, prf);
    }
  }

  std::string type = "default";
  if (has_field(d, "rope_type")) {
    BS_ASSIGN_OR_RETURN(type, get_string(d, "rope_type", where));
  } else if (has_field(d, "type")) {
    BS_ASSIGN_OR_RETURN(type, get_string(d, "type", where));
  }
  if (type == "default" || type == "none") {
    rope.type = RopeType::kDefault;
    return rope;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
  } else {
    return Unimplemented(
        "{}: rope type '{}' is not supported (supported: default, linear, llama3, yarn)", where,
        type);
  }

  if (rope.type == RopeType::kLlama3 || rope.type == RopeType::kYarn) {
    // transformers 5 standardize_rope_params: a top-level value wins (Phi3-style configs), then
    // the dict's, then max_position_embeddings.
    if (has_field(j, "original_max_position_embeddings")) {
      BS_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                          get_positive_int(j, "original_max_position_embeddings", file));
    } else if (has_field(d, "original_max_position_embeddings")) {
      BS_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                          get_positive_int(d, "original_max_position_embeddings", where));
    } else {
      rope.original_max_position_embeddings = max_position_embeddings;
    }
  }

  if (rope.type == RopeType::kYarn && !has_field(d, "factor")) {
    rope.factor = static_cast<double>(max_position_embeddings) /
                  static_cast<double>(rope.original_max_position_embeddings);
  } else {
    BS_ASSIGN_OR_RETURN(rope.factor, get_positive_float(d, "factor", where));
  }

  if (rope.type == RopeType::kLlama3) {
    BS_ASSIGN_OR_RETURN(rope.low_freq_factor, get_positive_float(d, "low_freq_factor", where));
    BS_ASSIGN_OR_RETURN(rope.high_freq_factor, get_positive_float(d, "high_freq_factor", where));
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return InvalidArgument("{}: high_freq_factor ({}) must be larger than low_freq_factor ({})",
                             where, rope.high_freq_factor, rope.low_freq_factor);
    }
  }

  if (rope.type == RopeType::kYarn) {
    // transformers: `get("beta_fast") or 32`, so 0 and null also mean the default.
    BS_ASSIGN_OR_RETURN(double bf, get_float_or(d, "beta_fast", where, 0));
    BS_ASSIGN_OR_RETURN(double bs, get_float_or(d, "beta_slow", where, 0));
    rope.beta_fast = bf != 0 ? bf : 32;
    rope.beta_slow = bs != 0 ? bs : 1;
    if (!(rope.beta_fast > 0) || !(rope.beta_slow > 0)) {
      return InvalidArgument("{}: beta_fast ({}) and beta_slow ({}) must be positive", where,
                             rope.beta_fast, rope.beta_slow);
    }
    BS_ASSIGN_OR_RETURN(rope.attention_factor, get_optional_float(d, "attention_factor", where));
    BS_ASSIGN_OR_RETURN(rope.mscale, get_optional_float(d, "mscale", where));
    BS_ASSIGN_OR_RETURN(rope.mscale_all_dim, get_optional_float(d, "mscale_all_dim", where));
    BS_ASSIGN_OR_RETURN(rope.truncate, get_bool_or(d, "truncate", where, true));
  }
  return rope;
}

}  // namespace

std::string_view rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

Result<TransformerConfig> parse_transformer_config(const json& j, const std::string& file) {
  if (!j.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", file, json_type_name(j));
  }
  TransformerConfig c;
  c.raw = j;

  BS_ASSIGN_OR_RETURN(std::vector<std::string> archs,
                      get_string_list_or_empty(j, "architectures", file));
  if (!archs.empty()) c.architecture = archs[0];

  // Multimodal wrappers keep the language model's fields in text_config.
  const json* m = &j;
  std::string mfile = file;
  if (!has_field(j, "hidden_size") && has_field(j, "text_config") && j["text_config"].is_object()) {
    m = &j["text_config"];
    mfile = file + " (text_config)";
  }
  const json& t = *m;
  const std::string& f = mfile;

  BS_ASSIGN_OR_RETURN(c.model_type, get_string_or(j, "model_type", file, ""));
  BS_ASSIGN_OR_RETURN(c.hidden_size, get_positive_int(t, "hidden_size", f));
  BS_ASSIGN_OR_RETURN(c.intermediate_size, get_positive_int(t, "intermediate_size", f));
  BS_ASSIGN_OR_RETURN(c.num_layers, get_positive_int(t, "num_hidden_layers", f));
  BS_ASSIGN_OR_RETURN(c.num_heads, get_positive_int(t, "num_attention_heads", f));
  if (has_field(t, "num_key_value_heads")) {
    BS_ASSIGN_OR_RETURN(c.num_kv_heads, get_positive_int(t, "num_key_value_heads", f));
  } else {
    c.num_kv_heads = c.num_heads;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgument(
        "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", f,
        c.num_heads, c.num_kv_heads);
  }
  if (has_field(t, "head_dim")) {
    BS_ASSIGN_OR_RETURN(c.head_dim, get_positive_int(t, "head_dim", f));
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return InvalidArgument(
          "{}: no head_dim, and hidden_size ({}) is not a multiple of num_attention_heads ({})", f,
          c.hidden_size, c.num_heads);
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) {
    return InvalidArgument("{}: head_dim ({}) must be even for rotary embeddings", f, c.head_dim);
  }
  BS_ASSIGN_OR_RETURN(c.vocab_size, get_positive_int(t, "vocab_size", f));
  BS_ASSIGN_OR_RETURN(c.max_position_embeddings, get_positive_int(t, "max_position_embeddings", f));
  BS_ASSIGN_OR_RETURN(c.rms_norm_eps, get_float_or(t, "rms_norm_eps", f, 1e-6));
  if (!(c.rms_norm_eps > 0)) {
    return InvalidArgument("{}: field 'rms_norm_eps' must be positive, got {}", f, c.rms_norm_eps);
  }
  BS_ASSIGN_OR_RETURN(c.rope, parse_rope(t, f, c.max_position_embeddings));
  // tie_word_embeddings is a top-level field even in multimodal configs; fall back to text_config.
  BS_ASSIGN_OR_RETURN(bool tie_inner, get_bool_or(t, "tie_word_embeddings", f, false));
  BS_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                      get_bool_or(j, "tie_word_embeddings", file, tie_inner));
  BS_ASSIGN_OR_RETURN(c.attention_bias, get_bool_or(t, "attention_bias", f, false));
  BS_ASSIGN_OR_RETURN(c.mlp_bias, get_bool_or(t, "mlp_bias", f, false));
  BS_ASSIGN_OR_RETURN(c.hidden_act, get_string_or(t, "hidden_act", f, "silu"));

  const json& ids = has_field(t, "eos_token_id") || has_field(t, "bos_token_id") ? t : j;
  const std::string& ids_file = &ids == &t ? f : file;
  BS_ASSIGN_OR_RETURN(c.bos_token_id, get_int_or(ids, "bos_token_id", ids_file, -1));
  BS_ASSIGN_OR_RETURN(c.eos_token_ids,
                      get_int_list_or_empty(ids, "eos_token_id", ids_file, /*allow_scalar=*/true));

  BS_ASSIGN_OR_RETURN(bool use_sliding, get_bool_or(t, "use_sliding_window", f, true));
  if (has_field(t, "sliding_window") && use_sliding) {
    BS_ASSIGN_OR_RETURN(int64_t w, get_positive_int(t, "sliding_window", f));
    c.sliding_window = w;
  }
  BS_ASSIGN_OR_RETURN(c.layer_types, get_string_list_or_empty(t, "layer_types", f));
  if (!c.layer_types.empty()) {
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_layers) {
      return InvalidArgument("{}: field 'layer_types' has {} entries, num_hidden_layers is {}", f,
                             c.layer_types.size(), c.num_layers);
    }
  } else {
    c.layer_types.assign(c.num_layers, "full_attention");
    // Mistral applies its sliding_window (e.g. 4096 in Mistral-7B-v0.1) in every layer and has
    // no use_sliding_window switch; Qwen2-style configs say use_sliding_window and from which
    // layer (max_window_layers).
    const bool mistral = c.model_type == "mistral" || c.architecture == "MistralForCausalLM";
    const bool explicit_sliding = (has_field(t, "use_sliding_window") || mistral) && use_sliding;
    if (explicit_sliding && c.sliding_window.has_value()) {
      BS_ASSIGN_OR_RETURN(int64_t mwl,
                          get_int_or(t, "max_window_layers", f, mistral ? 0 : c.num_layers));
      for (int64_t i = std::max<int64_t>(mwl, 0); i < c.num_layers; ++i) {
        c.layer_types[i] = "sliding_attention";
      }
    }
  }
  const bool any_sliding = std::find(c.layer_types.begin(), c.layer_types.end(),
                                     "sliding_attention") != c.layer_types.end();
  if (any_sliding && !c.sliding_window.has_value()) {
    return InvalidArgument("{}: layer_types has sliding_attention layers but no sliding_window", f);
  }
  return c;
}

Result<TransformerConfig> load_transformer_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  BS_ASSIGN_OR_RETURN(json j, read_json_file(path));
  BS_ASSIGN_OR_RETURN(TransformerConfig c, parse_transformer_config(j, path));

  const std::string gpath = (fs::path(dir) / "generation_config.json").string();
  std::error_code ec;
  if (!fs::exists(gpath, ec)) return c;
  BS_ASSIGN_OR_RETURN(json g, read_json_file(gpath));
  if (!g.is_object()) {
    return InvalidArgument("{}: expected a JSON object, got {}", gpath, json_type_name(g));
  }
  if (has_field(g, "bos_token_id")) {
    BS_ASSIGN_OR_RETURN(c.bos_token_id, get_int(g, "bos_token_id", gpath));
  }
  if (has_field(g, "eos_token_id")) {
    BS_ASSIGN_OR_RETURN(std::vector<int64_t> eos,
                        get_int_list(g, "eos_token_id", gpath, /*allow_scalar=*/true));
    for (int64_t id : c.eos_token_ids) {
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
    c.eos_token_ids = std::move(eos);
  }
  return c;
}

}  // namespace bs::io
