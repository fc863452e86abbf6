// ChatTemplate: loading from a model folder, errors, and the limits that keep hostile templates
// from hanging or crashing. Rendering semantics are checked against Jinja2 in
// tests/golden/chat_template_test.cc.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace bs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ChatTemplateLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("bs_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

const json kUser = json::array({{{"role", "user"}, {"content", "Hi"}}});

TEST_F(ChatTemplateLoad, JinjaFileWinsAndTokensComeFromConfig) {
  write("chat_template.jinja", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\n");
  write("tokenizer_config.json",
        R"({"chat_template": "ignored", "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto text = (*t)->render(kUser, true);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "<s>Hi</s>");
}

TEST_F(ChatTemplateLoad, ConfigStringAndNamedList) {
  write("tokenizer_config.json", R"({"chat_template": "[{{ messages|length }}]"})");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*(*t)->render(kUser, false), "[1]");

  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                        {"name": "default", "template": "D"}]})");
  t = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*(*t)->render(kUser, false), "D");
}

TEST_F(ChatTemplateLoad, NoTemplateIsNotFound) {
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("no chat template"), std::string::npos);
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
}

TEST_F(ChatTemplateLoad, MalformedFilesNameTheFile) {
  write("tokenizer_config.json", R"({"chat_template": "x",)");
  auto t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);

  write("tokenizer_config.json", R"({"chat_template": 5})");
  t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("chat_template"), std::string::npos);

  write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_FALSE(ChatTemplate::load(dir_.string()).ok());

  write("chat_template.jinja", "ok\n{% if %}");
  t = ChatTemplate::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("chat_template.jinja"), std::string::npos);
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().message();
}

Status render_status(std::string_view source, const json& extra = json::object()) {
  auto t = ChatTemplate::parse(source);
  if (!t.ok()) return t.status();
  auto text = (*t)->render(kUser, true, extra);
  return text.ok() ? Status::Ok() : text.status();
}

TEST(ChatTemplate, RaiseExceptionAndBadInputs) {
  Status s = render_status("a\n{{ raise_exception('Only user and assistant roles!') }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Only user and assistant roles!"), std::string::npos);
  EXPECT_NE(s.message().find("line 2"), std::string::npos) << s.message();

  auto t = ChatTemplate::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->render(json::object(), true).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*t)->render(kUser, true, json::array()).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, ExtraVariables) {
  auto t = ChatTemplate::parse(
      "{{ tools is none }} {{ enable_thinking }} {{ bos_token }}{{ add_generation_prompt }}",
      "<s>");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->render(kUser, true, {{"enable_thinking", false}}), "True False <s>True");
  EXPECT_EQ(*(*t)->render(kUser, false, {{"bos_token", "B"}, {"tools", json::array()}}),
            "False  BFalse");
}

// Found by tests/fuzz/jinja_template_fuzz on the H200 long run (corpus:
// regress_namespace_cycle_leak.txt): a template that stores a container inside itself built a
// reference cycle that outlived the render (LeakSanitizer: a leak per request in a server). The
// render now empties every container it made when it ends; the ASan+UBSan stage of .ci/run
// (scripts/sanitize.sh, leak checking on) fails this test without that.
TEST(ChatTemplate, SelfReferencesDoNotOutliveTheRender) {
  // The sandbox refuses list.append and dict.update (as transformers' immutable sandbox does),
  // so a namespace attribute is how a template builds a cycle.
  const char* kCycles[] = {
      "{% set ns = namespace(a=0) %}{% set ns.a = ns %}{{ ns.a is defined }}",
      "{% set ns = namespace(a=0) %}{% set ns.a = [1, {'x': ns}] %}{{ ns.a | length }}",
      "{% set p = namespace(q=0) %}{% set q = namespace(p=p) %}{% set p.q = q %}{{ p.q.p.q is "
      "defined }}",
  };
  const char* kExpected[] = {"True", "2", "True"};
  for (size_t i = 0; i < std::size(kCycles); ++i) {
    auto t = ChatTemplate::parse(kCycles[i]);
    ASSERT_TRUE(t.ok()) << kCycles[i];
    auto text = (*t)->render(kUser, false);
    ASSERT_TRUE(text.ok()) << kCycles[i] << ": " << text.status().message();
    EXPECT_EQ(*text, kExpected[i]) << kCycles[i];
  }
}

// Found by tests/fuzz/jinja_template_fuzz in CI: printing a namespace that holds itself recursed
// until the stack overflowed. Python's repr writes a container met again inside itself as
// [...] / {...}; Jinja's namespace repr is "<Namespace " + repr(its attribute dict) + ">".
TEST(ChatTemplate, SelfReferencesPrintAsPythonDoes) {
  const std::pair<const char*, const char*> kCases[] = {
      {"{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
       "<Namespace {'a': <Namespace {...}>}>"},
      {"{% set ns = namespace(a=1) %}{% set ns.a = [ns, 2] %}{{ ns.a }}",
       "[<Namespace {'a': [...]}>, 2]"},
      {"{% set ns = namespace(a=1) %}{% set d = {'k': ns} %}{% set ns.a = d %}{{ d }}",
       "{'k': <Namespace {'a': {...}}>}"},
      {"{% set ns = namespace(a=1) %}{% set ns.a = (ns,) %}{{ ns.a }}",
       "(<Namespace {'a': (...)}>,)"},
      // The same container twice side by side is no cycle.
      {"{% set l = [1] %}{{ [l, l] }}", "[[1], [1]]"},
      // A container compares equal to itself without descending into the cycle.
      {"{% set ns = namespace(a=1) %}{% set ns.a = [ns] %}{{ ns.a == ns.a }}", "True"},
  };
  for (const auto& [src, expected] : kCases) {
    auto t = ChatTemplate::parse(src);
    ASSERT_TRUE(t.ok()) << src;
    auto text = (*t)->render(kUser, false);
    ASSERT_TRUE(text.ok()) << src << ": " << text.status().message();
    EXPECT_EQ(*text, expected) << src;
  }
}

// Hostile templates fail quickly with InvalidArgument instead of hanging or crashing.
TEST(ChatTemplate, LimitsStopHostileTemplates) {
  const auto start = std::chrono::steady_clock::now();
  const char* kHostile[] = {
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  // unbounded recursion
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      "{% set ns = namespace(s='xx') %}{% for i in range(200) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",                    // exponential string growth
      "{{ 'x' * 1000000000000 }}",       // huge repeat
      "{{ [1] * 1000000000000 }}",       // huge list
      "{{ range(10000000) | length }}",  // sandbox range limit
      "{% set ns = namespace(l=[0]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",       // exponential list growth
      "{{ 2 ** 100000 }}",  // integer overflow
  };
  for (const char* src : kHostile) {
    const Status s = render_status(src);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << src;
  }
  // Deep nesting is a syntax error, not a stack overflow.
  for (const std::string open : {"(", "[", "{'a': ", "not ", "-"}) {
    std::string src = "{{ ";
    for (int i = 0; i < 100000; ++i) src += open;
    src += "1 }}";
    const Status s = render_status(src);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << open;
  }
  std::string nested;
  for (int i = 0; i < 10000; ++i) nested += "{% if true %}";
  EXPECT_EQ(render_status(nested).code(), StatusCode::kInvalidArgument);
  // A hang guard, not a timing goal: ~3 s in Release, ~17 s under ASan+UBSan alone, more on a
  // loaded 2-core CI machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(180));
}

// Containers nested deeper than the renderer's bound (200, as tojson's), built one level a step:
// printing, comparing or ordering them is an error (Python: RecursionError) instead of a stack
// overflow, and dropping a chain a hundred thousand deep mid-render frees it without recursing
// once per level (the ASan stage of .ci/run overflows the stack without that).
TEST(ChatTemplate, DeeplyNestedContainersFailCleanly) {
  const std::string kDeep =
      "{% set ns = namespace(l=0, m=0) %}{% for i in range(1000) %}"
      "{% set ns.l = [ns.l] %}{% set ns.m = [ns.m] %}{% endfor %}";
  for (const char* use : {"{{ ns.l }}", "{{ ns.l == ns.m }}", "{{ ns.l < ns.m }}",
                          "{{ ns.l | string }}", "{{ ns.l | tojson }}"}) {
    const Status s = render_status(kDeep + use);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << use;
    EXPECT_NE(s.message().find("nesting too deep"), std::string::npos)
        << use << ": " << s.message();
  }
  auto dropped = ChatTemplate::parse(
      "{% set ns = namespace(l=0) %}{% for i in range(1000) %}{% for j in range(100) %}"
      "{% set ns.l = [ns.l] %}{% endfor %}{% endfor %}{% set ns.l = 0 %}done");
  ASSERT_TRUE(dropped.ok());
  auto text = (*dropped)->render(kUser, false);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "done");
}

}  // namespace
}  // namespace bs
