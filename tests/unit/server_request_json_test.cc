// parse_request_json: limits enforced while parsing (depth, size, number range), errors that
// name the limit and the top-level field.
#include <gtest/gtest.h>

#include <string>

#include "server/openai.h"
#include "server/request_json.h"

namespace bs::server {
namespace {

std::string nested(int depth, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(RequestJson, AcceptsDocumentsWithinTheLimits) {
  std::string field;
  auto j = parse_request_json(R"({"prompt": [[1, 2]], "n": 2})", {.max_depth = 3}, &field);
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["n"], 2);
  EXPECT_EQ(field, "");
  auto o = parse_request_json_ordered(R"({"b": 1, "a": 2})", {});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->begin().key(), "b");  // key order kept
}

TEST(RequestJson, DepthLimitStopsAHundredThousandLevelsWithoutRecursion) {
  for (const std::string& body : {R"({"prompt": )" + nested(100000) + "}",
                                  R"({"messages": [{"role": "user", "content": "hi", "x": )" +
                                      nested(100000, "{\"a\":", "}") + "}]}"}) {
    std::string field;
    auto j = parse_request_json(body, {.max_depth = 64}, &field);
    ASSERT_FALSE(j.ok());
    EXPECT_NE(j.status().message().find("deeper than the limit of 64 levels"), std::string::npos)
        << j.status().message();
    EXPECT_TRUE(field == "prompt" || field == "messages") << field;
  }
  // Exactly at the limit: fine; one more: refused.
  EXPECT_TRUE(parse_request_json(nested(64), {.max_depth = 64}).ok());
  EXPECT_FALSE(parse_request_json(nested(65), {.max_depth = 64}).ok());
}

TEST(RequestJson, NumberBeyondADoubleNamesTheField) {
  std::string field;
  auto j = parse_request_json(R"({"prompt": "hi", "temperature": 1e400})", {}, &field);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(field, "temperature");
  EXPECT_NE(j.status().message().find("out of range"), std::string::npos) << j.status().message();
}

TEST(RequestJson, SizeLimitAndSyntaxErrors) {
  EXPECT_FALSE(parse_request_json(std::string(100, ' ') + "{}", {.max_bytes = 64}).ok());
  auto bad = parse_request_json("{not json", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
}

// The crashers of issue 18 as parse_completion_request sees them: each a 400 naming the field.
TEST(RequestJson, HostileCompletionRequestsAre400sNamingTheField) {
  struct Case {
    std::string body;
    bool chat;
    std::string param;
  };
  const std::string deep = nested(100000);
  const std::vector<Case> cases = {
      {R"({"prompt": ["a", "b", "c"], "n": 4611686018427387904})", false, "n"},
      {R"({"prompt": ["a", "b"], "n": 9223372036854775807})", false, "n"},
      {R"({"prompt": "a", "n": 18446744073709551615})", false, "n"},
      {R"({"prompt": "a", "n": 0})", false, "n"},
      {R"({"prompt": "a", "best_of": 18446744073709551615})", false, "best_of"},
      {R"({"prompt": )" + deep + "}", false, "prompt"},
      {R"({"messages": [{"role": "user", "content": "hi", "extra": )" + deep + "}]}", true,
       "messages"},
      {R"({"prompt": "a", "temperature": 1e400})", false, "temperature"},
      {R"({"prompt": "a", "temperature": 1e300})", false, "temperature"},
      {R"({"prompt": "a", "top_p": -1e300})", false, "top_p"},
      {R"({"prompt": "a", "max_tokens": 9223372036854775807})", false, "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 18446744073709551615})", false, "max_tokens"},
      {R"({"prompt": "a", "max_completion_tokens": 1e400})", false, "max_completion_tokens"},
      {R"({"prompt": "a", "top_k": 9223372036854775807})", false, "top_k"},
      {R"({"prompt": "a", "logprobs": 9223372036854775807})", false, "logprobs"},
      {R"({"prompt": "a", "seed": 18446744073709551615})", false, "seed"},
      {R"({"prompt": "a", "seed": 1e400})", false, "seed"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
           "top_logprobs": -9223372036854775808})",
       true, "top_logprobs"},
  };
  for (const Case& c : cases) {
    CompletionRequest r;
    const auto e = parse_completion_request(c.body, c.chat, &r);
    ASSERT_TRUE(e.has_value()) << c.body.substr(0, 120);
    EXPECT_EQ(e->http_status, 400) << c.body.substr(0, 120);
    EXPECT_EQ(e->param, c.param) << c.body.substr(0, 120) << " -> " << e->message;
  }
  // Negative seeds are int64 values as vLLM takes them.
  CompletionRequest r;
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "a", "seed": -5})", false, &r).has_value());
}

}  // namespace
}  // namespace bs::server
