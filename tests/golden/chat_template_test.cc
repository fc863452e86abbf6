// ChatTemplate against Jinja2 itself: tests/data/chat_templates/goldens.json, made by
// tools/goldens/make_chat_template_goldens.py (real model templates over conversations, and one
// small template per language feature), compared byte for byte.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "golden/golden_clock.h"
#include "tokenizer/chat_template_context.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_parser.h"

namespace bs {
namespace {

using json = nlohmann::ordered_json;  // dicts keep their order, as in Python

const std::string kDir = std::string(BS_TEST_DATA) + "/chat_templates";

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& goldens() {
  static const json j = json::parse(read_text(kDir + "/goldens.json"));
  return j;
}

class ChatTemplateGolden : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatTemplateGolden, MatchesJinja2) {
  const json& c = goldens()["cases"][GetParam()];
  const bool chat = c.contains("template");
  const std::string source = chat ? read_text(kDir + "/" + c["template"].get<std::string>())
                                  : c["source"].get<std::string>();
  const json* error = c.contains("error") ? &c["error"] : nullptr;
  const std::string kind = error ? (*error)["kind"].get<std::string>() : "";

  std::vector<std::pair<std::string, jinja::Value>> vars;
  if (chat) {
    vars = chat_template_variables(c["messages"], c["add_generation_prompt"].get<bool>(),
                                   c["bos_token"], c["eos_token"], c["extra"]);
  } else {
    for (auto it = c["variables"].begin(); it != c["variables"].end(); ++it) {
      vars.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
  }

  // The interpreter with the script's clock.
  std::unique_ptr<jinja::Template> tmpl;
  try {
    tmpl = jinja::parse(source);
  } catch (const jinja::Error& e) {
    ASSERT_EQ(kind, "syntax") << "unexpected syntax error at line " << e.line << ": " << e.what();
    EXPECT_EQ(e.line, (*error)["line"].get<int>()) << e.what();
    return;
  }
  ASSERT_NE(kind, "syntax") << "Jinja2 rejects this template: " << (*error)["message"];
  jinja::RenderOptions opt;
  opt.now = golden::golden_now;
  try {
    const std::string text = jinja::render(*tmpl, vars, opt);
    ASSERT_EQ(error, nullptr) << "expected " << kind << ": " << (*error)["message"]
                              << "\ngot text: " << text;
    EXPECT_EQ(text, c["expected"].get<std::string>());
  } catch (const jinja::Error& e) {
    ASSERT_NE(error, nullptr) << "unexpected error at line " << e.line << ": " << e.what();
    if (kind == "raise") {
      EXPECT_EQ(std::string(e.what()), (*error)["message"].get<std::string>());
    }
  }

  // The public API takes nlohmann::json, whose objects sort their keys: it must give what the
  // interpreter gives for those inputs (templates that read the clock excepted).
  if (!chat || source.find("strftime_now") != std::string::npos) return;
  const nlohmann::json messages = nlohmann::json::parse(c["messages"].dump());
  const nlohmann::json extra = nlohmann::json::parse(c["extra"].dump());
  std::optional<std::string> want;
  try {
    want = jinja::render(*tmpl,
                         chat_template_variables(messages, c["add_generation_prompt"].get<bool>(),
                                                 c["bos_token"], c["eos_token"], extra));
  } catch (const jinja::Error&) {
  }
  auto parsed = ChatTemplate::parse(source, c["bos_token"], c["eos_token"]);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  auto text = (*parsed)->render(messages, c["add_generation_prompt"].get<bool>(), extra);
  if (!want) {
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
    if (kind == "raise") {
      EXPECT_NE(text.status().message().find((*error)["message"].get<std::string>()),
                std::string::npos)
          << text.status().message();
    }
  } else {
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_EQ(*text, *want);
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string name = goldens()["cases"][info.param]["name"].get<std::string>();
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatTemplateGolden,
                         ::testing::Range<size_t>(0, goldens()["cases"].size()), case_name);

// Every real template renders at least one conversation without error.
TEST(ChatTemplateGoldenSet, EveryTemplateHasPassingCases) {
  std::map<std::string, int> ok;
  for (const json& c : goldens()["cases"]) {
    if (c.contains("template") && c.contains("expected")) ++ok[c["template"].get<std::string>()];
  }
  int templates = 0;
  for (const auto& f :
       std::filesystem::directory_iterator(std::string(BS_TEST_DATA) + "/chat_templates")) {
    if (f.path().extension() != ".jinja") continue;
    ++templates;
    EXPECT_GE(ok[f.path().filename().string()], 2) << f.path();
  }
  EXPECT_GE(templates, 6);
}

}  // namespace
}  // namespace bs
