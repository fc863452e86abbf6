// The model a server serves: tokenizer, backend, target, optional drafter and chat renderer,
// loaded once at start-up and then owned by the engine worker (models are not thread-safe; the
// tokenizer's const methods are, so handler threads tokenize).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/verify_budget.h"
#include "models/causal_lm.h"
#include "models/drafter.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace bs::server {

// Renders chat messages (normalised as openai.h parse_messages leaves them) and template variables
// into prompt text, with the generation prompt appended when asked; InvalidArgument when the
// template rejects them.
using ChatRenderer = std::function<Result<std::string>(const nlohmann::ordered_json& messages,
                                                       const nlohmann::ordered_json& extra,
                                                       bool add_generation_prompt)>;

struct ModelOptions {
  std::string model_dir;    // Hugging Face folder
  std::string drafter_dir;  // empty: plain decoding
  std::string served_name;  // empty: the model folder's name
  std::string device = "auto";
  int threads = 0;
  int64_t max_model_len = 0;        // 0: the model's max_position_embeddings
  int64_t draft_tokens = 0;         // 0: the drafter's maximum
  double draft_confidence_min = 0;  // GenerateOptions::draft_confidence_min (DSpark)
  VerifyBudget verify_budget = VerifyBudget::kOff;  // GenerateOptions::verify_budget
  bool drafter_fp8 = false;                         // DrafterOptions::fp8_weights
  // "hermes", "llama3_json", "none", or "auto": hermes when the chat template mentions
  // <tool_call>, else none.
  std::string tool_call_parser = "auto";
};

struct ServedModel {
  std::string name;
  std::string model_dir;
  int64_t max_model_len = 0;  // context window in tokens (prompt + generated)
  int64_t draft_tokens = 0;
  double draft_confidence_min = 0;
  VerifyBudget verify_budget = VerifyBudget::kOff;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;  // declared before the models that use it
  std::unique_ptr<CausalLM> target;
  std::unique_ptr<Drafter> drafter;  // null: plain decoding
  ChatRenderer render_chat;          // empty: chat_unavailable says why
  std::string chat_unavailable;
  int chat_unavailable_status = 400;  // HTTP status of that answer
  // How chat replies to requests with tools are read for tool calls.
  ToolCallParser tool_call_parser = ToolCallParser::kNone;
};

// Loads everything named by `options` (errors name the folder and the problem), with the model's
// chat template as render_chat when it ships one (chat_unavailable says so when it does not; a
// malformed template fails the load).
Result<ServedModel> load_served_model(const ModelOptions& options);

}  // namespace bs::server
