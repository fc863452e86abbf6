// DFlash drafter logits against the independent PyTorch reference (tools/reference/dflash_ref.py,
// goldens made by tools/goldens/make_dflash_goldens.py): random context features of 23 positions,
// propose at s=20 after observing 0..19, then observe 20..22 and propose at s=23.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kData = BS_TEST_DATA;
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

struct Golden {
  int64_t ctx = 0, width = 0;
  std::vector<float> feats;  // [ctx, width]
  int32_t anchors[2] = {0, 0};
  int32_t pos[2] = {0, 0};
  std::vector<float> logits[2];  // [B-1, V]
  int64_t rows = 0, vocab = 0;
};

std::vector<float> f32(const io::TensorInfo* t) {
  std::vector<float> v(static_cast<size_t>(t->numel()));
  convert_to_f32(t->dtype, t->data, v.data(), v.size());
  return v;
}

Golden read_golden(const std::string& dir) {
  Golden g;
  auto ck = io::Checkpoint::open_file(dir + "/golden.safetensors");
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  if (!ck.ok()) return g;
  const io::TensorInfo* feats = *ck->get("ctx_feats");
  g.ctx = feats->shape[0];
  g.width = feats->shape[1];
  g.feats = f32(feats);
  const io::TensorInfo* anchors = *ck->get("anchors");
  const io::TensorInfo* pos = *ck->get("anchor_pos");
  std::memcpy(g.anchors, anchors->data, sizeof(g.anchors));
  std::memcpy(g.pos, pos->data, sizeof(g.pos));
  for (int i = 0; i < 2; ++i) {
    const io::TensorInfo* l = *ck->get(i == 0 ? "logits0" : "logits1");
    g.rows = l->shape[0];
    g.vocab = l->shape[1];
    g.logits[i] = f32(l);
  }
  return g;
}

// |a - b| <= 1e-4 + 1e-4 |b| for every element; reports the worst one.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / (1e-4 + 1e-4 * std::abs(want[i]));
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " got " << got[worst_i] << " want "
                        << want[worst_i];
}

class DFlashGolden : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(DFlashGolden, MatchesReference) {
  const std::string drafter_dir = kData + "/" + GetParam().first;
  const std::string target_dir = GetParam().second;
  if (!std::filesystem::exists(drafter_dir + "/golden.safetensors") ||
      !std::filesystem::exists(target_dir + "/config.json")) {
    GTEST_SKIP() << "no test data " << drafter_dir << " / " << target_dir
                 << " (tools/goldens/make_dflash_goldens.py makes it)";
  }
  auto backend = make_cpu_backend(2);
  auto target = load_target(target_dir, *backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter = load_drafter(drafter_dir, **target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  Drafter& d = **drafter;
  EXPECT_EQ(d.family(), "dflash");
  const Golden g = read_golden(drafter_dir);
  ASSERT_EQ(g.rows, d.max_drafts());
  ASSERT_EQ(g.width,
            static_cast<int64_t>(d.target_layers().size()) * (*target)->config().hidden_size);

  // A scrambled block table: position p lives in block table[p / 16].
  const std::vector<int32_t> table = {5, 2, 7, 0, 3};
  KvPool pool = d.make_kv_pool(8);
  auto taps = [&](int64_t begin, int64_t n) {
    Tensor t = backend->empty({n, g.width});
    backend->copy_from_host(t, g.feats.data() + begin * g.width);
    return t;
  };
  auto propose = [&](int i, int64_t num_drafts) {
    Tensor logits;
    const Status s = d.propose(pool,
                               {.anchor = g.anchors[i],
                                .anchor_pos = g.pos[i],
                                .block_table = table,
                                .num_drafts = num_drafts},
                               &logits);
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok() ? backend->to_host_f32(logits) : std::vector<float>();
  };

  ASSERT_TRUE(d.observe(pool, table, taps(0, g.pos[0]), 0).ok());
  const std::vector<float> first = propose(0, g.rows);
  expect_close(first, g.logits[0], "propose at s=" + std::to_string(g.pos[0]));
  // Fewer drafts: the same rows (the whole block still runs).
  const std::vector<float> two = propose(0, 2);
  expect_close(two, std::vector<float>(first.begin(), first.begin() + 2 * g.vocab), "num_drafts=2");
  // Observing the next positions overwrites the block K/V that propose left there.
  ASSERT_TRUE(d.observe(pool, table, taps(g.pos[0], g.pos[1] - g.pos[0]), g.pos[0]).ok());
  expect_close(propose(1, g.rows), g.logits[1], "propose at s=" + std::to_string(g.pos[1]));

  // The context written in other chunks gives the same drafts.
  KvPool pool2 = d.make_kv_pool(8);
  std::swap(pool, pool2);
  ASSERT_TRUE(d.observe(pool, table, taps(0, 7), 0).ok());
  ASSERT_TRUE(d.observe(pool, table, taps(7, 1), 7).ok());
  ASSERT_TRUE(d.observe(pool, table, taps(8, g.pos[1] - 8), 8).ok());
  expect_close(propose(1, g.rows), g.logits[1], "chunked observe");
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, DFlashGolden,
    ::testing::Values(std::pair{std::string("dflash-stories260K"), kStories},
                      std::pair{std::string("dflash-stories260K-swa"), kStories},
                      std::pair{std::string("dflash-tiny-qwen3"), kData + "/tiny-qwen3"},
                      std::pair{std::string("dflash-tiny-llama"), kData + "/tiny-llama"}),
    [](const auto& info) {
      std::string n = info.param.first;
      for (char& ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });

TEST(DFlashGolden, ConfigSpellings) {
  auto backend = make_cpu_backend(1);
  auto target = load_target(kStories, *backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto a = load_drafter(kData + "/dflash-stories260K", **target, {});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ((*a)->block_size(), 8);
  EXPECT_EQ((*a)->max_drafts(), 7);
  EXPECT_EQ((*a)->target_layers(), (std::vector<int>{1, 2, 3}));
  // block_size in dflash_config, default target_layer_ids for 2 drafter layers of a 5-layer
  // target: round(1 + i * 1 / 1) = [1, 2].
  auto b = load_drafter(kData + "/dflash-stories260K-swa", **target, {});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*b)->block_size(), 6);
  EXPECT_EQ((*b)->target_layers(), (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace bs
