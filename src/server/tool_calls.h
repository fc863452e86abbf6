// Tool calls in chat replies: the model's text in, OpenAI `tool_calls` out (vLLM's
// --tool-call-parser). No HTTP, no engine: the server feeds the reply text through these.
//
//   ParsedReply r = parse_tool_calls(ToolCallParser::kHermes, text);
//   message = chat_message(r, "call_abc");  // {"role", "content", "tool_calls"?}
//
// Streaming: ToolCallStream releases content text until a tool call may start, then holds the
// rest; finish() parses the whole reply and gives the remaining deltas.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bs::server {

enum class ToolCallParser {
  kNone,        // the reply is text
  kHermes,      // <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen, Hermes)
  kLlama3Json,  // the whole reply is {"name": ..., "parameters"|"arguments": {...}}
};

// "none" | "hermes" | "llama3_json"; nullopt for another name.
std::optional<ToolCallParser> tool_call_parser_from_name(std::string_view name);
// The default for a chat template's source: kHermes when it mentions <tool_call>, else kNone.
ToolCallParser default_tool_call_parser(std::string_view chat_template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialized compactly (UTF-8 kept)
};

struct ParsedReply {
  std::optional<std::string> content;  // null when calls were parsed and no text is left
  std::vector<ToolCall> calls;
};

// Splits `text` into content and tool calls. kHermes: every <tool_call>...</tool_call> block
// (the last one may be unclosed at the end of the text) must hold a JSON object with a string
// "name" and an object "arguments"; text outside the blocks is the content (null when only
// whitespace). kLlama3Json: the text, trimmed and after an optional <|python_tag|>, must be one
// such object ("parameters" or "arguments"); the content is then null. When any block or the
// object is malformed, or none is found, the result is the text as content with no calls.
ParsedReply parse_tool_calls(ToolCallParser parser, const std::string& text);

// The assistant message of a finished reply: {"role": "assistant", "content": text | null} plus
// "tool_calls": [{"id": "<id_prefix>_<i>", "type": "function", "function": {"name",
// "arguments"}}] when there are calls.
nlohmann::json chat_message(const ParsedReply& reply, const std::string& id_prefix);
// The streamed tool_calls delta: {"tool_calls": [{"index", "id", "type", "function"}]}.
nlohmann::json tool_calls_delta(const std::vector<ToolCall>& calls, const std::string& id_prefix);

// Streams a reply's content while holding back what may be a tool call. The content deltas
// joined equal parse_tool_calls(...).content of the whole reply (nothing when it is null).
class ToolCallStream {
 public:
  ToolCallStream(ToolCallParser parser, std::string id_prefix);

  // Takes the next text of the reply; returns the content that is final now (possibly empty).
  // kHermes holds back from the first <tool_call> (and any end that may begin one); kLlama3Json
  // holds the reply while it may still be one JSON object; both hold whitespace-only content.
  std::string push(const std::string& text);
  // At the end of the reply: the remaining deltas in order ({"content": ...} when content is
  // left, then the tool_calls delta when calls were parsed).
  std::vector<nlohmann::json> finish();
  // After finish(): whether the reply held tool calls (finish_reason "tool_calls").
  bool has_tool_calls() const { return has_calls_; }

 private:
  ToolCallParser parser_;
  std::string id_prefix_;
  std::string text_;  // the whole reply so far
  size_t sent_ = 0;   // bytes of text_ released as content
  bool has_calls_ = false;
};

}  // namespace bs::server
