// Request bodies that crashed or misbehaved in the OpenAI request parser (found by
// tests/fuzz/openai_request_fuzz.cc and issue 18; each also in tests/fuzz/corpus/openai_request/):
// every one is a 400 naming the problem, never an exception, UB or a crash.
#include <gtest/gtest.h>

#include <string>

#include "server/openai.h"

namespace bs::server {
namespace {

std::string error_of(const std::string& body, bool chat) {
  CompletionRequest req;
  auto e = parse_completion_request(body, chat, &req);
  return e ? error_body(*e).dump() : std::string();
}

TEST(RequestFuzzRegressions, HugeNWithSeveralPromptsIsRefused) {
  // n x prompts overflowed int64 (UB), wrapped below kMaxChoices and was accepted with n = 0.
  const std::string err =
      error_of(R"({"prompt": ["a", "b"], "n": 4611686018427387904, "max_tokens": 1})", false);
  EXPECT_NE(err.find("n x prompts at most 128"), std::string::npos) << err;
  EXPECT_NE(error_of(R"({"prompt": ["a", "b", "c"], "n": 43})", false), "");
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b", "c"], "n": 42})", false), "");
}

TEST(RequestFuzzRegressions, OutOfRangeNumberIsABadRequest) {
  // nlohmann throws out_of_range (not parse_error) for 1e400: it escaped as a 500.
  for (bool chat : {false, true}) {
    const std::string body =
        chat ? R"({"messages": [{"role": "user", "content": "x"}], "temperature": 1e400})"
             : R"({"prompt": "x", "max_tokens": 1e400})";
    std::string err;
    EXPECT_NO_THROW(err = error_of(body, chat));
    EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  }
  std::string prompt;
  bool add_special = true;
  EXPECT_TRUE(parse_tokenize_request(R"({"prompt": "x", "n": -1e999})", &prompt, &add_special));
}

}  // namespace
}  // namespace bs::server
