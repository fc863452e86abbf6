// Greedy invariance with the shipped, trained drafters (models/stories260K-{dflash,flashmap}):
// high acceptance exercises long accepted runs, which random test drafters rarely reach.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kModels = std::string(BS_SOURCE_DIR) + "/models";

class TrainedDrafter : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainedDrafter, GreedyOutputEqualsPlain) {
  auto backend = make_cpu_backend(1);
  auto target = load_target(kModels + "/stories260K", *backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter = load_drafter(kModels + "/" + GetParam(), **target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  // BOS; "Once upon a time"; "The little dog"; a mid-story prefix from the held-out set.
  const std::vector<std::vector<int32_t>> prompts = {
      {1},
      {1, 403, 407, 261, 378},
      {1, 291, 376, 400, 428},
      {1, 403, 407, 261, 378, 432, 383, 286, 261, 297, 417, 331, 376, 298, 315}};
  int64_t accepted = 0;
  for (const auto& prompt : prompts) {
    for (int64_t draft_tokens : {0, 4}) {
      GenerateOptions opt;
      opt.max_tokens = 150;
      opt.stop_ids = {2};
      opt.draft_tokens = draft_tokens;
      auto plain = generate_plain(**target, prompt, opt, nullptr, nullptr);
      GenerateStats st;
      auto spec = generate_speculative(**target, **drafter, prompt, opt, nullptr, &st);
      ASSERT_TRUE(plain.ok() && spec.ok());
      EXPECT_EQ(*spec, *plain) << "prompt of " << prompt.size() << " tokens, draft_tokens "
                               << draft_tokens;
      accepted += st.accepted;
    }
  }
  // A trained drafter accepts many drafts (a random one accepts almost none).
  EXPECT_GT(accepted, 100);
}

INSTANTIATE_TEST_SUITE_P(Shipped, TrainedDrafter,
                         ::testing::Values("stories260K-dflash", "stories260K-flashmap"));

}  // namespace
}  // namespace bs
