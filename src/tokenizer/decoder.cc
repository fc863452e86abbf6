#include "tokenizer/decoder.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A position is a safe place to cut the text for clean-up when no clean-up pattern (all start
// with a space and are at most " n't" long, " ' " being the only one with a second space) can
// span it, whatever follows. It is unsafe when the text after the last space is a proper prefix
// of a pattern body, or could become one once a later " ' " is collapsed.
bool unsafe_cleanup_cut(std::string_view prefix) {
  const size_t space = prefix.rfind(' ');
  if (space == std::string_view::npos) return false;
  const std::string_view tail = prefix.substr(space + 1);
  return tail.empty() || tail == "n" || tail == "n'" || tail == "'" || tail == "'v" ||
         tail == "'r" || tail == "v" || tail == "r";
}

size_t safe_cleanup_cut(std::string_view text) {
  if (!unsafe_cleanup_cut(text)) return text.size();
  for (size_t s = text.rfind(' '); s != std::string_view::npos && s > 0;
       s = text.rfind(' ', s - 1)) {
    if (!unsafe_cleanup_cut(text.substr(0, s))) return s;
  }
  return 0;
}

void replace_all_in_place(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = s.find(from);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  for (; pos != std::string::npos; pos = s.find(from, prev)) {
    out.append(s, prev, pos - prev).append(to);
    prev = pos + from.size();
  }
  out.append(s, prev);
  s.swap(out);
}

}  // namespace

std::string clean_up_tokenization(std::string_view text) {
  std::string s(text);
  if (s.find(' ') == std::string::npos) return s;
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) replace_all_in_place(s, from, to);
  return s;
}

Status DecoderSpec::parse_into(const Json& config, const JsonPath& at, DecoderSpec& spec) {
  if (!config.is_object()) return at.error("must be an object or null");
  BS_ASSIGN_OR_RETURN(std::string type, json_util::require_string(config, "type", at));
  if (type == "Sequence") {
    const Json* list = json_util::member(config, "decoders");
    if (list == nullptr || !list->is_array()) return at.child("decoders").error("must be an array");
    for (size_t i = 0; i < list->size(); ++i) {
      BS_RETURN_IF_ERROR(parse_into((*list)[i], at.child("decoders").index(i), spec));
    }
  } else if (type == "Replace") {
    Step step{Kind::kReplace, {}, {}};
    BS_ASSIGN_OR_RETURN(step.pattern, Pattern::from_json(config, at));
    BS_ASSIGN_OR_RETURN(step.content, json_util::get_string(config, "content", at, ""));
    spec.steps_.push_back(std::move(step));
  } else if (type == "ByteFallback") {
    spec.steps_.push_back(Step{Kind::kByteFallback, {}, {}});
  } else if (type == "ByteLevel") {
    spec.steps_.push_back(Step{Kind::kByteLevel, {}, {}});
  } else if (type == "Fuse") {
    // Pieces are always concatenated.
  } else if (type == "Strip") {
    BS_ASSIGN_OR_RETURN(spec.strip_content_, json_util::get_string(config, "content", at, " "));
    BS_ASSIGN_OR_RETURN(int64_t start, json_util::get_int(config, "start", at, 0));
    BS_ASSIGN_OR_RETURN(int64_t stop, json_util::get_int(config, "stop", at, 0));
    if (start < 0 || stop < 0 || start > 1 << 20 || stop > 1 << 20) {
      return at.error("start / stop must be small non-negative integers");
    }
    spec.strip_start_ = static_cast<int>(start);
    spec.strip_stop_ = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    BS_ASSIGN_OR_RETURN(std::string replacement,
                        json_util::get_string(config, "replacement", at, "▁"));
    BS_ASSIGN_OR_RETURN(bool add_prefix_space,
                        json_util::get_bool(config, "add_prefix_space", at, true));
    BS_ASSIGN_OR_RETURN(
        std::string scheme,
        json_util::get_string(config, "prepend_scheme", at, add_prefix_space ? "always" : "never"));
    Json pattern = {{"pattern", {{"String", replacement}}}};
    Step step{Kind::kReplace, {}, " "};
    BS_ASSIGN_OR_RETURN(step.pattern, Pattern::from_json(pattern, at));
    spec.steps_.push_back(std::move(step));
    if (scheme != "never") {
      spec.strip_content_ = " ";
      spec.strip_start_ = 1;
    }
  } else {
    return Unimplemented("{}: decoder type '{}' at '{}' is not supported", at.file, type, at.path);
  }
  return Status::Ok();
}

Result<DecoderSpec> DecoderSpec::from_json(const Json& config, const JsonPath& at) {
  DecoderSpec spec;
  if (config.is_null()) {
    spec.join_with_space_ = true;
    return spec;
  }
  BS_RETURN_IF_ERROR(parse_into(config, at, spec));
  return spec;
}

DecodePiece DecoderSpec::make_piece(std::string_view token, bool added_token) const {
  DecodePiece p{std::string(token), false};
  for (const Step& step : steps_) {
    if (p.bytes) break;  // later steps act on text only
    switch (step.kind) {
      case Kind::kReplace:
        p.data = step.pattern.replace_all(p.data, step.content);
        break;
      case Kind::kByteFallback:
        if (p.data.size() == 6 && p.data.compare(0, 3, "<0x") == 0 && p.data[5] == '>' &&
            hex_value(p.data[3]) >= 0 && hex_value(p.data[4]) >= 0) {
          p.data =
              std::string(1, static_cast<char>(hex_value(p.data[3]) * 16 + hex_value(p.data[4])));
          p.bytes = true;
        }
        break;
      case Kind::kByteLevel: {
        if (added_token) break;  // added tokens decode to their content
        std::string bytes;
        bytes.reserve(p.data.size());
        size_t pos = 0;
        bool mapped = true;
        while (pos < p.data.size() && mapped) {
          const int b = unicode::code_point_to_byte(unicode::next_code_point(p.data, pos));
          mapped = b >= 0;
          bytes.push_back(static_cast<char>(b));
        }
        if (mapped) p.data = std::move(bytes);  // else the token's own bytes, as HF does
        p.bytes = true;
        break;
      }
    }
  }
  return p;
}

DecodeState::DecodeState(const DecoderSpec& spec, bool clean_up_spaces)
    : spec_(&spec), clean_up_spaces_(clean_up_spaces), strip_left_remaining_(spec.strip_start()) {}

void DecodeState::push(const DecodePiece& piece, std::string& out) {
  scratch_.clear();
  if (spec_->join_with_space() && !first_piece_) {
    utf8_.finish(scratch_);
    scratch_.push_back(' ');
  }
  first_piece_ = false;
  if (piece.bytes) {
    utf8_.push(piece.data, scratch_);
  } else {
    utf8_.finish(scratch_);
    scratch_.append(piece.data);
  }
  emit(scratch_, out);
}

void DecodeState::finish(std::string& out) {
  scratch_.clear();
  utf8_.finish(scratch_);
  emit(scratch_, out);
  held_tail_.clear();  // Strip stop: trailing characters at the very end are removed
  if (clean_up_spaces_) {
    out.append(clean_up_tokenization(cleanup_pending_));
    cleanup_pending_.clear();
  }
}

void DecodeState::emit(std::string_view text, std::string& out) {
  if (text.empty()) return;
  emit_stripped(text, out);
}

void DecodeState::emit_stripped(std::string_view text, std::string& out) {
  const std::string& c = spec_->strip_content();
  if (c.empty()) {
    emit_cleaned(text, out);
    return;
  }
  while (strip_left_remaining_ > 0 && !text.empty()) {
    if (text.substr(0, c.size()) == c) {
      text.remove_prefix(c.size());
      --strip_left_remaining_;
    } else {
      strip_left_remaining_ = 0;
    }
  }
  if (spec_->strip_stop() == 0) {
    emit_cleaned(text, out);
    return;
  }
  std::string s = held_tail_;
  s.append(text);
  size_t end = s.size();
  for (int k = 0;
       k < spec_->strip_stop() && end >= c.size() && s.compare(end - c.size(), c.size(), c) == 0;
       ++k) {
    end -= c.size();
  }
  held_tail_ = s.substr(end);
  emit_cleaned(std::string_view(s).substr(0, end), out);
}

void DecodeState::emit_cleaned(std::string_view text, std::string& out) {
  if (!clean_up_spaces_) {
    out.append(text);
    return;
  }
  cleanup_pending_.append(text);
  const size_t cut = safe_cleanup_cut(cleanup_pending_);
  if (cut == 0) return;
  out.append(clean_up_tokenization(std::string_view(cleanup_pending_).substr(0, cut)));
  cleanup_pending_.erase(0, cut);
}

}  // namespace bs
