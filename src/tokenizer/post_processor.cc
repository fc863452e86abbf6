#include "tokenizer/post_processor.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

Result<SpecialTokenFrame> parse_template(const Json& config, const JsonPath& at) {
  SpecialTokenFrame frame;
  frame.has_template = true;
  const Json* single = json_util::member(config, "single");
  if (single == nullptr || !single->is_array()) return at.child("single").error("must be an array");
  const Json* specials = json_util::member(config, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const JsonPath item_at = at.child("single").index(i);
    if (const Json* seq = json_util::member(item, "Sequence")) {
      BS_ASSIGN_OR_RETURN(std::string id,
                          json_util::require_string(*seq, "id", item_at.child("Sequence")));
      if (id != "A") return item_at.error("single-sequence template may only use sequence 'A'");
      seen_sequence = true;
      continue;
    }
    const Json* special = json_util::member(item, "SpecialToken");
    if (special == nullptr) return item_at.error("must hold \"Sequence\" or \"SpecialToken\"");
    BS_ASSIGN_OR_RETURN(std::string name,
                        json_util::require_string(*special, "id", item_at.child("SpecialToken")));
    const Json* entry = specials == nullptr ? nullptr : json_util::member(*specials, name);
    if (entry == nullptr) {
      return at.child("special_tokens").error(fmt::format("has no entry for '{}'", name));
    }
    const JsonPath entry_at = at.child("special_tokens").child(name);
    const Json* ids = json_util::member(*entry, "ids");
    if (ids == nullptr || !ids->is_array()) return entry_at.child("ids").error("must be an array");
    for (size_t k = 0; k < ids->size(); ++k) {
      BS_ASSIGN_OR_RETURN(int64_t id, json_util::as_int((*ids)[k], entry_at.child("ids").index(k)));
      if (id < 0 || id > INT32_MAX) return entry_at.child("ids").index(k).error("is out of range");
      (seen_sequence ? frame.suffix : frame.prefix).push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_sequence) return at.child("single").error("has no Sequence 'A'");
  return frame;
}

// BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id].
Result<SpecialTokenFrame> parse_cls_sep(const Json& config, const JsonPath& at) {
  SpecialTokenFrame frame;
  frame.has_template = true;
  for (const char* key : {"cls", "sep"}) {
    const Json* pair = json_util::member(config, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2) {
      return at.child(key).error("must be a [token, id] pair");
    }
    BS_ASSIGN_OR_RETURN(int64_t id, json_util::as_int((*pair)[1], at.child(key).index(1)));
    if (id < 0 || id > INT32_MAX) return at.child(key).index(1).error("is out of range");
    (key[0] == 'c' ? frame.prefix : frame.suffix).push_back(static_cast<int32_t>(id));
  }
  return frame;
}

}  // namespace

Result<SpecialTokenFrame> parse_post_processor(const Json& config, const JsonPath& at) {
  if (config.is_null()) return SpecialTokenFrame{};
  if (!config.is_object()) return at.error("must be an object or null");
  BS_ASSIGN_OR_RETURN(std::string type, json_util::require_string(config, "type", at));
  if (type == "TemplateProcessing") return parse_template(config, at);
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(config, at);
  if (type == "ByteLevel") return SpecialTokenFrame{};
  if (type == "Sequence") {
    const Json* list = json_util::member(config, "processors");
    if (list == nullptr || !list->is_array()) {
      return at.child("processors").error("must be an array");
    }
    // Each processor wraps the output of the previous one.
    SpecialTokenFrame frame;
    for (size_t i = 0; i < list->size(); ++i) {
      BS_ASSIGN_OR_RETURN(SpecialTokenFrame inner,
                          parse_post_processor((*list)[i], at.child("processors").index(i)));
      inner.prefix.insert(inner.prefix.end(), frame.prefix.begin(), frame.prefix.end());
      frame.prefix = std::move(inner.prefix);
      frame.suffix.insert(frame.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      frame.has_template = frame.has_template || inner.has_template;
    }
    return frame;
  }
  return Unimplemented("{}: post_processor type '{}' at '{}' is not supported", at.file, type,
                       at.path);
}

}  // namespace bs
