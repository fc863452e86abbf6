#include "tokenizer/normalizer.h"

#include "tokenizer/unicode.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

std::string strip_whitespace(std::string_view text, bool left, bool right) {
  size_t b = 0, e = text.size();
  if (left) {
    while (b < e) {
      size_t next = b;
      if (!unicode::is_whitespace(unicode::next_code_point(text, next))) break;
      b = next;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t next = start;
      if (!unicode::is_whitespace(unicode::next_code_point(text, next))) break;
      e = start;
    }
  }
  return std::string(text.substr(b, e - b));
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t cp = unicode::next_code_point(text, pos);
    if (!unicode::is_nonspacing_mark(cp)) out.append(text.substr(start, pos - start));
  }
  return out;
}

}  // namespace

Status Normalizer::parse_into(const Json& config, const JsonPath& at, std::vector<Step>& steps) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object()) return at.error("must be an object or null");
  BS_ASSIGN_OR_RETURN(std::string type, json_util::require_string(config, "type", at));
  Step step;
  if (type == "Sequence") {
    const Json* list = json_util::member(config, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return at.child("normalizers").error("must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      BS_RETURN_IF_ERROR(parse_into((*list)[i], at.child("normalizers").index(i), steps));
    }
    return Status::Ok();
  } else if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "StripAccents") {
    step.kind = Kind::kStripAccents;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    BS_ASSIGN_OR_RETURN(step.left, json_util::get_bool(config, "strip_left", at, true));
    BS_ASSIGN_OR_RETURN(step.right, json_util::get_bool(config, "strip_right", at, true));
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    BS_ASSIGN_OR_RETURN(step.text, json_util::require_string(config, "prepend", at));
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    BS_ASSIGN_OR_RETURN(step.pattern, Pattern::from_json(config, at));
    BS_ASSIGN_OR_RETURN(step.text, json_util::get_string(config, "content", at, ""));
  } else {
    return Unimplemented("{}: normalizer type '{}' at '{}' is not supported", at.file, type,
                         at.path);
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Result<Normalizer> Normalizer::from_json(const Json& config, const JsonPath& at) {
  Normalizer n;
  BS_RETURN_IF_ERROR(parse_into(config, at, n.steps_));
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    if (s.empty()) break;  // every step maps "" to "" (Prepend included, as in HF tokenizers)
    switch (step.kind) {
      case Kind::kNfc:
        s = unicode::normalize(s, unicode::NormalForm::kNfc);
        break;
      case Kind::kNfd:
        s = unicode::normalize(s, unicode::NormalForm::kNfd);
        break;
      case Kind::kNfkc:
        s = unicode::normalize(s, unicode::NormalForm::kNfkc);
        break;
      case Kind::kNfkd:
        s = unicode::normalize(s, unicode::NormalForm::kNfkd);
        break;
      case Kind::kLowercase:
        s = unicode::to_lower(s);
        break;
      case Kind::kStrip:
        s = strip_whitespace(s, step.left, step.right);
        break;
      case Kind::kStripAccents:
        s = strip_accents(s);
        break;
      case Kind::kPrepend:
        s = step.text + s;
        break;
      case Kind::kReplace:
        s = step.pattern.replace_all(s, step.text);
        break;
    }
  }
  return s;
}

}  // namespace bs
