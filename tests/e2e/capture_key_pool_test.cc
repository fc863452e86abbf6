// A captured op sequence (Backend::run_captured, a CUDA graph) bakes in the sizes of the KV pools
// its ops bind: the attention prologue and kv_write drop rows whose slot lies past the pool's
// capacity. A caching allocator gives a released pool's memory to the next pool of the same size
// class, so pools of different block counts can share addresses (13 and 15 blocks of stories260K
// both round to 16 KiB per tensor on the CUDA backend). The capture keys must tell such pools
// apart, or the larger pool replays the smaller one's graph and its KV rows past the smaller
// capacity are never written: greedy DSpark (block 8: speculative pools of 13 to 15 blocks on the
// 32 held-out prompts) differed from plain decoding on the H200 once a sequence reached position
// 208. These tests run on the CPU: the keys themselves, and GraphReplayEmulator, which gives the
// CPU backend the CUDA backend's allocator reuse and graph replay (drops included).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "counting_backend.h"
#include "engine/generate.h"
#include "io/json_file.h"
#include "models/blocks/paged_kv.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs {
namespace {

// Two pools on the same memory: `small` views the first `blocks` blocks of `large`'s tensors
// (what a caching allocator does when it reuses a released pool's buffers).
KvPool first_blocks(const KvPool& large, int64_t blocks) {
  KvPool small;
  small.num_blocks = blocks;
  small.block_size = large.block_size;
  for (const Tensor& t : large.k) small.k.push_back(t.rows(0, blocks));
  for (const Tensor& t : large.v) small.v.push_back(t.rows(0, blocks));
  return small;
}

TEST(CaptureKeyPool, PoolsOfOtherSizesAtTheSameAddressesGetOtherKeys) {
  auto backend = make_cpu_backend(1);
  const KvPool large = make_kv_pool(*backend, 2, 4, 8, 15);
  const KvPool small = first_blocks(large, 13);
  ASSERT_EQ(small.k[0].data(), large.k[0].data());

  const std::vector<int32_t> table = {0, 1};
  const PagedBatch::Seq seq{.block_table = table, .start_pos = 20, .rows = 9};
  PagedBatch batch;
  batch.stage(*backend, small, {&seq, 1});
  const std::string small_key = batch.key(small);
  batch.stage(*backend, large, {&seq, 1});
  EXPECT_NE(batch.key(large), small_key);
  EXPECT_EQ(batch.key(small), small_key);  // same pool, same staging: the same key
}

// The attention launch bound follows the tables staged now, not the buffer capacity, which only
// grows: after one long sequence (the server's worst-case plan stages a whole window) short
// sequences must not launch blocks for keys none of them has. The bound is a power of two of
// blocks (at least kMinBoundBlocks) and part of the key, so a graph never replays with a bound
// below its sequences' lengths.
TEST(CaptureKeyPool, LaunchBoundFollowsTheStagedTablesNotTheCapacity) {
  auto backend = make_cpu_backend(1);
  const KvPool pool = make_kv_pool(*backend, 2, 4, 8, 600);
  const int64_t bs = pool.block_size;
  auto table_of = [](int64_t blocks) {
    std::vector<int32_t> t(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    return t;
  };
  PagedBatch batch;
  auto stage = [&](int64_t blocks) {
    const std::vector<int32_t> table = table_of(blocks);
    const PagedBatch::Seq seq{.block_table = table, .start_pos = blocks * bs - 1, .rows = 1};
    batch.stage(*backend, pool, {&seq, 1});
    return batch.key(pool);
  };
  stage(528);
  EXPECT_GE(batch.capacity(), 528);
  EXPECT_EQ(batch.max_kv_len(), batch.capacity() * bs);  // 528 blocks: bit_ceil is past it
  const std::string short_key = stage(24);
  EXPECT_GE(batch.capacity(), 528);  // the buffers keep their size
  EXPECT_EQ(batch.max_kv_len(), PagedBatch::kMinBoundBlocks * bs);
  const std::string longer_key = stage(100);
  EXPECT_EQ(batch.max_kv_len(), 128 * bs);
  EXPECT_NE(longer_key, short_key);
  EXPECT_EQ(stage(24), short_key);
  // Every staged sequence's keys stay inside the bound.
  for (int64_t blocks : {1, 63, 64, 65, 129, 300}) {
    stage(blocks);
    EXPECT_GE(batch.max_kv_len(), blocks * bs) << blocks << " blocks";
  }
}

// The CUDA backend's behaviour on the CPU, for the two parts that matter here:
// - empty() as its caching allocator: requests rounded up to a power of two (from 512 bytes),
//   released buffers reused last-in first-out per size, zero-filled;
// - run_captured as its graphs: a key's first use runs eagerly, the second is "captured" (the
//   block count of every KV pool its ops write is recorded), later uses "replay": K/V rows whose
//   slot lies past the captured pool's capacity are not written (the prologue's and kv_write's
//   capacity check), everything else runs on the current tensors (the key names them).
class GraphReplayEmulator final : public test_util::CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  ~GraphReplayEmulator() override { *alive_flag_ = false; }
  // Writes of replayed sequences that fell past the captured pool's capacity (and were dropped).
  int64_t dropped() const { return dropped_; }

  using Backend::empty;
  Tensor empty(std::initializer_list<int64_t> shape, DType dtype) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
    int64_t bin = 512;
    while (bin < bytes) bin <<= 1;
    std::vector<Tensor>& list = free_[bin];
    Tensor raw;
    if (!list.empty()) {
      raw = list.back();
      list.pop_back();
      std::memset(raw.data(), 0, static_cast<size_t>(bin));
    } else {
      raw = CountingBackend::empty({bin / 4}, DType::kF32);
    }
    auto alive = alive_flag_;
    std::shared_ptr<void> storage(raw.data(), [this, alive, raw, bin](void*) {
      if (*alive) free_[bin].push_back(raw);
    });
    return Tensor(storage, raw.data(), dtype, device(), shape);
  }

  void run_captured(const std::string& key, const std::function<void()>& ops) override {
    int& uses = uses_[key];
    ++uses;
    if (uses == 1) {
      ops();
    } else if (uses == 2) {
      capture_ = &captured_[key];
      ops();
      capture_ = nullptr;
    } else {
      replay_ = &captured_[key];
      ops();
      replay_ = nullptr;
    }
  }
  void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    writes(k_pool, v_pool, [&] { CountingBackend::kv_write(k_pool, v_pool, k, v, slots); });
  }
  void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions,
                          const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& slots) override {
    writes(k_pool, v_pool, [&] {
      CountingBackend::attention_prologue(q_out, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                          attention_scaling, k_pool, v_pool, slots);
    });
  }
  // The prologue and the attention as two ops (the attention must read the pool as written).
  void prologue_attention(const Tensor& out, const Tensor& q_scratch, const Tensor& qkv,
                          const Tensor& q_norm, const Tensor& k_norm, float eps,
                          const Tensor& positions, const Tensor& inv_freq, float attention_scaling,
                          const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                          const Tensor& block_tables, const Tensor& kv_lens, int64_t max_kv_len,
                          AttentionMask mask, float scale) override {
    Backend::prologue_attention(out, q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                attention_scaling, k_pool, v_pool, slots, block_tables, kv_lens,
                                max_kv_len, mask, scale);
  }

 private:
  using Capture = std::map<const void*, int64_t>;  // pool tensor -> its blocks at capture

  // Runs `op`, which writes rows of the two pools, as a captured graph would.
  void writes(const Tensor& k_pool, const Tensor& v_pool, const std::function<void()>& op) {
    if (capture_) {
      (*capture_)[k_pool.data()] = k_pool.dim(0);
      (*capture_)[v_pool.data()] = v_pool.dim(0);
    }
    std::vector<std::pair<Tensor, std::vector<char>>> kept;  // blocks past the captured capacity
    if (replay_) {
      for (const Tensor& pool : {k_pool, v_pool}) {
        const auto it = replay_->find(pool.data());
        if (it == replay_->end() || it->second >= pool.dim(0)) continue;
        const Tensor past = pool.rows(it->second, pool.dim(0) - it->second);
        const char* p = static_cast<const char*>(past.data());
        kept.emplace_back(past, std::vector<char>(p, p + past.nbytes()));
      }
    }
    op();
    for (auto& [past, bytes] : kept) {
      if (std::memcmp(past.data(), bytes.data(), bytes.size()) != 0) ++dropped_;
      std::memcpy(past.data(), bytes.data(), bytes.size());
    }
  }

  int64_t dropped_ = 0;  // replayed writes that the emulation dropped
  std::shared_ptr<bool> alive_flag_ = std::make_shared<bool>(true);
  std::map<int64_t, std::vector<Tensor>> free_;
  std::map<std::string, int> uses_;
  std::map<std::string, Capture> captured_;
  Capture* capture_ = nullptr;
  Capture* replay_ = nullptr;

 public:
  std::map<std::string, int>& uses() { return uses_; }
};

// The H200 failure in miniature: a decode step's sequence captured on a 13-block pool, then the
// same step of a sequence whose position 215 lies in block 14 of a 15-block pool on the same
// memory. The step's logits must be those of the step run on its own (it must not replay the
// 13-block capture, which drops the new row's K/V and attends to a zero key and value instead).
TEST(CaptureKeyPool, DecodeOnALargerPoolAtTheSameAddressesWritesItsKv) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 215; ++i) prompt.push_back(static_cast<int32_t>(3 + (i * 37) % 500));
  std::vector<int32_t> long_table;  // blocks 1 .. 14: position 215 is slot 14 * 16 + 7
  for (int32_t b = 1; b <= 14; ++b) long_table.push_back(b);
  const std::vector<int32_t> next = {42};
  // The long sequence's prefill and its decode step at position 215 on `pool`.
  const auto long_prefill = [&](CausalLM& m, KvPool& pool) {
    ForwardResult res;
    ASSERT_TRUE(
        m.forward({.tokens = prompt, .block_table = long_table, .num_logits = 0}, pool, &res).ok());
  };
  const auto long_decode = [&](CausalLM& m, KvPool& pool) {
    ForwardResult res;
    EXPECT_TRUE(
        m.forward({.tokens = next, .start_pos = 215, .block_table = long_table}, pool, &res).ok());
    return m.backend().to_host_f32(res.logits);
  };

  auto cpu = make_cpu_backend(1);
  std::vector<float> want;
  {
    auto ref = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", *cpu);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    KvPool pool = (*ref)->make_kv_pool(15);
    long_prefill(**ref, pool);
    want = long_decode(**ref, pool);
  }

  GraphReplayEmulator backend(*cpu);
  auto target = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  KvPool large = (*target)->make_kv_pool(15);
  KvPool small = first_blocks(large, 13);
  long_prefill(**target, large);
  // A short sequence in block 0 of the 13-block pool: three decode steps (eager, captured,
  // replayed) of the same shape as the long sequence's step.
  const std::vector<int32_t> short_table = {0};
  for (int64_t pos = 0; pos < 3; ++pos) {
    ForwardResult res;
    ASSERT_TRUE(
        (*target)
            ->forward({.tokens = next, .start_pos = pos, .block_table = short_table}, small, &res)
            .ok());
  }
  EXPECT_EQ(long_decode(**target, large), want);
  EXPECT_EQ(backend.dropped(), 0);
}

// eval_acceptance's greedy run of the shipped DSpark drafter (block 8) on the 32 held-out
// prompts, on the emulated graphs and allocator: speculative output equals plain output.
TEST(CaptureKeyPool, GreedyDSparkEqualsPlainUnderEmulatedGraphs) {
  auto cpu = make_cpu_backend(1);
  GraphReplayEmulator backend(*cpu);
  auto target = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", backend);
  ASSERT_TRUE(target.ok()) << target.status().message();
  auto drafter =
      load_drafter(std::string(BS_SOURCE_DIR) + "/models/stories260K-dspark", **target, {});
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  auto doc = io::read_json_file(std::string(BS_SOURCE_DIR) + "/tools/train/eval_prompts.json");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  const auto& prompts = (*doc)["prompts"];
  GenerateOptions opt;
  opt.max_tokens = 192;
  opt.sampling = {.temperature = 0};
  opt.logprobs = 0;  // the chosen tokens' log-probabilities: the verify rows' logits, exactly
  for (int i = 0; i < 32; ++i) {
    const auto ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    std::vector<float> plain_lp, spec_lp;
    auto plain = generate_plain(**target, ids, opt, nullptr, nullptr,
                                [&](const TokenLogprobs& t) { plain_lp.push_back(t.logprob); });
    auto spec = generate_speculative(**target, **drafter, ids, opt, nullptr, nullptr,
                                     [&](const TokenLogprobs& t) { spec_lp.push_back(t.logprob); });
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    // CPU rows do not depend on the row count: a verify row's logits are the decode step's.
    ASSERT_EQ(*spec, *plain) << "prompt " << i << " (" << ids.size() << " tokens)";
    ASSERT_EQ(spec_lp, plain_lp) << "prompt " << i << " (" << ids.size() << " tokens)";
  }
  // Without the pool size in the keys, verify and observe graphs captured on a 13-block pool
  // replayed on 14 and 15-block pools at the same addresses here, and wrote nothing past block 13
  // (on the CPU those rows happened to be rejected drafts; on the H200, prompt 21 differed).
  EXPECT_EQ(backend.dropped(), 0);
}

}  // namespace
}  // namespace bs
