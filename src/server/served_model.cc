#include "server/served_model.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "models/registry.h"
#include "tokenizer/chat_template.h"

namespace bs::server {

Result<ServedModel> load_served_model(const ModelOptions& options) {
  ServedModel m;
  m.model_dir = options.model_dir;
  m.name = options.served_name.empty()
               ? std::filesystem::path(options.model_dir).lexically_normal().filename().string()
               : options.served_name;
  if (m.name.empty()) m.name = options.model_dir;
  BS_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::load(options.model_dir));
  BS_ASSIGN_OR_RETURN(m.backend, make_backend(options.device, options.threads));
  BS_ASSIGN_OR_RETURN(m.target, load_target(options.model_dir, *m.backend));
  if (!options.drafter_dir.empty()) {
    BS_ASSIGN_OR_RETURN(m.drafter, load_drafter(options.drafter_dir, *m.target,
                                                {.fp8_weights = options.drafter_fp8}));
    if (options.draft_tokens > m.drafter->max_drafts()) {
      return InvalidArgument("--draft-tokens {} exceeds the drafter's maximum {}",
                             options.draft_tokens, m.drafter->max_drafts());
    }
  }
  m.draft_tokens = options.draft_tokens;
  if (options.draft_confidence_min > 0 && (!m.drafter || !m.drafter->has_confidence())) {
    return InvalidArgument(
        "--draft-confidence-min needs a drafter with a confidence head (DSpark with "
        "enable_confidence_head)");
  }
  m.draft_confidence_min = options.draft_confidence_min;
  m.verify_budget = options.verify_budget;
  const int64_t window = m.target->config().max_position_embeddings;
  if (options.max_model_len < 0 || options.max_model_len > window) {
    return InvalidArgument("--max-model-len {} is outside [1, {}] (the model's context window)",
                           options.max_model_len, window);
  }
  m.max_model_len = options.max_model_len > 0 ? options.max_model_len : window;
  std::optional<ToolCallParser> parser;
  if (options.tool_call_parser != "auto") {
    parser = tool_call_parser_from_name(options.tool_call_parser);
    if (!parser) {
      return InvalidArgument("--tool-call-parser {} is not one of auto, hermes, llama3_json, none",
                             options.tool_call_parser);
    }
  }
  auto tmpl = ChatTemplate::load(options.model_dir);
  m.tool_call_parser = parser.value_or(tmpl.ok() ? default_tool_call_parser((*tmpl)->source())
                                                 : ToolCallParser::kNone);
  if (tmpl.ok()) {
    std::shared_ptr<const ChatTemplate> t = std::move(*tmpl);
    m.render_chat = [t](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& extra,
                        bool add_generation_prompt) {
      return t->render(messages, add_generation_prompt, extra);
    };
  } else if (tmpl.status().code() == StatusCode::kNotFound) {
    m.chat_unavailable = "model " + m.name + " has no chat template; use /v1/completions";
  } else {
    return tmpl.status();
  }
  return m;
}

}  // namespace bs::server
