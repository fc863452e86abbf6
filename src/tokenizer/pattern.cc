#include "tokenizer/pattern.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

Result<Pattern> Pattern::from_json(const Json& config, const JsonPath& at) {
  const Json* pattern = json_util::member(config, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return at.child("pattern").error("must be an object with a \"String\" or \"Regex\" member");
  }
  Pattern out;
  if (const Json* s = json_util::member(*pattern, "String")) {
    BS_ASSIGN_OR_RETURN(out.literal_, json_util::as_string(*s, at.child("pattern.String")));
    return out;
  }
  if (const Json* r = json_util::member(*pattern, "Regex")) {
    BS_ASSIGN_OR_RETURN(std::string source, json_util::as_string(*r, at.child("pattern.Regex")));
    auto compiled = Regex::compile(source);
    if (!compiled.ok()) {
      return compiled.status().with_context(at.file + ": field '" + at.path + ".pattern.Regex'");
    }
    out.regex_ = std::make_shared<const Regex>(std::move(compiled).value());
    return out;
  }
  return at.child("pattern").error("must have a \"String\" or \"Regex\" member");
}

Result<Pattern> Pattern::from_regex(std::string_view source) {
  BS_ASSIGN_OR_RETURN(Regex regex, Regex::compile(source));
  Pattern out;
  out.regex_ = std::make_shared<const Regex>(std::move(regex));
  return out;
}

std::vector<Regex::Span> Pattern::find_all(std::string_view text) const {
  if (regex_) return regex_->find_all(text);
  std::vector<Regex::Span> spans;
  if (literal_.empty()) return spans;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    spans.emplace_back(pos, pos + literal_.size());
  }
  return spans;
}

std::string Pattern::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const auto& [b, e] : find_all(text)) {
    out.append(text.substr(prev, b - prev)).append(replacement);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace bs
