// Lossless speculative decoding with the FlashMap drafter: greedy output equals plain greedy
// decoding on the real stories260K target, for several prompts, draft counts, jumps, noise
// scales and draft vocabularies; and seeded drafting is reproducible (same seed, same drafts,
// same acceptance).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kTarget = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_TEST_DATA) + "/flashmap-stories260K";
const std::string kDrafterDv = std::string(BS_TEST_DATA) + "/flashmap-stories260K-dv128";

// Token ids of the stories260K tokenizer (models/MANIFEST.md), BOS first.
const std::vector<std::vector<int32_t>> kPrompts = {
    {1},
    {1, 274, 287, 381, 261, 352, 266},            // "Tom had a red"
    {1, 291, 376, 400, 428},                      // "The little dog"
    {1, 403, 407, 261, 378, 432, 261, 280, 294},  // "Once upon a time, a cat"
};

class FlashMapInvariance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(2).release();
    auto t = load_target(kTarget, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = t->release();
  }
  static void TearDownTestSuite() {
    delete target_;
    delete backend_;
  }

  std::unique_ptr<Drafter> drafter(const std::string& dir, int steps, float noise_scale) {
    auto d =
        load_drafter(dir, *target_, {.flashmap_steps = steps, .flashmap_noise_scale = noise_scale});
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(*d) : nullptr;
  }

  static GenerateOptions options(int64_t draft_tokens, uint64_t seed = 1234) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_ids = {2};
    o.draft_tokens = draft_tokens;
    o.sampling.temperature = 0;
    o.sampling.seed = seed;
    return o;
  }

  static Backend* backend_;
  static CausalLM* target_;
};
Backend* FlashMapInvariance::backend_ = nullptr;
CausalLM* FlashMapInvariance::target_ = nullptr;

TEST_F(FlashMapInvariance, GreedySpeculativeEqualsPlain) {
  std::vector<std::vector<int32_t>> plain;
  for (const auto& prompt : kPrompts) {
    auto r = generate_plain(*target_, prompt, options(0), {}, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().message();
    plain.push_back(*r);
  }
  struct Case {
    std::string dir;
    int steps;
    float noise_scale;
  };
  const std::vector<Case> cases = {{kDrafter, 1, 1.0f},   {kDrafter, 1, 0.0f},
                                   {kDrafter, 2, 1.0f},   {kDrafter, 2, 0.0f},
                                   {kDrafterDv, 1, 1.0f}, {kDrafterDv, 2, 1.0f}};
  for (const Case& c : cases) {
    auto d = drafter(c.dir, c.steps, c.noise_scale);
    ASSERT_TRUE(d);
    for (int64_t k : {1, 3, 8}) {
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        GenerateStats st;
        auto r = generate_speculative(*target_, *d, kPrompts[i], options(k), {}, &st);
        ASSERT_TRUE(r.ok()) << r.status().message();
        EXPECT_EQ(*r, plain[i]) << c.dir << " steps " << c.steps << " noise " << c.noise_scale
                                << " k " << k << " prompt " << i;
        EXPECT_GT(st.steps, 0);
        EXPECT_LE(st.accepted, st.drafted);
      }
    }
  }
}

// Per-step drafts and acceptance of one run, from its trace (timings dropped).
std::vector<std::string> trace_steps(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> steps;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    steps.push_back(j["drafts"].dump() + " a=" + j["accepted"].dump() +
                    " s=" + j["anchor_pos"].dump());
  }
  return steps;
}

TEST_F(FlashMapInvariance, Fp8WeightsAreRefusedWithAClearError) {
  auto d = load_drafter(kDrafter, *target_, {.fp8_weights = true});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("DFlash drafters only"), std::string::npos)
      << d.status().message();
}

TEST_F(FlashMapInvariance, SeededDraftsAreReproducible) {
  const std::string dir = testing::TempDir();
  const std::string pid = std::to_string(::getpid());
  for (int steps : {1, 2}) {
    auto run = [&](uint64_t seed, float noise_scale, const std::string& name) {
      auto d = drafter(kDrafter, steps, noise_scale);  // a fresh drafter each run
      GenerateOptions o = options(8, seed);
      o.trace_path = dir + "/flashmap_trace_" + pid + "_" + name + ".jsonl";
      GenerateStats st;
      auto r = generate_speculative(*target_, *d, kPrompts[1], o, {}, &st);
      EXPECT_TRUE(r.ok()) << r.status().message();
      auto t = trace_steps(o.trace_path);
      std::filesystem::remove(o.trace_path);
      return std::pair(t, st);
    };
    const auto [a, sa] = run(7, 1.0f, "a");
    const auto [b, sb] = run(7, 1.0f, "b");
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a, b) << "steps " << steps;  // same seed: same drafts, same acceptance
    EXPECT_EQ(sa.accepted, sb.accepted);
    EXPECT_EQ(sa.position_accepted, sb.position_accepted);
    EXPECT_EQ(sa.acceptance_length(), sb.acceptance_length());
    const auto [c, sc] = run(8, 1.0f, "c");
    EXPECT_NE(a, c) << "another seed should draw other noise, hence other drafts";
    // Noise scale 0: drafts do not depend on the seed.
    const auto [z1, s1] = run(7, 0.0f, "z1");
    const auto [z2, s2] = run(8, 0.0f, "z2");
    EXPECT_EQ(z1, z2);
  }
}

}  // namespace
}  // namespace bs
