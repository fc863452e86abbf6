// OpenAI-compatible request parsing and error bodies (no HTTP, no engine): the pieces of the API
// that can be checked without a model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "server/request_json.h"

namespace bs::server {

// An error as the API reports it: HTTP status + {"error": {message, type, param, code}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string param;  // the offending request field, empty when none
  std::string code;   // e.g. "model_not_found", empty when none
};

// {"error": {"message", "type", "param", "code"}}; type follows the status (400
// invalid_request_error, 401 authentication_error, 404 not_found_error, 501
// not_implemented_error, else server_error).
nlohmann::json error_body(const ApiError& e);

// A /v1/completions or /v1/chat/completions request, validated.
// The most prompts x n choices one request may ask for (n itself is checked against it before
// any multiplication).
inline constexpr int kMaxChoices = 128;
// The largest max_tokens / max_completion_tokens accepted (generation ends at the context window
// anyway); keeps prompt + max_tokens far from integer overflow.
inline constexpr int64_t kMaxTokensLimit = (int64_t{1} << 31) - 1;

struct PromptInput {
  std::string text;          // the prompt as text, or
  std::vector<int32_t> ids;  // as token ids when is_ids
  bool is_ids = false;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;  // empty: not given
  // Completions: one or more prompts, each text or token ids.
  std::vector<PromptInput> prompts;
  // Choices per prompt (OpenAI's n); the response lists them prompt by prompt.
  int n = 1;
  // Chat: messages with content flattened to strings; template variables.
  nlohmann::ordered_json messages;  // key order kept (templates see it)
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;  // vLLM's field: the template's generation prompt
  // Chat: tools were given and tool_choice is not "none": tool calls are parsed from the reply.
  bool parse_tool_calls = false;
  std::optional<int64_t>
      max_tokens;  // max_completion_tokens, else max_tokens; > 0 (or 0 with echo)
  // Completions: the reply starts with the prompt (and its tokens' logprobs with logprobs).
  bool echo = false;
  SamplingParams sampling;
  std::vector<std::string> stop;
  // vLLM's extensions: generation does not end at the tokenizer's EOS ids (benchmark clients use
  // it for fixed output lengths); these ids end it too (the token is kept, as an EOS is).
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // More of vLLM's: the matched stop string ends the text with it (default: cut before it);
  // special tokens' text is kept in the reply (default: dropped); only the prompt's last N tokens
  // are fed (-1: as many as the context window takes, leaving one token of room).
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  std::optional<int64_t> truncate_prompt_tokens;
  bool stream = false;
  bool include_usage = false;
  // GenerateOptions::logprobs: -1 off, else the top alternatives per token. Completions:
  // logprobs: N; chat: logprobs: true with top_logprobs: N (default 0).
  int logprobs = -1;
};

// Parses `body` (JSON) into `out`; the first problem found as an ApiError (400) otherwise.
// Unknown fields are ignored; best_of other than n and echo in chat requests are refused, and so
// are tool_choice "required" or a named function (the output is not constrained to a call).
// The body is parsed by parse_request_json under `limits` (nesting depth, size).
std::optional<ApiError> parse_completion_request(const std::string& body, bool chat,
                                                 CompletionRequest* out,
                                                 const RequestLimits& limits = {});

// /tokenize, as vLLM's: {"prompt": "text", "add_special_tokens": true}, or the chat form
// {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false,
// "chat_template_kwargs": {...}, "tools": [...]} whose messages the chat template renders
// (normalised as for /v1/chat/completions).
struct TokenizeRequest {
  bool chat = false;
  std::string prompt;                      // text form
  nlohmann::ordered_json messages;         // chat form: as CompletionRequest's
  nlohmann::ordered_json template_kwargs;  // chat form
  bool add_generation_prompt = true;       // chat form
  bool add_special_tokens = true;          // default false in the chat form (vLLM's)
};
std::optional<ApiError> parse_tokenize_request(const std::string& body, TokenizeRequest* out,
                                               const RequestLimits& limits = {});
// /detokenize: {"tokens": [ids]}.
std::optional<ApiError> parse_detokenize_request(const std::string& body,
                                                 std::vector<int32_t>* tokens,
                                                 const RequestLimits& limits = {});

// Parses `body` as a JSON object under `limits` (parse_request_json); a 400 naming the problem
// (and the top-level field concerned, as param) otherwise.
std::optional<ApiError> parse_json_object(const std::string& body, nlohmann::json* out,
                                          const RequestLimits& limits = {});

}  // namespace bs::server
