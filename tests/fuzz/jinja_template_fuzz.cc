// Fuzzes the Jinja chat-template parser and renderer with arbitrary template source, rendered for
// a fixed conversation (system, user, assistant with a tool call, tool reply) with tools. Only
// jinja::Error (what ChatTemplate turns into InvalidArgument) may leave parse or render. The
// renderer's limits are lowered from their defaults so that one input stays fast.
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/chat_template_context.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_parser.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris? 🙂"},
    {"role": "assistant", "content": "", "reasoning_content": "think",
     "tool_calls": [{"type": "function", "id": "c1",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": " Rome"}]}
  ])");
  return m;
}

const nlohmann::ordered_json& extra() {
  static const auto e = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}],
    "enable_thinking": false
  })");
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto vars = bs::chat_template_variables(messages(), /*add_generation_prompt=*/true,
                                                       "<s>", "</s>", extra());
  try {
    const auto tmpl = bs::jinja::parse(bs::fuzz::as_text(data, size));
    bs::jinja::RenderOptions opt;
    opt.now = [] {
      std::tm t{};
      t.tm_year = 126, t.tm_mon = 11, t.tm_mday = 3;
      return t;
    };
    opt.max_steps = 20'000;
    opt.max_output = 64u << 10;
    (void)bs::jinja::render(*tmpl, vars, opt);
  } catch (const bs::jinja::Error&) {
  }
  return 0;
}
