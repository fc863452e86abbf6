// Tool-call parsing of chat replies (src/server/tool_calls.h): hermes and llama3_json, the
// message and delta JSON the server sends, and streaming that equals the finished reply.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/tool_calls.h"

namespace bs::server {
namespace {

using json = nlohmann::json;

constexpr ToolCallParser kHermes = ToolCallParser::kHermes;
constexpr ToolCallParser kLlama = ToolCallParser::kLlama3Json;

TEST(ToolCalls, ParserNamesAndDefault) {
  EXPECT_EQ(tool_call_parser_from_name("hermes"), kHermes);
  EXPECT_EQ(tool_call_parser_from_name("llama3_json"), kLlama);
  EXPECT_EQ(tool_call_parser_from_name("none"), ToolCallParser::kNone);
  EXPECT_EQ(tool_call_parser_from_name("mistral"), std::nullopt);
  EXPECT_EQ(default_tool_call_parser("...within <tool_call></tool_call> XML tags"), kHermes);
  EXPECT_EQ(default_tool_call_parser("{{ messages }}"), ToolCallParser::kNone);
}

// The one call parsed from `text` (empty, with a failure, unless there is exactly one); checks
// the content too.
ToolCall one_call(const std::string& text, const std::optional<std::string>& content) {
  const ParsedReply r = parse_tool_calls(kHermes, text);
  EXPECT_EQ(r.calls.size(), 1u) << text;
  EXPECT_EQ(r.content, content) << text;
  return r.calls.size() == 1 ? r.calls[0] : ToolCall{};
}

TEST(ToolCalls, HermesOneCallNoText) {
  const ToolCall c = one_call(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"days\": 3}}\n</tool_call>",
      std::nullopt);
  EXPECT_EQ(c.name, "get_weather");
  EXPECT_EQ(c.arguments, R"({"city":"Paris","days":3})");  // key order kept
}

// A reply the model nested a million levels deep is text, not a call (and no crash: the JSON is
// parsed under parse_request_json's depth limit, never built, dumped or destroyed recursively).
TEST(ToolCalls, DeeplyNestedArgumentsAreTextNotACrash) {
  const int depth = 1000000;
  const std::string text =
      "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(depth, '[') +
      std::string(depth, ']') + "}</tool_call>";
  const std::string object_args =
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(depth, '[') +
      std::string(depth, ']') + "}}</tool_call>";
  EXPECT_TRUE(parse_tool_calls(kHermes, text).calls.empty());
  EXPECT_TRUE(parse_tool_calls(kHermes, object_args).calls.empty());
}

TEST(ToolCalls, HermesMultipleCallsWithTextAround) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": null}]}}</tool_call>\nDone.";
  const ParsedReply r = parse_tool_calls(kHermes, text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, R"({"x":[1,{"y":null}]})");
  EXPECT_EQ(r.content, "Let me check.\n\n\nDone.");
}

TEST(ToolCalls, HermesWhitespaceOnlyTextIsNullContent) {
  EXPECT_EQ(
      one_call("\n\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n", std::nullopt)
          .name,
      "a");
}

TEST(ToolCalls, HermesStringsMayHoldMarkersAndBraces) {
  const ToolCall c = one_call(
      "<tool_call>{\"name\": \"echo\", \"arguments\": {\"s\": \"a } </tool_call> \\\" { "
      "<tool_call>\"}}</tool_call>",
      std::nullopt);
  EXPECT_EQ(json::parse(c.arguments)["s"], "a } </tool_call> \" { <tool_call>");
}

TEST(ToolCalls, HermesUnicodeKeptAsUtf8) {
  const ToolCall c = one_call(
      "Voilà: <tool_call>{\"name\": \"météo\", \"arguments\": {\"ville\": \"東京\", \"e\": "
      "\"\\u00e9\"}}</tool_call>",
      "Voilà: ");
  EXPECT_EQ(c.name, "météo");
  EXPECT_EQ(c.arguments, R"({"ville":"東京","e":"é"})");
}

TEST(ToolCalls, HermesUnclosedLastBlockIsACall) {
  EXPECT_EQ(one_call("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}\n", std::nullopt)
                .arguments,
            R"({"k":1})");
}

TEST(ToolCalls, MalformedBlocksLeaveTheReplyAsText) {
  for (const char* text : {
           "<tool_call>{\"name\": \"a\", \"arguments\": {}</tool_call>",       // unbalanced
           "<tool_call>{\"name\": \"a\" \"arguments\": {}}</tool_call>",       // missing comma
           "<tool_call>{\"arguments\": {}}</tool_call>",                       // no name
           "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",          // name not a string
           "<tool_call>{\"name\": \"a\", \"arguments\": \"{}\"}</tool_call>",  // args a string
           "<tool_call>[1, 2]</tool_call>",
           "<tool_call>{\"name\": \"a\", \"arguments\": {}} trailing</tool_call>",
           "<tool_call>",
           // One good block and one bad: all text.
           "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{oops}"
           "</tool_call>",
           "no calls at all",
       }) {
    const ParsedReply r = parse_tool_calls(kHermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, NoneParserKeepsText) {
  const std::string text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
  const ParsedReply r = parse_tool_calls(ToolCallParser::kNone, text);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, text);
}

TEST(ToolCalls, Llama3JsonVariants) {
  struct Case {
    std::string text, name, arguments;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"name": "f", "parameters": {"a": 1}})", "f", R"({"a":1})"},
           {R"({"name": "f", "arguments": {"b": "x"}})", "f", R"({"b":"x"})"},
           {"<|python_tag|>{\"name\": \"g\", \"parameters\": {}}", "g", "{}"},
           {"  \n<|python_tag|> {\"name\": \"g\", \"parameters\": {\"s\": \"}\"}}\n", "g",
            R"({"s":"}"})"},
           {R"({"type": "function", "name": "h", "parameters": {"q": "日本"}})", "h",
            R"({"q":"日本"})"},
       }) {
    const ParsedReply r = parse_tool_calls(kLlama, c.text);
    ASSERT_EQ(r.calls.size(), 1u) << c.text;
    EXPECT_EQ(r.calls[0].name, c.name);
    EXPECT_EQ(r.calls[0].arguments, c.arguments);
    EXPECT_EQ(r.content, std::nullopt);
  }
  for (const std::string& text : {
           std::string("The answer is {\"name\": \"f\", \"parameters\": {}}"),  // text before
           std::string(R"({"name": "f", "parameters": {}} and more)"),          // text after
           std::string(R"({"name": "f"})"),                                     // no arguments
           std::string(R"({"name": "f", "parameters": {})"),                    // unclosed
           std::string(R"({"name": "f", "parameters": {}}{"name": "g", "parameters": {}})"),
           std::string("Hello"),
       }) {
    const ParsedReply r = parse_tool_calls(kLlama, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, MessageAndDeltaJson) {
  const ParsedReply r =
      parse_tool_calls(kHermes,
                       "Hi <tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>"
                       "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>");
  const json m = chat_message(r, "call_abc");
  EXPECT_EQ(m, json::parse(R"({"role": "assistant", "content": "Hi ", "tool_calls": [
      {"id": "call_abc_0", "type": "function", "function": {"name": "a", "arguments": "{\"x\":1}"}},
      {"id": "call_abc_1", "type": "function", "function": {"name": "b", "arguments": "{}"}}]})"));
  EXPECT_EQ(tool_calls_delta(r.calls, "call_abc")["tool_calls"][1],
            json::parse(R"({"index": 1, "id": "call_abc_1", "type": "function",
                            "function": {"name": "b", "arguments": "{}"}})"));
  const json plain = chat_message(parse_tool_calls(kHermes, "text"), "call_abc");
  EXPECT_EQ(plain, json::parse(R"({"role": "assistant", "content": "text"})"));
}

// Streams `text` in pieces of `step` bytes; returns the content deltas joined, whether any content
// was released before the end, and the final deltas.
struct Streamed {
  std::string content;
  std::string early;  // content released by push()
  json calls;         // the tool_calls delta's list, or null
  bool has_calls = false;
};

Streamed stream(ToolCallParser parser, const std::string& text, size_t step) {
  ToolCallStream s(parser, "call_x");
  Streamed out;
  for (size_t i = 0; i < text.size(); i += step) out.early += s.push(text.substr(i, step));
  out.content = out.early;
  for (const json& d : s.finish()) {
    if (d.contains("content")) out.content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) out.calls = d["tool_calls"];
  }
  out.has_calls = s.has_tool_calls();
  return out;
}

TEST(ToolCalls, StreamingEqualsTheFinishedReply) {
  const std::vector<std::pair<ToolCallParser, std::string>> cases = {
      {kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": "
       "\"</tool_call>\"}}\n</tool_call>\nDone."},
      {kHermes, "\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"},
      {kHermes, "Text with < and <tool and <tool_cal but no call."},
      {kHermes, "Broken: <tool_call>{\"name\": \"a\"}</tool_call> end"},
      {kHermes, "Ends in a partial marker <tool_"},
      {kHermes, "  \n "},
      {kLlama, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": \"é\"}}"},
      {kLlama, " {\"name\": \"f\", \"arguments\": {}}"},
      {kLlama, "Plain answer {not a call}"},
      {kLlama, "{\"name\": \"f\", \"parameters\": {}} trailing"},
      {ToolCallParser::kNone, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"},
  };
  for (const auto& [parser, text] : cases) {
    const ParsedReply want = parse_tool_calls(parser, text);
    for (size_t step : {1, 2, 3, 7, 1000}) {
      const Streamed got = stream(parser, text, step);
      EXPECT_EQ(got.content, want.content.value_or("")) << text << " step " << step;
      EXPECT_EQ(got.has_calls, !want.calls.empty()) << text;
      if (!want.calls.empty()) {
        EXPECT_EQ(got.calls, tool_calls_delta(want.calls, "call_x")["tool_calls"]) << text;
      } else {
        EXPECT_TRUE(got.calls.is_null()) << text;
      }
    }
  }
}

TEST(ToolCalls, StreamingReleasesTextBeforeTheMarkerEarly) {
  ToolCallStream s(kHermes, "call_x");
  EXPECT_EQ(s.push("Hello"), "Hello");
  EXPECT_EQ(s.push(" <tool"), " ");  // "<tool" may begin a marker
  EXPECT_EQ(s.push("box>"), "<toolbox>");
  EXPECT_EQ(s.push(" <tool_call>{\"name\": \"a\", "), " ");
  EXPECT_EQ(s.push("\"arguments\": {}}</tool_call> bye"), "");
  const std::vector<json> rest = s.finish();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0], json({{"content", " bye"}}));
  EXPECT_EQ(rest[1]["tool_calls"][0]["function"]["name"], "a");
  EXPECT_TRUE(s.has_tool_calls());

  ToolCallStream plain(kLlama, "call_y");
  EXPECT_EQ(plain.push(" "), "");
  EXPECT_EQ(plain.push("Sure"), " Sure");  // not a JSON object: released at once
  EXPECT_TRUE(plain.finish().empty());
  EXPECT_FALSE(plain.has_tool_calls());
}

}  // namespace
}  // namespace bs::server
