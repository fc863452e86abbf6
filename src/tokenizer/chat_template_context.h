// The variables transformers' apply_chat_template passes to a chat template, as interpreter
// values: messages, tools and documents (None unless given), add_generation_prompt, bos_token,
// eos_token, then every member of `extra` (which may override any of them). Shared by
// ChatTemplate::render and the tests that render with a fixed clock. Json: nlohmann::json or
// nlohmann::ordered_json (which keeps the key order Python dicts have).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace bs {

template <typename Json>
std::vector<std::pair<std::string, jinja::Value>> chat_template_variables(
    const Json& messages, bool add_generation_prompt, const std::string& bos_token,
    const std::string& eos_token, const Json& extra) {
  std::vector<std::pair<std::string, jinja::Value>> vars = {
      {"messages", jinja::Value::from_json(messages)},
      {"tools", jinja::Value::none()},
      {"documents", jinja::Value::none()},
      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
      {"bos_token", jinja::Value(bos_token)},
      {"eos_token", jinja::Value(eos_token)},
  };
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    vars.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  }
  return vars;
}

}  // namespace bs
