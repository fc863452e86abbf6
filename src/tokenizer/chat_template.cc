#include "tokenizer/chat_template.h"

#include "tokenizer/chat_template_context.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/json_util.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

struct ChatTemplate::Impl {
  std::unique_ptr<jinja::Template> tmpl;
  std::string bos_token, eos_token;
  std::string source;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::source() const { return impl_->source; }

namespace {

// bos_token / eos_token of tokenizer_config.json: a string, an AddedToken object, or absent.
Result<std::string> config_token(const Json& config, std::string_view key, const JsonPath& at) {
  const Json* j = json_util::member(config, key);
  if (j == nullptr) return std::string();
  if (j->is_string()) return j->get<std::string>();
  if (j->is_object()) return json_util::require_string(*j, "content", at.child(key));
  return at.child(key).error("must be a string or an object with \"content\"");
}

// tokenizer_config.json "chat_template": a string, or a list of {"name", "template"}.
Result<std::string> config_template(const Json& t, const JsonPath& at) {
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) return at.error("must be a string or a list of {\"name\", \"template\"}");
  for (size_t i = 0; i < t.size(); ++i) {
    BS_ASSIGN_OR_RETURN(std::string name, json_util::require_string(t[i], "name", at.index(i)));
    if (name == "default") return json_util::require_string(t[i], "template", at.index(i));
  }
  return at.error("has no template named \"default\"");
}

}  // namespace

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::load(const std::string& model_dir) {
  const std::string config_path = model_dir + "/tokenizer_config.json";
  Json config = Json::object();
  auto parsed = json_util::parse_json_file(config_path);
  if (parsed.ok()) {
    config = std::move(parsed).value();
    if (!config.is_object()) return InvalidArgument("{}: must hold a JSON object", config_path);
  } else if (parsed.status().code() != StatusCode::kNotFound) {
    return parsed.status();
  }
  const JsonPath root{config_path, ""};
  BS_ASSIGN_OR_RETURN(std::string bos, config_token(config, "bos_token", root));
  BS_ASSIGN_OR_RETURN(std::string eos, config_token(config, "eos_token", root));

  const std::string jinja_path = model_dir + "/chat_template.jinja";
  std::string source, source_name;
  auto file = json_util::read_file(jinja_path);
  if (file.ok()) {
    source = std::move(file).value();
    source_name = jinja_path;
  } else if (file.status().code() != StatusCode::kNotFound) {
    return file.status();
  } else if (const Json* t = json_util::member(config, "chat_template")) {
    BS_ASSIGN_OR_RETURN(source, config_template(*t, root.child("chat_template")));
    source_name = config_path + " (chat_template)";
  } else {
    return NotFound(
        "{}: the model has no chat template (no chat_template.jinja, and no \"chat_template\" in "
        "tokenizer_config.json)",
        model_dir);
  }
  auto tmpl = parse(source, std::move(bos), std::move(eos));
  if (!tmpl.ok()) return tmpl.status().with_context(source_name);
  return tmpl;
}

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::parse(std::string_view source,
                                                          std::string bos_token,
                                                          std::string eos_token) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->tmpl = jinja::parse(source);
  } catch (const jinja::Error& e) {
    return InvalidArgument("chat template syntax error, line {}: {}", e.line, e.what());
  }
  impl->source = std::string(source);
  impl->bos_token = std::move(bos_token);
  impl->eos_token = std::move(eos_token);
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) return InvalidArgument("chat template: messages must be a JSON array");
  if (!extra.is_object()) return InvalidArgument("chat template: extra must be a JSON object");
  const auto vars = chat_template_variables(messages, add_generation_prompt, impl_->bos_token,
                                            impl_->eos_token, extra);
  try {
    return jinja::render(*impl_->tmpl, vars);
  } catch (const jinja::Error& e) {
    return InvalidArgument("chat template error, line {}: {}", e.line, e.what());
  }
}

}  // namespace bs
