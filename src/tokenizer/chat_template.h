// Chat templates of Hugging Face models: the Jinja template a model ships in
// tokenizer_config.json ("chat_template") or chat_template.jinja, rendered for a list of
// OpenAI-style messages into the prompt text the model was trained on.
//
//   BS_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::load("models/qwen3"));
//   BS_ASSIGN_OR_RETURN(std::string text, tmpl->render(messages, /*add_generation_prompt=*/true));
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace bs {

class ChatTemplate {
 public:
  // The template of a model folder: chat_template.jinja when present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {"name", "template"} of which "default" is taken).
  // bos_token / eos_token come from tokenizer_config.json. NotFound when the model has none.
  static Result<std::unique_ptr<ChatTemplate>> load(const std::string& model_dir);
  // Parses template source (InvalidArgument naming the line on a syntax error).
  static Result<std::unique_ptr<ChatTemplate>> parse(std::string_view source,
                                                     std::string bos_token = "",
                                                     std::string eos_token = "");
  ~ChatTemplate();

  // messages: a JSON array of OpenAI-style messages ({"role", "content", ...}); extra: further
  // template variables (e.g. "tools", "enable_thinking"). Ordered JSON, because templates see
  // objects in their key order (a tool schema through tojson, dict.items()), as Python keeps it.
  // Returns the prompt text, special tokens as text (encode it without adding BOS again).
  // InvalidArgument when the template raises (raise_exception) or fails on these inputs.
  Result<std::string> render(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // The template's source text (e.g. to tell which tool-call format it asks for).
  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
