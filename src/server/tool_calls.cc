#include "server/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/request_json.h"

namespace bs::server {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}

bool all_space(std::string_view s) { return skip_space(s, 0) == s.size(); }

// The end (one past the closing brace) of the JSON object starting at s[pos] == '{', skipping
// braces inside strings; npos when it does not close. Validity is json::parse's check.
size_t object_end(std::string_view s, size_t pos) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// A call from one JSON object text: a string "name" and an object under one of `arg_keys`.
std::optional<ToolCall> call_from_json(std::string_view text,
                                       std::initializer_list<const char*> arg_keys) {
  // The model's text: depth-limited like a request (a deep document would overflow the stack in
  // dump); too deep or invalid is no call.
  auto parsed = parse_request_json_ordered(text, {.max_bytes = text.size()});
  if (!parsed.ok()) return std::nullopt;
  const ordered_json& j = *parsed;
  if (!j.is_object() || !j.contains("name") || !j.at("name").is_string()) return std::nullopt;
  for (const char* key : arg_keys) {
    if (j.contains(key) && j.at(key).is_object()) {
      return ToolCall{.name = j.at("name").get<std::string>(),
                      .arguments = j.at(key).dump(-1, ' ', /*ensure_ascii=*/false,
                                                  ordered_json::error_handler_t::replace)};
    }
  }
  return std::nullopt;
}

ParsedReply as_text(const std::string& text) { return {.content = text, .calls = {}}; }

ParsedReply parse_hermes(const std::string& text) {
  const std::string_view s = text;
  ParsedReply out;
  std::string content;
  size_t pos = 0;
  while (true) {
    const size_t open = s.find(kOpen, pos);
    if (open == std::string_view::npos) {
      content += s.substr(pos);
      break;
    }
    content += s.substr(pos, open - pos);
    const size_t start = skip_space(s, open + kOpen.size());
    if (start >= s.size() || s[start] != '{') return as_text(text);
    const size_t end = object_end(s, start);
    if (end == std::string_view::npos) return as_text(text);
    auto call = call_from_json(s.substr(start, end - start), {"arguments"});
    if (!call) return as_text(text);
    out.calls.push_back(std::move(*call));
    const size_t after = skip_space(s, end);
    if (s.substr(after).starts_with(kClose)) {
      pos = after + kClose.size();
    } else if (after == s.size()) {
      pos = after;  // unclosed last block (generation ended before the closing tag)
    } else {
      return as_text(text);
    }
  }
  if (out.calls.empty()) return as_text(text);
  if (!all_space(content)) out.content = std::move(content);
  return out;
}

ParsedReply parse_llama3_json(const std::string& text) {
  std::string_view s = text;
  s.remove_prefix(skip_space(s, 0));
  if (s.starts_with(kPythonTag)) s.remove_prefix(kPythonTag.size());
  s.remove_prefix(skip_space(s, 0));
  if (s.empty() || s[0] != '{') return as_text(text);
  const size_t end = object_end(s, 0);
  if (end == std::string_view::npos || !all_space(s.substr(end))) return as_text(text);
  auto call = call_from_json(s.substr(0, end), {"parameters", "arguments"});
  if (!call) return as_text(text);
  return {.content = std::nullopt, .calls = {std::move(*call)}};
}

}  // namespace

std::optional<ToolCallParser> tool_call_parser_from_name(std::string_view name) {
  if (name == "none") return ToolCallParser::kNone;
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json") return ToolCallParser::kLlama3Json;
  return std::nullopt;
}

ToolCallParser default_tool_call_parser(std::string_view chat_template_source) {
  return chat_template_source.find(kOpen) != std::string_view::npos ? ToolCallParser::kHermes
                                                                    : ToolCallParser::kNone;
}

ParsedReply parse_tool_calls(ToolCallParser parser, const std::string& text) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return parse_hermes(text);
    case ToolCallParser::kLlama3Json:
      return parse_llama3_json(text);
    case ToolCallParser::kNone:
      break;
  }
  return as_text(text);
}

nlohmann::json tool_calls_delta(const std::vector<ToolCall>& calls, const std::string& id_prefix) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    list.push_back({{"index", i},
                    {"id", fmt::format("{}_{}", id_prefix, i)},
                    {"type", "function"},
                    {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  return {{"tool_calls", std::move(list)}};
}

nlohmann::json chat_message(const ParsedReply& reply, const std::string& id_prefix) {
  nlohmann::json message = {
      {"role", "assistant"},
      {"content", reply.content ? nlohmann::json(*reply.content) : nlohmann::json(nullptr)}};
  if (!reply.calls.empty()) {
    nlohmann::json calls = tool_calls_delta(reply.calls, id_prefix)["tool_calls"];
    for (auto& c : calls) c.erase("index");  // messages carry no index (deltas do)
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

ToolCallStream::ToolCallStream(ToolCallParser parser, std::string id_prefix)
    : parser_(parser), id_prefix_(std::move(id_prefix)) {}

std::string ToolCallStream::push(const std::string& text) {
  text_ += text;
  if (parser_ == ToolCallParser::kNone) {
    sent_ = text_.size();
    return text;
  }
  const std::string_view s = text_;
  size_t final_end = s.size();  // content up to here cannot become part of a tool call
  if (parser_ == ToolCallParser::kHermes) {
    const size_t open = s.find(kOpen);
    if (open != std::string_view::npos) {
      final_end = open;
    } else {
      // Hold the longest end that is a proper prefix of the marker.
      for (size_t n = std::min(kOpen.size() - 1, s.size()); n > 0; --n) {
        if (s.substr(s.size() - n) == kOpen.substr(0, n)) {
          final_end = s.size() - n;
          break;
        }
      }
    }
  } else if (parser_ == ToolCallParser::kLlama3Json) {
    const std::string_view t = s.substr(skip_space(s, 0));
    if (t.empty() || kPythonTag.starts_with(t) || t.starts_with(kPythonTag) || t[0] == '{') {
      final_end = 0;
    }
  }
  // Whitespace-only content is held too: it is dropped when calls follow.
  if (final_end <= sent_ || all_space(s.substr(0, final_end))) return {};
  std::string out(s.substr(sent_, final_end - sent_));
  sent_ = final_end;
  return out;
}

std::vector<nlohmann::json> ToolCallStream::finish() {
  ParsedReply reply = parse_tool_calls(parser_, text_);
  std::vector<nlohmann::json> deltas;
  has_calls_ = !reply.calls.empty();
  // What was sent is a prefix of the content: the text before the first marker (hermes), or
  // nothing (llama3_json holds a possible call whole; without calls the content is the text).
  const std::string content = reply.content.value_or("");
  if (content.size() > sent_) deltas.push_back({{"content", content.substr(sent_)}});
  if (has_calls_) deltas.push_back(tool_calls_delta(reply.calls, id_prefix_));
  return deltas;
}

}  // namespace bs::server
