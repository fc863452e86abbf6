#include "server/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

namespace bs::server {

using json = nlohmann::json;

namespace {

ApiError bad(std::string param, std::string message) {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}

// The JSON type name as users know it.
std::string type_name(const json& v) { return v.type_name(); }

template <typename Json>
bool present(const Json& req, const char* key) {
  return req.contains(key) && !req.at(key).is_null();
}

// Reads req[key] into *out when present (not null); a 400 naming the field and `kind` when
// `is_kind` rejects its type.
template <typename Json, typename T, typename Pred>
std::optional<ApiError> get_field(const Json& req, const char* key, Pred is_kind, const char* kind,
                                  T* out) {
  if (!present(req, key)) return std::nullopt;
  const Json& v = req.at(key);
  if (!is_kind(v)) return bad(key, fmt::format("{} must be {}, got {}", key, kind, v.type_name()));
  *out = v.template get<T>();
  return std::nullopt;
}

std::optional<ApiError> get_number(const json& req, const char* key, double* out) {
  return get_field(
      req, key, [](const json& v) { return v.is_number(); }, "a number", out);
}

// An integer in int64 range (JSON integers up to 2^64 - 1 parse as unsigned: beyond int64 they
// are refused here, before any arithmetic).
std::optional<ApiError> get_integer(const json& req, const char* key, int64_t* out) {
  if (present(req, key) && req.at(key).is_number_unsigned() &&
      req.at(key).get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return bad(key, fmt::format("{} = {} is out of range (at most {})", key,
                                req.at(key).get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  }
  return get_field(
      req, key, [](const json& v) { return v.is_number_integer(); }, "an integer", out);
}

template <typename Json>
std::optional<ApiError> get_bool(const Json& req, const char* key, bool* out) {
  return get_field(
      req, key, [](const Json& v) { return v.is_boolean(); }, "a boolean", out);
}

// A list of token ids: integers in int32 range (vocab range is the engine's check).
std::optional<ApiError> get_ids(const json& v, const char* param, std::vector<int32_t>* out) {
  for (const json& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return bad(param,
                 fmt::format("{} must hold non-negative token ids, got {}", param, id.dump()));
    }
    out->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

// One prompt: "text" or [ids...].
std::optional<ApiError> parse_one_prompt(const json& p, PromptInput* out) {
  if (p.is_string()) {
    out->text = p.get<std::string>();
    if (out->text.empty()) return bad("prompt", "prompt is empty");
    return std::nullopt;
  }
  if (p.is_array()) {
    if (p.empty()) return bad("prompt", "prompt is empty");
    out->is_ids = true;
    return get_ids(p, "prompt", &out->ids);
  }
  return bad("prompt",
             fmt::format("prompt must be a string or a list of token ids, got {}", type_name(p)));
}

// prompt: "text", [ids...], or a list of those (["text", ...], [[ids...], ...]): one group of n
// choices per prompt.
std::optional<ApiError> parse_prompt(const json& req, CompletionRequest* out) {
  if (!present(req, "prompt")) return bad("prompt", "prompt is required");
  const json& p = req.at("prompt");
  const bool several = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
  for (const json& one : several ? p : json::array({p})) {
    if (auto e = parse_one_prompt(one, &out->prompts.emplace_back())) return e;
  }
  return std::nullopt;
}

// tool_choice: "auto" (default) or "none" (the reply stays text). "required" and a named function
// need output constrained to a call, which the server does not do: refused.
std::optional<ApiError> parse_tool_choice(const nlohmann::ordered_json& req,
                                          CompletionRequest* out) {
  if (!present(req, "tool_choice")) return std::nullopt;
  const auto& c = req.at("tool_choice");
  if (c == "auto") return std::nullopt;
  if (c == "none") {
    out->parse_tool_calls = false;
    return std::nullopt;
  }
  if (c == "required" || c.is_object()) {
    return bad("tool_choice",
               fmt::format("tool_choice {} is not supported: output is not constrained to a tool "
                           "call; use \"auto\" or \"none\"",
                           c.is_object() ? "naming a function" : "\"required\""));
  }
  return bad("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or an object");
}

// A message's content as the template sees it (vLLM's "string" content format): a string as is,
// null or absent as "", a list of {"type": "text", "text"} parts joined with newlines.
std::optional<ApiError> normalize_content(const nlohmann::ordered_json& m, size_t i,
                                          nlohmann::ordered_json* out) {
  if (!m.contains("content") || m.at("content").is_null()) {
    *out = "";
    return std::nullopt;
  }
  const auto& c = m.at("content");
  if (c.is_string()) {
    *out = c;
    return std::nullopt;
  }
  if (!c.is_array()) {
    return bad("messages", fmt::format("messages[{}].content must be a string, null or a list of "
                                       "text parts, got {}",
                                       i, c.type_name()));
  }
  std::string text;
  for (size_t k = 0; k < c.size(); ++k) {
    const auto& part = c[k];
    if (!part.is_object() || !part.contains("text") || !part.at("text").is_string() ||
        (part.contains("type") && part.at("type") != "text")) {
      return bad("messages", fmt::format("messages[{}].content[{}]: only {{\"type\": \"text\", "
                                         "\"text\": ...}} parts are supported",
                                         i, k));
    }
    if (k > 0) text += '\n';
    text += part.at("text").get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

// An assistant message's tool_calls as templates expect them (vLLM, following transformers):
// each function's arguments, a JSON string on the wire, parsed into the value it encodes (kept
// as the string when it is not valid JSON; null or "" become {}).
std::optional<ApiError> normalize_tool_calls(size_t i, nlohmann::ordered_json* calls) {
  if (!calls->is_array()) {
    return bad("messages", fmt::format("messages[{}].tool_calls must be a list", i));
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    auto& call = (*calls)[k];
    if (!call.is_object() || !call.contains("function") || !call.at("function").is_object() ||
        !call.at("function").contains("name") || !call.at("function").at("name").is_string()) {
      return bad("messages", fmt::format("messages[{}].tool_calls[{}] must be {{\"type\": "
                                         "\"function\", \"function\": {{\"name\", "
                                         "\"arguments\"}}}}",
                                         i, k));
    }
    auto& fn = call.at("function");
    if (!fn.contains("arguments") || fn.at("arguments").is_null() || fn.at("arguments") == "") {
      fn["arguments"] = nlohmann::ordered_json::object();
    } else if (fn.at("arguments").is_string()) {
      // Under the request limits: a string argument may hold a deeply nested document.
      const std::string& text = fn.at("arguments").get_ref<const std::string&>();
      auto parsed = parse_request_json_ordered(text, {.max_bytes = text.size()});
      if (parsed.ok()) fn["arguments"] = std::move(*parsed);
    }
  }
  return std::nullopt;
}

// messages: [{role, content, ...}], normalised as vLLM does before rendering (templates index and
// test these fields): content a string (normalize_content), an assistant's tool_calls with
// parsed arguments (normalize_tool_calls; null tool_calls dropped), other fields (tool_call_id,
// name, reasoning_content, ...) passed through.
// `req` is ordered JSON: templates see objects in the request's key order (tojson of a tool
// schema, dict.items()), as transformers' Python dicts keep it.
std::optional<ApiError> parse_messages(const nlohmann::ordered_json& req, CompletionRequest* out) {
  using json = nlohmann::ordered_json;
  if (!present(req, "messages")) return bad("messages", "messages is required");
  const json& msgs = req.at("messages");
  if (!msgs.is_array() || msgs.empty()) {
    return bad("messages", "messages must be a non-empty list of {role, content} objects");
  }
  out->messages = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
      return bad("messages", fmt::format("messages[{}] must be an object with a string role", i));
    }
    json msg = m;
    if (auto e = normalize_content(m, i, &msg["content"])) return e;
    if (msg.contains("tool_calls")) {
      if (msg.at("tool_calls").is_null()) {
        msg.erase("tool_calls");
      } else if (auto e = normalize_tool_calls(i, &msg.at("tool_calls"))) {
        return e;
      }
    }
    out->messages.push_back(std::move(msg));
  }
  if (auto e = get_bool(req, "add_generation_prompt", &out->add_generation_prompt)) return e;
  if (present(req, "continue_final_message") && req.at("continue_final_message") != false) {
    return bad("continue_final_message", "continue_final_message is not supported");
  }
  if (present(req, "chat_template_kwargs")) {
    if (!req.at("chat_template_kwargs").is_object()) {
      return bad("chat_template_kwargs", "chat_template_kwargs must be an object");
    }
    out->template_kwargs = req.at("chat_template_kwargs");
  }
  // Tool definitions go to the template as `tools` (as transformers' apply_chat_template passes
  // them); the server's tool-call parser reads calls out of the reply (tool_calls.h).
  if (present(req, "tools")) {
    if (!req.at("tools").is_array()) return bad("tools", "tools must be a list");
    out->template_kwargs["tools"] = req.at("tools");
    out->parse_tool_calls = !req.at("tools").empty();
  }
  return parse_tool_choice(req, out);
}

std::optional<ApiError> parse_stop(const json& req, CompletionRequest* out) {
  if (!present(req, "stop")) return std::nullopt;
  const json& s = req.at("stop");
  if (s.is_string()) {
    out->stop.push_back(s.get<std::string>());
    return std::nullopt;
  }
  if (s.is_array()) {
    for (const json& v : s) {
      if (!v.is_string()) return bad("stop", "stop must be a string or a list of strings");
      out->stop.push_back(v.get<std::string>());
    }
    return std::nullopt;
  }
  return bad("stop",
             fmt::format("stop must be a string or a list of strings, got {}", type_name(s)));
}

// n: choices per prompt (n x prompts in 1..kMaxChoices); best_of (the likeliest of more samples)
// only where it changes nothing: absent, null or n.
std::optional<ApiError> parse_choices(const json& req, CompletionRequest* out) {
  int64_t n = 1;
  if (present(req, "n") && !req.at("n").is_null()) {
    if (auto e = get_integer(req, "n", &n)) return e;
  }
  const int64_t prompts = std::max<int64_t>(1, static_cast<int64_t>(out->prompts.size()));
  // n alone first: n x prompts of an unchecked n can overflow.
  if (n < 1 || n > kMaxChoices || prompts > kMaxChoices || n * prompts > kMaxChoices) {
    return bad("n", fmt::format("n must be at least 1 and n x prompts at most {}, got n = {} with "
                                "{} prompt(s)",
                                kMaxChoices, n, prompts));
  }
  out->n = static_cast<int>(n);
  if (present(req, "best_of") && !req.at("best_of").is_null()) {
    int64_t best_of = 0;
    if (auto e = get_integer(req, "best_of", &best_of)) return e;
    if (best_of != n) {
      return bad("best_of",
                 fmt::format("best_of = {} is not supported: only best_of = n", best_of));
    }
  }
  return std::nullopt;
}

// Fields that would change the output but are not implemented: refused unless they hold their
// neutral value (clients often send those), rather than silently ignored.
std::optional<ApiError> refuse_unsupported(const json& req) {
  if (present(req, "response_format") && !req.at("response_format").is_null()) {
    const json& f = req.at("response_format");
    if (!f.is_object() || f.value("type", "") != "text") {
      return bad("response_format",
                 "response_format is not supported (only {\"type\": \"text\"}): output is not "
                 "constrained");
    }
  }
  return std::nullopt;
}

// An integer field in [0, kMaxTopLogprobs] into *out.
std::optional<ApiError> get_top_count(const json& req, const char* key, int* out) {
  int64_t n = 0;
  if (auto e = get_integer(req, key, &n)) return e;
  if (n < 0 || n > kMaxTopLogprobs) {
    return bad(key, fmt::format("{} must be in [0, {}], got {}", key, kMaxTopLogprobs, n));
  }
  *out = static_cast<int>(n);
  return std::nullopt;
}

// Completions: logprobs: N (0..20; null or false: off). Chat: logprobs: true|false and
// top_logprobs: N (0..20), which needs logprobs: true.
std::optional<ApiError> parse_logprobs(const json& req, bool chat, CompletionRequest* out) {
  if (!chat) {
    if (!present(req, "logprobs") || req.at("logprobs") == json(false)) return std::nullopt;
    if (!req.at("logprobs").is_number_integer()) {
      return bad("logprobs", fmt::format("logprobs must be an integer in [0, {}], got {}",
                                         kMaxTopLogprobs, type_name(req.at("logprobs"))));
    }
    return get_top_count(req, "logprobs", &out->logprobs);
  }
  bool logprobs = false;
  if (auto e = get_bool(req, "logprobs", &logprobs)) return e;
  int top = 0;
  if (auto e = get_top_count(req, "top_logprobs", &top)) return e;
  if (present(req, "top_logprobs") && !logprobs) {
    return bad("top_logprobs", "top_logprobs requires logprobs: true");
  }
  if (logprobs) out->logprobs = top;
  return std::nullopt;
}

// presence_penalty, frequency_penalty (OpenAI), repetition_penalty, min_tokens (vLLM) and
// logit_bias (OpenAI: {"token id": bias}; null or {} is none). Ranges: SamplingParams::validate.
std::optional<ApiError> parse_logit_processing(const json& req, SamplingParams* out) {
  double presence = 0.0, frequency = 0.0, repetition = 1.0;
  int64_t min_tokens = 0;
  if (auto e = get_number(req, "presence_penalty", &presence)) return e;
  if (auto e = get_number(req, "frequency_penalty", &frequency)) return e;
  if (auto e = get_number(req, "repetition_penalty", &repetition)) return e;
  if (auto e = get_integer(req, "min_tokens", &min_tokens)) return e;
  out->presence_penalty = static_cast<float>(presence);
  out->frequency_penalty = static_cast<float>(frequency);
  out->repetition_penalty = static_cast<float>(repetition);
  out->min_tokens = min_tokens;
  if (!present(req, "logit_bias") || req.at("logit_bias").is_null()) return std::nullopt;
  const json& bias = req.at("logit_bias");
  if (!bias.is_object()) {
    return bad("logit_bias",
               fmt::format("logit_bias must be an object {{\"token id\": bias}}, got {}",
                           type_name(bias)));
  }
  for (const auto& [key, value] : bias.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return bad(
          "logit_bias",
          fmt::format("logit_bias keys must be token ids (non-negative integers), got '{}'", key));
    }
    if (!value.is_number()) {
      return bad("logit_bias", fmt::format("logit_bias value of token {} must be a number, got {}",
                                           id, type_name(value)));
    }
    out->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(const json& req, CompletionRequest* out) {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  int64_t top_k = 0, seed = 0;
  if (auto e = get_number(req, "temperature", &temperature)) return e;
  if (auto e = get_number(req, "top_p", &top_p)) return e;
  if (auto e = get_number(req, "min_p", &min_p)) return e;
  if (auto e = get_integer(req, "top_k", &top_k)) return e;
  if (top_k == -1) top_k = 0;  // vLLM's "off"
  if (top_k < 0 || top_k > std::numeric_limits<int>::max()) {
    return bad("top_k", fmt::format("top_k must be -1, 0 (off) or positive, got {}", top_k));
  }
  // Sampling runs in float: a double beyond float range would become inf.
  for (const auto& [key, v] :
       {std::pair{"temperature", temperature}, {"top_p", top_p}, {"min_p", min_p}}) {
    if (!std::isfinite(static_cast<float>(v))) {
      return bad(key, fmt::format("{} = {} is out of range", key, v));
    }
  }
  out->sampling.temperature = static_cast<float>(temperature);
  out->sampling.top_p = static_cast<float>(top_p);
  out->sampling.min_p = static_cast<float>(min_p);
  out->sampling.top_k = static_cast<int>(top_k);
  if (auto e = parse_logit_processing(req, &out->sampling)) return e;
  if (present(req, "seed")) {  // any int64 (negative ones as their two's complement bits)
    if (auto e = get_integer(req, "seed", &seed)) return e;
    out->sampling.seed = static_cast<uint64_t>(seed);
  }
  if (Status s = out->sampling.validate(); !s.ok()) {
    // The message starts with the field's name.
    return bad(s.message().substr(0, s.message().find(' ')), s.message());
  }
  return std::nullopt;
}

}  // namespace

json error_body(const ApiError& e) {
  const char* type = e.http_status == 400 || e.http_status == 413 ? "invalid_request_error"
                     : e.http_status == 401                       ? "authentication_error"
                     : e.http_status == 404                       ? "not_found_error"
                     : e.http_status == 501                       ? "not_implemented_error"
                                                                  : "server_error";
  return {{"error",
           {{"message", e.message},
            {"type", type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::optional<ApiError> parse_json_object(const std::string& body, json* out,
                                          const RequestLimits& limits) {
  std::string field;
  auto parsed = parse_request_json(body, limits, &field);
  if (!parsed.ok()) return bad(field, parsed.status().message());
  *out = std::move(*parsed);
  if (!out->is_object()) {
    return bad("", fmt::format("request body must be a JSON object, got {}", type_name(*out)));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const std::string& body, bool chat,
                                                 CompletionRequest* out,
                                                 const RequestLimits& limits) {
  json req;
  if (auto e = parse_json_object(body, &req, limits)) return e;
  out->chat = chat;
  if (present(req, "model")) {
    if (!req.at("model").is_string()) return bad("model", "model must be a string");
    out->model = req.at("model").get<std::string>();
  }
  if (chat) {
    // Parsed again in key order (the body is valid JSON within the limits: parsed above).
    auto ordered = parse_request_json_ordered(body, limits);
    if (!ordered.ok()) return bad("", ordered.status().message());
    if (auto e = parse_messages(*ordered, out)) return e;
  } else if (auto e = parse_prompt(req, out)) {
    return e;
  }
  if (auto e = parse_choices(req, out)) return e;
  if (auto e = refuse_unsupported(req)) return e;
  if (auto e = get_bool(req, "echo", &out->echo)) return e;
  if (chat && out->echo) return bad("echo", "echo is only supported by /v1/completions");
  if (auto e = parse_logprobs(req, chat, out)) return e;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    int64_t n = 0;
    if (!present(req, key)) continue;
    if (auto e = get_integer(req, key, &n)) return e;
    if (n < 0 || (n == 0 && !out->echo)) {
      return bad(key, fmt::format("{} must be at least 1 (0 only with echo), got {}", key, n));
    }
    if (n > kMaxTokensLimit) {
      return bad(key, fmt::format("{} = {} is out of range (at most {})", key, n, kMaxTokensLimit));
    }
    out->max_tokens = n;  // max_completion_tokens (second) wins
  }
  if (auto e = parse_sampling(req, out)) return e;
  if (auto e = parse_stop(req, out)) return e;
  if (auto e = get_bool(req, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = get_bool(req, "include_stop_str_in_output", &out->include_stop_str_in_output)) {
    return e;
  }
  if (auto e = get_bool(req, "skip_special_tokens", &out->skip_special_tokens)) return e;
  if (present(req, "truncate_prompt_tokens")) {
    int64_t n = 0;
    if (auto e = get_integer(req, "truncate_prompt_tokens", &n)) return e;
    if (n < 1 && n != -1) {
      return bad("truncate_prompt_tokens",
                 fmt::format("truncate_prompt_tokens must be -1 or at least 1, got {}", n));
    }
    out->truncate_prompt_tokens = n;
  }
  if (present(req, "stop_token_ids") && !req.at("stop_token_ids").is_null()) {
    if (!req.at("stop_token_ids").is_array()) {
      return bad("stop_token_ids", "stop_token_ids must be a list of token ids");
    }
    if (auto e = get_ids(req.at("stop_token_ids"), "stop_token_ids", &out->stop_token_ids)) {
      return e;
    }
  }
  if (auto e = get_bool(req, "stream", &out->stream)) return e;
  if (present(req, "stream_options")) {
    const json& so = req.at("stream_options");
    if (!so.is_object()) return bad("stream_options", "stream_options must be an object");
    if (auto e = get_bool(so, "include_usage", &out->include_usage)) return e;
  }
  return std::nullopt;
}

}  // namespace bs::server

namespace bs::server {

std::optional<ApiError> parse_tokenize_request(const std::string& body, TokenizeRequest* out,
                                               const RequestLimits& limits) {
  json req;
  if (auto e = parse_json_object(body, &req, limits)) return e;
  if (present(req, "messages")) {
    CompletionRequest chat;
    auto ordered = parse_request_json_ordered(body, limits);
    if (!ordered.ok()) return bad("", ordered.status().message());
    if (auto e = parse_messages(*ordered, &chat)) return e;
    out->chat = true;
    out->messages = std::move(chat.messages);
    out->template_kwargs = std::move(chat.template_kwargs);
    out->add_generation_prompt = chat.add_generation_prompt;
    out->add_special_tokens = false;
  } else if (!present(req, "prompt") || !req.at("prompt").is_string()) {
    return bad("prompt", "prompt (a string) is required, or messages (a list of chat messages)");
  } else {
    out->prompt = req.at("prompt").get<std::string>();
  }
  return get_bool(req, "add_special_tokens", &out->add_special_tokens);
}

std::optional<ApiError> parse_detokenize_request(const std::string& body,
                                                 std::vector<int32_t>* tokens,
                                                 const RequestLimits& limits) {
  json req;
  if (auto e = parse_json_object(body, &req, limits)) return e;
  if (!present(req, "tokens") || !req.at("tokens").is_array()) {
    return bad("tokens", "tokens (a list of token ids) is required");
  }
  return get_ids(req.at("tokens"), "tokens", tokens);
}

}  // namespace bs::server
