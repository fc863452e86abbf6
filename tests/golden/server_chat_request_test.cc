// Chat requests as OpenAI clients send them (assistant "content": null with tool_calls whose
// arguments are JSON strings, tool results, content parts), parsed by parse_completion_request and
// rendered by real model templates, against Jinja2 rendering vLLM's normalisation of the same
// messages: tests/data/chat_templates/openai_request_goldens.json, made by
// tools/goldens/make_openai_chat_goldens.py.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "server/openai.h"
#include "tokenizer/chat_template.h"

namespace bs::server {
namespace {

using json = nlohmann::ordered_json;

const std::string kDir = std::string(BS_TEST_DATA) + "/chat_templates/";

const json& goldens() {
  static const json j = json::parse(std::ifstream(kDir + "openai_request_goldens.json"));
  return j;
}

class ChatRequestGolden : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatRequestGolden, RendersAsVllmWithJinja2) {
  const json& c = goldens()["cases"][GetParam()];
  CompletionRequest r;
  auto e = parse_completion_request(c["request"].dump(), /*chat=*/true, &r);
  ASSERT_FALSE(e) << e->message;
  std::ifstream source(kDir + c["template"].get<std::string>(), std::ios::binary);
  auto tmpl = ChatTemplate::parse(std::string(std::istreambuf_iterator<char>(source), {}),
                                  c["bos_token"], c["eos_token"]);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
  auto text = (*tmpl)->render(r.messages, /*add_generation_prompt=*/true, r.template_kwargs);
  ASSERT_TRUE(c.contains("expected")) << "the generator expected an error: " << c["error"].dump();
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, c["expected"].get<std::string>());
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string name = goldens()["cases"][info.param]["name"];
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatRequestGolden,
                         ::testing::Range<size_t>(0, goldens()["cases"].size()), case_name);

// The normalised messages themselves, field by field.
TEST(ChatRequest, NormalisesMessagesAsVllm) {
  CompletionRequest r;
  auto e = parse_completion_request(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": [1, 2]}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "c3", "type": "function", "function": {"name": "h", "arguments": ""}},
        {"id": "c4", "type": "function", "function": {"name": "k"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": null},
      {"role": "assistant", "tool_calls": null}]})",
                                    true, &r);
  ASSERT_FALSE(e) << e->message;
  const json& m = r.messages;
  EXPECT_EQ(m[0]["content"], "a\nb");
  EXPECT_EQ(m[1]["content"], "");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], json::parse(R"({"x": [1, 2]})"));
  EXPECT_EQ(m[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[1]["tool_calls"][2]["function"]["arguments"], json::object());
  EXPECT_EQ(m[1]["tool_calls"][3]["function"]["arguments"], json::object());
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[2]["tool_call_id"], "c1");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_FALSE(m[3].contains("tool_calls"));
  EXPECT_EQ(m[3]["content"], "");
}

TEST(ChatRequest, MalformedMessagesAre400NamingTheMessage) {
  for (
      const char* body : {
          R"({"messages": [{"role": "assistant", "content": null, "tool_calls": 3}]})",
          R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "x"}]}]})",
          R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
          R"({"messages": [{"role": "user", "content": 5}]})",
      }) {
    CompletionRequest r;
    auto e = parse_completion_request(body, true, &r);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, "messages");
    EXPECT_NE(e->message.find("messages[0]"), std::string::npos) << e->message;
  }
}

}  // namespace
}  // namespace bs::server
