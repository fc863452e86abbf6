// DSpark and DFlash2 drafters against their independent PyTorch references
// (tools/reference/dspark_ref.py, dflash2_ref.py; goldens by tools/goldens/make_dspark_goldens.py
// and make_dflash2_goldens.py): random context features of 23 positions, propose at s=20 after
// observing 0..19, then observe 20..22 and propose at s=23. Checked: the logits rows each greedy
// draft was chosen from (DSpark: U + Markov bias, -inf outside a top-k; DFlash2: the selector
// scores scattered over -inf), the greedy drafts, the confidences, fewer drafts = a prefix, and a
// batched propose_draw of two sequences = each alone.
#include <gtest/gtest.h>

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

std::vector<float> f32(const io::TensorInfo* t) {
  std::vector<float> v(static_cast<size_t>(t->numel()));
  convert_to_f32(t->dtype, t->data, v.data(), v.size());
  return v;
}
std::vector<int32_t> i32(const io::TensorInfo* t) {
  std::vector<int32_t> v(static_cast<size_t>(t->numel()));
  std::memcpy(v.data(), t->data, v.size() * sizeof(int32_t));
  return v;
}

// |a - b| <= 1e-4 + 1e-4 |b| for every finite element, equal infinities elsewhere.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      ASSERT_EQ(got[i], want[i]) << what << ": element " << i;
      continue;
    }
    const double err = std::abs(got[i] - want[i]) / (1e-4 + 1e-4 * std::abs(want[i]));
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " got " << got[worst_i] << " want "
                        << want[worst_i];
}

struct Case {
  std::string dir, target, family;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.dir; }
};

// What one golden propose expects.
struct Expected {
  std::vector<float> rows;      // [k, V]
  std::vector<int32_t> drafts;  // [k]
  std::vector<float> survival;  // [k]: a_j (DSpark) or empty
};

class RelativeGolden : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    dir_ = kData + "/" + c.dir;
    if (!std::filesystem::exists(dir_ + "/golden.safetensors") ||
        !std::filesystem::exists(c.target + "/config.json")) {
      GTEST_SKIP() << "no test data " << dir_;
    }
    backend_ = make_cpu_backend(2);
    auto target = load_target(c.target, *backend_);
    ASSERT_TRUE(target.ok()) << target.status().message();
    target_ = std::move(*target);
    auto drafter = load_drafter(dir_, *target_, {});
    ASSERT_TRUE(drafter.ok()) << drafter.status().message();
    drafter_ = std::move(*drafter);
    auto ck = io::Checkpoint::open_file(dir_ + "/golden.safetensors");
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    golden_ = std::make_unique<io::Checkpoint>(std::move(*ck));
    const io::TensorInfo* feats = *golden_->get("ctx_feats");
    width_ = feats->shape[1];
    feats_ = f32(feats);
    anchors_ = i32(*golden_->get("anchors"));
    pos_ = i32(*golden_->get("anchor_pos"));
    vocab_ = target_->config().vocab_size;
  }

  Expected expected(int i) {
    Expected e;
    const std::string n = std::to_string(i);
    e.drafts = i32(*golden_->get("drafts" + n));
    const int64_t k = static_cast<int64_t>(e.drafts.size());
    if (GetParam().family == "dspark") {
      e.rows = f32(*golden_->get("biased" + n));
      const std::vector<float> c = f32(*golden_->get("conf" + n));
      double a = 1;
      for (float ci : c) e.survival.push_back(static_cast<float>(a *= ci));
    } else {
      const std::vector<int32_t> cands = i32(*golden_->get("cands" + n));
      const std::vector<float> scores = f32(*golden_->get("scores" + n));
      const int64_t t = static_cast<int64_t>(cands.size()) / k;
      e.rows.assign(static_cast<size_t>(k * vocab_), -INFINITY);
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t c = 0; c < t; ++c) e.rows[j * vocab_ + cands[j * t + c]] = scores[j * t + c];
      }
    }
    return e;
  }

  Tensor taps(int64_t begin, int64_t n) {
    Tensor t = backend_->empty({n, width_});
    backend_->copy_from_host(t, feats_.data() + begin * width_);
    return t;
  }

  std::vector<float> propose(KvPool& pool, std::span<const int32_t> table, int i, int64_t k) {
    Tensor logits;
    const Status s = drafter_->propose(
        pool, {.anchor = anchors_[i], .anchor_pos = pos_[i], .block_table = table, .num_drafts = k},
        &logits);
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok() ? backend_->to_host_f32(logits) : std::vector<float>();
  }

  // Greedy propose_draw of several requests; returns the drafts of each, and the survival
  // when the drafter has a confidence head.
  void draw(KvPool& pool, std::span<const ProposeRequest> reqs,
            std::vector<std::vector<int32_t>>* drafts, std::vector<std::vector<float>>* survival) {
    std::vector<DraftDraw> draws;
    for (const ProposeRequest& r : reqs) {
      draws.push_back({.ids = backend_->empty({r.num_drafts}, DType::kI32)});
    }
    const Status s =
        drafter_->propose_draw(pool, reqs, draws, drafter_->has_confidence() ? survival : nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    drafts->clear();
    for (const DraftDraw& d : draws) {
      std::vector<int32_t> ids(static_cast<size_t>(d.ids.numel()));
      backend_->copy_to_host(ids.data(), d.ids);
      drafts->push_back(ids);
    }
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  std::unique_ptr<io::Checkpoint> golden_;
  int64_t width_ = 0, vocab_ = 0;
  std::vector<float> feats_;
  std::vector<int32_t> anchors_, pos_;
};

TEST_P(RelativeGolden, MatchesReference) {
  Drafter& d = *drafter_;
  EXPECT_EQ(d.family(), GetParam().family);
  EXPECT_TRUE(d.draws_drafts());
  EXPECT_EQ(d.has_confidence(), GetParam().family == "dspark");
  const Expected e0 = expected(0), e1 = expected(1);
  const int64_t k = static_cast<int64_t>(e0.drafts.size());
  ASSERT_EQ(k, d.max_drafts());
  // DSpark's shifted rows: B rows give B drafts; DFlash2: B - 1.
  EXPECT_EQ(d.max_drafts(), d.block_size() - (GetParam().family == "dspark" ? 0 : 1));

  const std::vector<int32_t> table = {5, 2, 7, 0, 3};
  KvPool pool = d.make_kv_pool(8);
  ASSERT_TRUE(d.observe(pool, table, taps(0, pos_[0]), 0).ok());
  expect_close(propose(pool, table, 0, k), e0.rows, "propose at s=20");
  // Fewer drafts: the first rows of the same chain.
  const std::vector<float> two = propose(pool, table, 0, 2);
  expect_close(two, std::vector<float>(e0.rows.begin(), e0.rows.begin() + 2 * vocab_),
               "2 drafts at s=20");

  std::vector<std::vector<int32_t>> drafts;
  std::vector<std::vector<float>> survival;
  const ProposeRequest r0{
      .anchor = anchors_[0], .anchor_pos = pos_[0], .block_table = table, .num_drafts = k};
  draw(pool, {&r0, 1}, &drafts, &survival);
  EXPECT_EQ(drafts[0], e0.drafts);
  if (d.has_confidence()) expect_close(survival[0], e0.survival, "survival at s=20");

  ASSERT_TRUE(d.observe(pool, table, taps(pos_[0], pos_[1] - pos_[0]), pos_[0]).ok());
  expect_close(propose(pool, table, 1, k), e1.rows, "propose at s=23");
  const ProposeRequest r1{
      .anchor = anchors_[1], .anchor_pos = pos_[1], .block_table = table, .num_drafts = k};
  draw(pool, {&r1, 1}, &drafts, &survival);
  EXPECT_EQ(drafts[0], e1.drafts);
  if (d.has_confidence()) expect_close(survival[0], e1.survival, "survival at s=23");
}

TEST_P(RelativeGolden, BatchedDrawEqualsEachAlone) {
  Drafter& d = *drafter_;
  const Expected e0 = expected(0), e1 = expected(1);
  const int64_t k = d.max_drafts();
  // Two sequences in one pool: A has observed 0..19, B 0..22.
  const std::vector<int32_t> ta = {5, 2, 7}, tb = {1, 4, 6};
  KvPool pool = d.make_kv_pool(8);
  ASSERT_TRUE(d.observe(pool, ta, taps(0, pos_[0]), 0).ok());
  ASSERT_TRUE(d.observe(pool, tb, taps(0, pos_[1]), 0).ok());
  const ProposeRequest reqs[] = {
      {.anchor = anchors_[0], .anchor_pos = pos_[0], .block_table = ta, .num_drafts = k},
      {.anchor = anchors_[1], .anchor_pos = pos_[1], .block_table = tb, .num_drafts = k - 1}};
  std::vector<std::vector<int32_t>> drafts;
  std::vector<std::vector<float>> survival;
  draw(pool, reqs, &drafts, &survival);
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_EQ(drafts[0], e0.drafts);
  EXPECT_EQ(drafts[1], std::vector<int32_t>(e1.drafts.begin(), e1.drafts.end() - 1));
  if (d.has_confidence()) {
    expect_close(survival[0], e0.survival, "batched survival, sequence A");
    expect_close(survival[1], std::vector<float>(e1.survival.begin(), e1.survival.end() - 1),
                 "batched survival, sequence B");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Drafters, RelativeGolden,
    ::testing::Values(Case{"dspark-stories260K", kStories, "dspark"},
                      Case{"dspark-tiny-qwen3", kData + "/tiny-qwen3", "dspark"},
                      Case{"dflash2-stories260K", kStories, "dflash2"},
                      Case{"dflash2-tiny-qwen3", kData + "/tiny-qwen3", "dflash2"}),
    [](const auto& info) {
      std::string n = info.param.dir;
      for (char& ch : n) {
        if (ch == '-') ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace bs
