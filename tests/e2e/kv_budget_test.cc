// KV cache sizing against the memory a backend reports (engine/kv_budget.h): the embedded
// stories260K target (+ its DFlash drafter) on a CountingBackend over the CPU whose memory_info
// the tests set.
#include "engine/kv_budget.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "counting_backend.h"
#include "engine/scheduler.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

using test_util::CountingBackend;

constexpr int64_t kGiB = int64_t{1} << 30;

class KvBudget : public ::testing::TestWithParam<bool> {  // with the drafter?
 protected:
  void SetUp() override {
    const std::string models = std::string(BS_SOURCE_DIR) + "/models";
    cpu_ = make_cpu_backend(1);
    backend_ = std::make_unique<CountingBackend>(*cpu_);
    auto t = load_target(models + "/stories260K", *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    if (GetParam()) {
      auto d = load_drafter(models + "/stories260K-dflash", *target_, {});
      ASSERT_TRUE(d.ok()) << d.status().message();
      drafter_ = std::move(*d);
    }
  }
  // Bytes of one block in both pools, from the model configs: K and V per layer, F32 on the CPU.
  int64_t expected_block_bytes() const {
    const auto& c = target_->config();
    int64_t bytes = c.num_layers * 2 * kKvBlockSize * c.num_kv_heads * c.head_dim * 4;
    if (drafter_) {
      KvPool p = drafter_->make_kv_pool(3);
      for (const Tensor& t : p.k) bytes += static_cast<int64_t>(t.nbytes()) / 3;
      for (const Tensor& t : p.v) bytes += static_cast<int64_t>(t.nbytes()) / 3;
    }
    return bytes;
  }
  // Reports `free` of `total` bytes.
  void set_memory(int64_t free, int64_t total) {
    backend_->set_memory_info({.free = free, .total = total});
  }
  Result<KvCachePlan> plan(KvCacheRequest r) { return plan_kv_cache(*target_, drafter_.get(), r); }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<CountingBackend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

TEST_P(KvBudget, DefaultIsMaxNumSeqsWindowsWhenMemoryIsPlenty) {
  set_memory(512 * kGiB, 1024 * kGiB);
  auto p = plan({.max_num_seqs = 8});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->block_bytes, expected_block_bytes());
  EXPECT_EQ(p->window_blocks, default_kv_blocks(*target_, drafter_.get(), 1, 0));
  // stories260K's window is 512 positions = 32 blocks; the drafter's block past the anchor adds
  // one more.
  EXPECT_EQ(p->window_blocks, drafter_ ? 33 : 32);
  EXPECT_EQ(p->blocks, 8 * p->window_blocks);
  EXPECT_EQ(p->wanted_blocks, p->blocks);
  EXPECT_EQ(p->bytes, p->blocks * p->block_bytes);
  EXPECT_EQ(p->tokens(), p->blocks * kKvBlockSize);
  EXPECT_FALSE(p->shrunk);
  // A shorter context window shrinks every request's share.
  auto shorter = plan({.max_num_seqs = 8, .max_context = 128});
  ASSERT_TRUE(shorter.ok());
  EXPECT_EQ(shorter->blocks, 8 * (drafter_ ? 9 : 8));
}

TEST_P(KvBudget, DefaultShrinksToTheMemoryLeft) {
  const int64_t block = expected_block_bytes();
  const int64_t window = drafter_ ? 33 : 32;
  // total 100 units at utilization 0.9 reserves 10: what is left holds 3.5 windows.
  const int64_t total = 100 * block * window;
  set_memory(10 * block * window + 3 * block * window + block * window / 2, total);
  auto p = plan({.max_num_seqs = 8});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(p->shrunk);
  EXPECT_EQ(p->wanted_blocks, 8 * window);
  EXPECT_EQ(p->blocks, p->available_bytes / block);
  EXPECT_GE(p->blocks, 3 * window + window / 2 - 1);
  EXPECT_LE(p->blocks, 3 * window + window / 2 + 1);
  EXPECT_LE(p->bytes, p->available_bytes);
  // A scheduler given the plan allocates exactly that pool.
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 8, .kv_blocks = p->blocks});
  EXPECT_EQ(s.num_kv_blocks(), p->blocks);
}

TEST_P(KvBudget, ExplicitSizeIsKeptOrRefusedWhenItDoesNotFit) {
  const int64_t block = expected_block_bytes();
  set_memory(10 * kGiB, 10 * kGiB);  // utilization 0.9 leaves 9 GiB
  auto p = plan({.tokens = 1000});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->blocks, 63);  // ceil(1000 / 16)
  EXPECT_FALSE(p->shrunk);
  const int64_t too_many = (9 * kGiB / block + 1) * kKvBlockSize;
  auto big = plan({.tokens = too_many});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("--kv-cache-tokens"), std::string::npos)
      << big.status().message();
  // The same size fits at a higher utilization.
  EXPECT_TRUE(plan({.tokens = too_many, .memory_utilization = 1.0}).ok());
}

TEST_P(KvBudget, RefusesWhenNotOneWindowFits) {
  const int64_t block = expected_block_bytes();
  const int64_t window = drafter_ ? 33 : 32;
  set_memory(20 * block, 20 * block);  // 18 blocks left: not one 512-token window
  auto p = plan({.max_num_seqs = 8});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("--max-model-len"), std::string::npos)
      << p.status().message();
  EXPECT_GT(window, 18);
  // A 128-token window (8 or 9 blocks) fits twice.
  auto shorter = plan({.max_num_seqs = 8, .max_context = 128});
  ASSERT_TRUE(shorter.ok()) << shorter.status().message();
  EXPECT_TRUE(shorter->shrunk);
  EXPECT_EQ(shorter->blocks, 18);
}

TEST_P(KvBudget, RefusesWhenTheWeightsLeaveNoRoom) {
  set_memory(kGiB, 100 * kGiB);  // 99 GiB in use, utilization 0.9 allows 90
  auto p = plan({.max_num_seqs = 1});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("no memory left"), std::string::npos) << p.status().message();
  for (double bad : {0.0, -0.5, 1.5}) {
    auto q = plan({.max_num_seqs = 1, .memory_utilization = bad});
    ASSERT_FALSE(q.ok()) << bad;
    EXPECT_NE(q.status().message().find("not in (0, 1]"), std::string::npos);
  }
}

// The warm-up measures the worst-case step and reserves it before the KV cache: the scratch of
// a prefill chunk grows with the chunk (whole prompts: a prompt filling the window), never with
// the prompt once chunked, the mixed step (chunk and step rows in one forward) is measured too,
// and an allocation failure during the warm-up is a clear error.
TEST_P(KvBudget, WarmUpReservesTheWorstCaseStep) {
  set_memory(512 * kGiB, 1024 * kGiB);
  auto chunked =
      plan({.max_num_seqs = 4, .max_prefill_tokens = 32, .warm_up = StepWarmUp::kAlways});
  ASSERT_TRUE(chunked.ok()) << chunked.status().message();
  EXPECT_GT(chunked->scratch_bytes, 0);
  EXPECT_EQ(chunked->available_bytes, 512 * kGiB - 1024 * kGiB / 10 - chunked->scratch_bytes);
  auto whole = plan({.max_num_seqs = 4, .max_prefill_tokens = 0, .warm_up = StepWarmUp::kAlways});
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  // 511 rows of activations against 32: the whole-prompt prefill needs more.
  EXPECT_GT(whole->scratch_bytes, chunked->scratch_bytes);
  // The CPU skips the warm-up by default (host memory is not the limit there).
  auto cpu = plan({.max_num_seqs = 4});
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->scratch_bytes, 0);

  // A fresh model (whose scratch has not grown yet) cannot get memory for the warm-up, at each
  // of its allocations in turn: a clear error naming the option to lower, never an abort.
  auto t = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", *backend_);
  ASSERT_TRUE(t.ok());
  bool saw_prefill = false, saw_mixed = false;
  for (int64_t nth = 1; nth < 1000; ++nth) {
    inject_allocation_failure(nth);
    auto failed = plan_kv_cache(
        **t, nullptr,
        {.max_num_seqs = 4, .max_prefill_tokens = 300, .warm_up = StepWarmUp::kAlways});
    const bool fired = !allocation_failure_pending();
    inject_allocation_failure(0);
    if (!fired) {
      EXPECT_TRUE(failed.ok()) << failed.status().message();
      break;
    }
    ASSERT_FALSE(failed.ok()) << nth;
    EXPECT_EQ(failed.status().code(), StatusCode::kOutOfMemory);
    const std::string& m = failed.status().message();
    EXPECT_TRUE(m.find("--max-num-batched-tokens") != std::string::npos ||
                m.find("--max-model-len") != std::string::npos ||
                m.find("--max-num-seqs") != std::string::npos)
        << m;
    saw_prefill |= m.find("300 prompt tokens") != std::string::npos;
    // The scheduler's mixed step (3 sequences' rows beside the chunk) is measured too.
    saw_mixed |= m.find("worst-case mixed step (3 sequences") != std::string::npos;
  }
  EXPECT_TRUE(saw_prefill);
  EXPECT_TRUE(saw_mixed);
}

TEST_P(KvBudget, RealHostMemoryIsReported) {
  // Without an override the CPU backend reports the host's RAM: some free, no more than total.
  const MemoryInfo m = cpu_->memory_info();
  EXPECT_GT(m.total, 0);
  EXPECT_GT(m.free, 0);
  EXPECT_LE(m.free, m.total);
}

INSTANTIATE_TEST_SUITE_P(TargetAlone, KvBudget, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(WithDFlash, KvBudget, ::testing::Values(true));

}  // namespace
}  // namespace bs
