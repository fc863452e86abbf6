// FlashMap draft logits against tools/reference/flashmap_ref.py (float64, dense, unfolded), from
// tests/data/flashmap-goldens/golden.safetensors made by tools/goldens/make_flashmap_goldens.py for
// the random-init checkpoints tests/data/flashmap-stories260K{,-dv128} on the stories260K target.
// The noise is injected (the goldens hold it), so the comparison is independent of the RNG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/drafters/flashmap.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kTarget = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kDrafter = std::string(BS_TEST_DATA) + "/flashmap-stories260K";
const std::string kDrafterDv = std::string(BS_TEST_DATA) + "/flashmap-stories260K-dv128";
const std::string kGolden = std::string(BS_TEST_DATA) + "/flashmap-goldens/golden.safetensors";
constexpr int64_t kContext = 11;  // positions 0..10 observed; the anchor sits at 11
constexpr int64_t kB = 8, kV = 512, kHt = 64;

class FlashMapGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(2);
    auto t = load_target(kTarget, *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    auto g = io::Checkpoint::open_file(kGolden);
    ASSERT_TRUE(g.ok()) << g.status().message();
    golden_ = std::make_unique<io::Checkpoint>(std::move(*g));
  }

  std::vector<float> f32(const std::string& name) {
    auto info = golden_->get(name);
    EXPECT_TRUE(info.ok()) << name;
    if (!info.ok()) return {};
    std::vector<float> out((*info)->numel());
    EXPECT_EQ((*info)->dtype, DType::kF32);
    std::memcpy(out.data(), (*info)->data, out.size() * sizeof(float));
    return out;
  }
  std::vector<int32_t> i32(const std::string& name) {
    auto info = golden_->get(name);
    EXPECT_TRUE(info.ok()) << name;
    if (!info.ok()) return {};
    std::vector<int32_t> out((*info)->numel());
    std::memcpy(out.data(), (*info)->data, out.size() * sizeof(int32_t));
    return out;
  }

  std::unique_ptr<FlashMapDrafter> load(const std::string& dir, int steps, bool fold = true,
                                        float noise_scale = 1.0f) {
    auto cfg = io::read_json_file(dir + "/config.json");
    EXPECT_TRUE(cfg.ok());
    DrafterOptions opt{.flashmap_steps = steps, .flashmap_noise_scale = noise_scale};
    auto d = load_flashmap_drafter(dir, *cfg, *target_, opt, {.fold_one_jump = fold});
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(*d) : nullptr;
  }

  // Observes the golden taps (in two calls, positions [0, 6) then [6, 11)) and drafts after the
  // golden anchor with `noise` injected (none: the seeded draw).
  std::vector<float> draft(FlashMapDrafter& d, const std::vector<float>* noise) {
    KvPool kv = d.make_kv_pool(4);
    const std::vector<int32_t> table{2, 0, 3, 1};
    const std::vector<float> taps = f32("taps");
    const int64_t cols = 3 * kHt;
    for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 6}, {6, kContext - 6}}) {
      Tensor t = backend_->empty({n, cols}, DType::kF32);
      backend_->copy_from_host(t, taps.data() + start * cols);
      const Status st = d.observe(kv, table, t, start);
      EXPECT_TRUE(st.ok()) << st.message();
    }
    if (noise) d.inject_noise(*noise);
    Tensor logits;
    ProposeRequest req{.anchor = i32("anchor")[0],
                       .anchor_pos = kContext,
                       .block_table = table,
                       .num_drafts = kB,
                       .noise_seed = 99};
    const Status st = d.propose(kv, req, &logits);
    EXPECT_TRUE(st.ok()) << st.message();
    return backend_->to_host_f32(logits);
  }

  // Finite entries within rel * max|golden|; -inf exactly where the golden has it.
  void expect_logits(const std::vector<float>& got, const std::string& name, double rel) {
    const std::vector<float> want = f32(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double scale = 0, worst = 0;
    for (float w : want)
      if (std::isfinite(w)) scale = std::max(scale, static_cast<double>(std::abs(w)));
    for (size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(want[i])) {
        EXPECT_EQ(got[i], want[i]) << name << " " << i;
        continue;
      }
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    std::printf("%s: max |diff| %.3g, max |logit| %.3g\n", name.c_str(), worst, scale);
    EXPECT_LE(worst, rel * scale) << name << ": max |diff| " << worst << ", max |logit| " << scale;
    // Same greedy drafts.
    for (int64_t r = 0; r < kB; ++r) {
      const auto row = want.begin() + r * kV, grow = got.begin() + r * kV;
      EXPECT_EQ(std::max_element(grow, grow + kV) - grow, std::max_element(row, row + kV) - row)
          << name << " row " << r;
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<io::Checkpoint> golden_;
};

TEST_F(FlashMapGolden, OneJumpFolded) {
  auto d = load(kDrafter, 1);
  ASSERT_TRUE(d && d->folded());
  const std::vector<float> x0 = f32("noise_vocab");
  auto z = d->eigen_noise_from_vocab(x0);
  ASSERT_TRUE(z.ok()) << z.status().message();
  expect_logits(draft(*d, &*z), "logits_j1", 2e-5);
  // The C++ canonical eigenbasis is the reference's: the reference's eigenbasis noise works too.
  const std::vector<float> z_ref = f32("noise_eig");
  ASSERT_EQ(z->size(), z_ref.size());
  for (size_t i = 0; i < z_ref.size(); ++i) EXPECT_NEAR((*z)[i], z_ref[i], 1e-3) << i;
  expect_logits(draft(*d, &z_ref), "logits_j1", 2e-5);
}

TEST_F(FlashMapGolden, OneJumpExact) {
  auto d = load(kDrafter, 1, /*fold=*/false);
  ASSERT_TRUE(d && !d->folded());
  const std::vector<float> x0 = f32("noise_vocab");
  expect_logits(draft(*d, &x0), "logits_j1", 2e-5);
}

TEST_F(FlashMapGolden, SeveralJumps) {
  const std::vector<float> x0 = f32("noise_vocab");
  for (int steps : {2, 3}) {
    auto d = load(kDrafter, steps);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->num_steps(), steps);
    EXPECT_FALSE(d->folded());
    expect_logits(draft(*d, &x0), "logits_j" + std::to_string(steps), 2e-5);
  }
}

TEST_F(FlashMapGolden, ZeroNoiseIsDeterministic) {
  // Noise scale 0: the seeded draw (any seed) is zero, folded or not.
  for (bool fold : {true, false}) {
    auto d = load(kDrafter, 1, fold, 0.0f);
    ASSERT_TRUE(d);
    expect_logits(draft(*d, nullptr), "logits_j1_zero", 2e-5);
  }
}

TEST_F(FlashMapGolden, DraftVocabulary) {
  const std::vector<float> x0 = f32("noise_vocab");
  const std::vector<int32_t> hot = i32("dv_hot_ids");
  {
    auto d = load(kDrafterDv, 1);
    ASSERT_TRUE(d && d->folded());
    EXPECT_EQ(d->draft_vocab(), hot);
    auto z = d->eigen_noise_from_vocab(x0);
    ASSERT_TRUE(z.ok());
    expect_logits(draft(*d, &*z), "dv_logits_j1", 2e-5);
  }
  {
    auto d = load(kDrafterDv, 2);
    ASSERT_TRUE(d);
    expect_logits(draft(*d, &x0), "dv_logits_j2", 2e-5);
  }
}

// propose_batch: every block's rows equal its propose alone (folded one jump, the exact
// several-jump path, the draft vocabulary), with different contexts, anchors, seeds and draft
// counts; a context shorter than the block takes the one-block path inside the batch.
TEST_F(FlashMapGolden, BatchedProposeMatchesSingleProposes) {
  struct Case {
    std::string dir;
    int steps;
    bool fold;
  };
  for (const Case& c :
       {Case{kDrafter, 1, true}, Case{kDrafter, 2, false}, Case{kDrafterDv, 1, true}}) {
    SCOPED_TRACE(c.dir + " steps " + std::to_string(c.steps));
    auto d = load(c.dir, c.steps, c.fold);
    ASSERT_TRUE(d);
    KvPool kv = d->make_kv_pool(16);
    const int64_t cols = 3 * kHt;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<std::vector<int32_t>> tables{{2, 0, 9}, {5, 1, 3}, {7, 4, 8}, {6, 10, 11}};
    const std::vector<int64_t> anchor_pos{11, 30, 20, 3};
    std::vector<ProposeRequest> reqs;
    for (size_t r = 0; r < tables.size(); ++r) {
      std::vector<float> taps(static_cast<size_t>(anchor_pos[r] * cols));
      for (float& x : taps) x = normal(rng);
      Tensor t = backend_->empty({anchor_pos[r], cols}, DType::kF32);
      backend_->copy_from_host(t, taps.data());
      ASSERT_TRUE(d->observe(kv, tables[r], t, 0).ok());
      reqs.push_back({.anchor = static_cast<int32_t>(17 + 40 * r),
                      .anchor_pos = anchor_pos[r],
                      .block_table = tables[r],
                      .num_drafts = r == 1 ? 5 : kB,
                      .noise_seed = 1000 + r});
    }
    // The first three (long contexts: one batched pass), then all four (one short context).
    for (const size_t n : {size_t{3}, size_t{4}}) {
      SCOPED_TRACE("batch of " + std::to_string(n));
      const std::span<const ProposeRequest> batch(reqs.data(), n);
      std::vector<std::vector<float>> single;
      for (const ProposeRequest& req : batch) {
        Tensor logits;
        ASSERT_TRUE(d->propose(kv, req, &logits).ok());
        single.push_back(backend_->to_host_f32(logits));
      }
      Tensor logits;
      const Status st = d->propose_batch(kv, batch, &logits);
      ASSERT_TRUE(st.ok()) << st.message();
      const std::vector<float> all = backend_->to_host_f32(logits);
      ASSERT_EQ(static_cast<int64_t>(all.size()), static_cast<int64_t>(n) * kB * kV);
      for (size_t r = 0; r < n; ++r) {
        for (size_t i = 0; i < single[r].size(); ++i) {
          const float want = single[r][i], got = all[r * kB * kV + i];
          if (!std::isfinite(want)) {
            ASSERT_EQ(got, want) << "block " << r << " entry " << i;
          } else {
            ASSERT_NEAR(got, want, 1e-4 * (1 + std::abs(want))) << "block " << r << " entry " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace bs
