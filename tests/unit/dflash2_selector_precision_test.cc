// DFlash2's selector takes its top-16 over fp32 unary values (specs/dflash.md §5.4): the drafter
// must not round its LM-head rows to the backend's activation dtype. On the GPU (BF16) that
// rounding turned near-equal logits (the stories260K byte tokens, within ~2e-3 of each other)
// into exact ties that topk gave to the lowest ids, so the walk drafted tokens 7, 9, 17 where the
// fp32 order gives 225 / 119 (CudaRelatives). Checked on the CPU through a backend that reports
// BF16 activations and records what the drafter allocates.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "engine/kv_cache.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

TEST(DFlash2SelectorPrecision, LmHeadRowsStayF32UnderBf16Activations) {
  auto cpu = make_cpu_backend(1);
  test_util::CountingBackend b(*cpu);
  b.pose_activation_dtype(DType::kBF16);
  auto target = load_target(kStories, b);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter = load_drafter(std::string(BS_TEST_DATA) + "/dflash2-stories260K", **target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  Drafter& d = **drafter;
  const int64_t V = (*target)->config().vocab_size;

  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(30);
  for (auto& t : prompt) t = tok(rng);
  prompt[0] = 1;
  const int64_t P = static_cast<int64_t>(prompt.size()), blocks = 4;
  KvPool tpool = (*target)->make_kv_pool(blocks), dpool = d.make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  SequenceKv seq(alloc, kKvBlockSize);
  ASSERT_TRUE(seq.reserve(P + d.block_size()).ok());
  ASSERT_TRUE(test_util::prefill_and_observe(**target, d, prompt, seq, tpool, dpool).ok());

  b.reset();  // the propose's own allocations from here
  Tensor rows;
  const ProposeRequest req{.anchor = prompt.back(),
                           .anchor_pos = P - 1,
                           .block_table = seq.block_table(),
                           .num_drafts = d.max_drafts()};
  ASSERT_TRUE(d.propose(dpool, req, &rows).ok());
  int64_t f32_rows = 0;
  for (const auto& a : b.allocations()) {
    if (a.shape.size() != 2 || a.shape[1] != V) continue;
    EXPECT_NE(a.dtype, DType::kBF16) << "a BF16 [" << a.shape[0] << ", " << V
                                     << "] buffer: the LM-head rows before the selector's top-k";
    if (a.dtype == DType::kF32) ++f32_rows;
  }
  EXPECT_GE(f32_rows, 2) << "the LM-head rows and the chain rows, both F32";
}

}  // namespace
}  // namespace bs
