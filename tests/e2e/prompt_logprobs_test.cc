// engine/prompt_logprobs.h on the embedded stories260K target (the values themselves are checked
// against transformers through the server, Server.EchoScoresThePromptAsTransformers).
#include "engine/prompt_logprobs.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "counting_backend.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

class PromptLogprobs : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_backend(1);
    backend_ = std::make_unique<test_util::CountingBackend>(*cpu_);
    auto t = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
  }
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<test_util::CountingBackend> backend_;
  std::unique_ptr<CausalLM> target_;
};

// Any split of the prefill gives the same entries (CPU rows do not depend on the row count), one
// per token after the first, each the token's own logprob with its top alternatives.
TEST_F(PromptLogprobs, EveryChunkingGivesTheSameEntries) {
  std::vector<int32_t> prompt = test_util::kStoryPrompts[3];
  while (prompt.size() < 70) prompt.push_back(prompt[prompt.size() % 15]);
  auto whole = prompt_logprobs(*target_, prompt, 4, 1024);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  ASSERT_EQ(whole->size(), prompt.size() - 1);
  for (size_t i = 0; i < whole->size(); ++i) {
    const TokenLogprobs& e = (*whole)[i];
    EXPECT_EQ(e.token, prompt[i + 1]);
    EXPECT_LE(e.logprob, 0.0f);
    ASSERT_EQ(e.top.size(), 4u);
    EXPECT_GE(e.top[0].logprob, e.logprob);  // the best is at least as likely as the token
  }
  for (const int64_t rows : {1, 7, 16, 69}) {
    auto split = prompt_logprobs(*target_, prompt, 4, rows);
    ASSERT_TRUE(split.ok());
    ASSERT_EQ(split->size(), whole->size());
    for (size_t i = 0; i < whole->size(); ++i) {
      EXPECT_EQ((*split)[i].logprob, (*whole)[i].logprob) << rows << " rows, token " << i;
      EXPECT_EQ((*split)[i].top.size(), 4u);
    }
  }
  auto one = prompt_logprobs(*target_, std::vector<int32_t>{1}, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->empty());
}

TEST_F(PromptLogprobs, BadInputAndTooLittleMemoryAreClearErrors) {
  EXPECT_EQ(prompt_logprobs(*target_, std::vector<int32_t>{}, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt_logprobs(*target_, std::vector<int32_t>{1, 2}, 21).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt_logprobs(*target_, std::vector<int32_t>{1, 9999}, 0).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_long(600, 300);  // the window is 512
  EXPECT_EQ(prompt_logprobs(*target_, too_long, 0).status().code(), StatusCode::kInvalidArgument);
  backend_->set_memory_info({.free = 1 << 16, .total = 1 << 30});
  auto r = prompt_logprobs(*target_, std::vector<int32_t>(100, 300), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(r.status().message().find("MiB"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace bs
