#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex = true).
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string byte_level_map(std::string_view piece) {
  std::string out;
  out.reserve(piece.size() * 2);
  for (char c : piece) unicode::append_utf8(out, unicode::byte_to_code_point(c));
  return out;
}

}  // namespace

Status PreTokenizer::parse_into(const Json& config, const JsonPath& at, std::vector<Step>& steps) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object()) return at.error("must be an object or null");
  BS_ASSIGN_OR_RETURN(std::string type, json_util::require_string(config, "type", at));
  Step step;
  auto internal_pattern = [&](std::string_view source) -> Status {
    auto p = Pattern::from_regex(source);
    if (!p.ok()) return p.status();
    step.pattern = std::move(p).value();
    step.has_pattern = true;
    return Status::Ok();
  };
  if (type == "Sequence") {
    const Json* list = json_util::member(config, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return at.child("pretokenizers").error("must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      BS_RETURN_IF_ERROR(parse_into((*list)[i], at.child("pretokenizers").index(i), steps));
    }
    return Status::Ok();
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    BS_ASSIGN_OR_RETURN(step.pattern, Pattern::from_json(config, at));
    step.has_pattern = true;
    BS_ASSIGN_OR_RETURN(step.invert, json_util::get_bool(config, "invert", at, false));
    BS_ASSIGN_OR_RETURN(std::string behavior,
                        json_util::get_string(config, "behavior", at, "Isolated"));
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      return at.child("behavior").error(fmt::format("has unknown value '{}'", behavior));
    }
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    BS_ASSIGN_OR_RETURN(step.add_prefix_space,
                        json_util::get_bool(config, "add_prefix_space", at, false));
    BS_ASSIGN_OR_RETURN(bool use_regex, json_util::get_bool(config, "use_regex", at, true));
    if (use_regex) BS_RETURN_IF_ERROR(internal_pattern(kGpt2Regex));
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    BS_ASSIGN_OR_RETURN(step.replacement, json_util::get_string(config, "replacement", at, "▁"));
    BS_ASSIGN_OR_RETURN(step.split, json_util::get_bool(config, "split", at, true));
    BS_ASSIGN_OR_RETURN(bool add_prefix_space,
                        json_util::get_bool(config, "add_prefix_space", at, true));
    BS_ASSIGN_OR_RETURN(
        std::string scheme,
        json_util::get_string(config, "prepend_scheme", at, add_prefix_space ? "always" : "never"));
    if (scheme == "always") {
      step.prepend = Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = Prepend::kNever;
    } else {
      return at.child("prepend_scheme").error(fmt::format("has unknown value '{}'", scheme));
    }
  } else if (type == "Digits") {
    step.kind = Kind::kSplit;
    BS_ASSIGN_OR_RETURN(bool individual,
                        json_util::get_bool(config, "individual_digits", at, false));
    BS_RETURN_IF_ERROR(internal_pattern(individual ? R"(\p{N})" : R"(\p{N}+)"));
  } else if (type == "Whitespace") {
    step.kind = Kind::kSplit;
    BS_RETURN_IF_ERROR(internal_pattern(R"(\w+|[^\w\s]+)"));
    step.behavior = Behavior::kRemoved;
    step.invert = true;
  } else if (type == "WhitespaceSplit") {
    step.kind = Kind::kSplit;
    BS_RETURN_IF_ERROR(internal_pattern(R"(\s+)"));
    step.behavior = Behavior::kRemoved;
  } else {
    return Unimplemented("{}: pre_tokenizer type '{}' at '{}' is not supported", at.file, type,
                         at.path);
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Result<PreTokenizer> PreTokenizer::from_json(const Json& config, const JsonPath& at) {
  PreTokenizer p;
  BS_RETURN_IF_ERROR(parse_into(config, at, p.steps_));
  p.raw_byte_level_ = !p.steps_.empty() && p.steps_.back().kind == Kind::kByteLevel;
  return p;
}

// Splits `piece` around the step's pattern matches following HF tokenizers' delimiter behaviours.
void PreTokenizer::split(const Step& step, std::string_view piece,
                         std::vector<std::string_view>& out) {
  struct Segment {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Segment> segments;
  size_t prev = 0;
  for (const auto& [b, e] : step.pattern.find_all(piece)) {
    if (b > prev) segments.push_back({prev, b, step.invert});
    segments.push_back({b, e, !step.invert});
    prev = e;
  }
  if (prev < piece.size()) segments.push_back({prev, piece.size(), step.invert});

  std::vector<Segment> merged;
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case Behavior::kIsolated:
      merged = std::move(segments);
      break;
    case Behavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < segments.size(); ++i) {
        if (i > 0 && segments[i].is_match == previous_match) {
          merged.back().end = segments[i].end;
        } else {
          merged.push_back(segments[i]);
        }
        previous_match = segments[i].is_match;
      }
      break;
  }
  for (const Segment& s : merged) {
    if (s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
  }
}

void PreTokenizer::apply_step(const Step& step, bool last, std::string_view piece,
                              bool first_section, Scratch& scratch,
                              std::vector<std::string_view>& out) const {
  switch (step.kind) {
    case Kind::kSplit:
      split(step, piece, out);
      return;
    case Kind::kByteLevel: {
      std::string_view text = piece;
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        std::string& prefixed = scratch.owned.emplace_back(" ");
        prefixed.append(piece);
        text = prefixed;
      }
      const size_t first = out.size();
      if (step.has_pattern) {
        for (const auto& [b, e] : step.pattern.find_all(text)) out.push_back(text.substr(b, e - b));
      } else {
        out.push_back(text);
      }
      if (!last) {  // the model expects mapped text unless ByteLevel is the final step
        for (size_t i = first; i < out.size(); ++i) {
          out[i] = scratch.owned.emplace_back(byte_level_map(out[i]));
        }
      }
      return;
    }
    case Kind::kMetaspace: {
      std::string& text = scratch.owned.emplace_back();
      text.reserve(piece.size() + step.replacement.size());
      const bool starts_with_rep =
          piece.substr(0, 1) == " " || piece.substr(0, step.replacement.size()) == step.replacement;
      if (!starts_with_rep && (step.prepend == Prepend::kAlways ||
                               (step.prepend == Prepend::kFirst && first_section))) {
        text.append(step.replacement);
      }
      for (char c : piece) {
        if (c == ' ') {
          text.append(step.replacement);
        } else {
          text.push_back(c);
        }
      }
      const std::string_view view = text;
      if (!step.split || step.replacement.empty()) {
        out.push_back(view);
        return;
      }
      // Split before every replacement character (MergedWithNext).
      size_t start = 0;
      for (size_t pos = view.find(step.replacement, 1); pos != std::string_view::npos;
           pos = view.find(step.replacement, pos + step.replacement.size())) {
        if (pos > start) out.push_back(view.substr(start, pos - start));
        start = pos;
      }
      if (start < view.size()) out.push_back(view.substr(start));
      return;
    }
  }
}

void PreTokenizer::apply(std::string_view section, bool first_section, Scratch& scratch,
                         std::vector<std::string_view>& out) const {
  scratch.owned.clear();
  if (section.empty()) return;
  if (steps_.empty()) {
    out.push_back(section);
    return;
  }
  auto& pieces = scratch.pieces;
  auto& next = scratch.next;
  pieces.assign(1, section);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const bool last = i + 1 == steps_.size();
    std::vector<std::string_view>& target = last ? out : next;
    if (!last) next.clear();
    for (const std::string_view piece : pieces) {
      apply_step(steps_[i], last, piece, first_section, scratch, target);
    }
    if (!last) pieces.swap(next);
  }
}

}  // namespace bs
