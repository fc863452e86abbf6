// Batched decoding: CausalLM::forward_batch gives every sequence exactly what forward() gives it
// alone (the CPU backend's rows are independent, so the comparison is bit for bit), and
// generate_plain_batch gives every prompt generate_plain's output, finish reason and counts,
// greedy and sampled, with sequences stopping at different steps. Real checkpoints: stories260K
// (Llama) and the tiny Qwen3 / Llama test targets.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";
const std::string kData = BS_TEST_DATA;

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// Sequences with cached[i] positions (filled alike in every pool of `pools`, one forward of random
// tokens each) and their requests: fresh[i] random tokens with logits[i] logit rows and `taps`.
// `seqs` and `steps` keep what the requests point at.
std::vector<ForwardRequest> cached_requests(
    CausalLM& target, std::span<KvPool* const> pools, BlockAllocator& alloc, std::mt19937& rng,
    const std::vector<int64_t>& cached, const std::vector<int64_t>& fresh,
    const std::vector<int64_t>& logits, std::span<const int> taps,
    std::vector<std::unique_ptr<SequenceKv>>& seqs, std::vector<std::vector<int32_t>>& steps) {
  const int64_t vocab = target.config().vocab_size;
  for (size_t i = 0; i < cached.size(); ++i) {
    seqs.push_back(std::make_unique<SequenceKv>(alloc, kKvBlockSize));
    EXPECT_TRUE(seqs[i]->reserve(cached[i] + fresh[i]).ok());
    const std::vector<int32_t> history = random_tokens(rng, cached[i], vocab);
    steps.push_back(random_tokens(rng, fresh[i], vocab));
    for (KvPool* pool : cached[i] > 0 ? pools : std::span<KvPool* const>()) {
      ForwardResult r;
      EXPECT_TRUE(target
                      .forward({.tokens = history,
                                .start_pos = 0,
                                .block_table = seqs[i]->block_table(),
                                .num_logits = 0},
                               *pool, &r)
                      .ok());
    }
  }
  std::vector<ForwardRequest> reqs;
  for (size_t i = 0; i < cached.size(); ++i) {
    reqs.push_back({.tokens = steps[i],
                    .start_pos = cached[i],
                    .block_table = seqs[i]->block_table(),
                    .num_logits = logits[i],
                    .tap_layers = taps});
  }
  return reqs;
}

class Batch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(GetParam() + "/config.json")) {
      GTEST_SKIP() << GetParam() << " not present";
    }
    backend_ = make_cpu_backend(2);
    auto t = load_target(GetParam(), *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
};

TEST_P(Batch, ForwardBatchEqualsForwardPerSequence) {
  const auto& c = target_->config();
  std::mt19937 rng(7);
  const int64_t blocks = 64;
  KvPool batched = target_->make_kv_pool(blocks), single = target_->make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  // Three sequences: a prompt of 9 (prefill), one with 20 cached positions getting 4 more
  // (verify-like), one with 33 cached getting 1 (decode); each cache first filled identically in
  // both pools by single forwards.
  const std::vector<int64_t> cached = {0, 20, 33}, fresh = {9, 4, 1}, logits = {1, 4, 1};
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<std::vector<int32_t>> step;
  const std::vector<int> taps = {0, static_cast<int>(c.num_layers - 1)};
  KvPool* const pools[] = {&batched, &single};
  const std::vector<ForwardRequest> reqs =
      cached_requests(*target_, pools, alloc, rng, cached, fresh, logits, taps, seqs, step);
  BatchForwardResult batch;
  ASSERT_TRUE(target_->forward_batch(reqs, batched, &batch).ok());
  ASSERT_EQ(batch.seqs.size(), reqs.size());
  std::vector<std::vector<float>> batch_logits, batch_taps;
  for (const auto& r : batch.seqs) {
    batch_logits.push_back(backend_->to_host_f32(r.logits));
    batch_taps.push_back(backend_->to_host_f32(r.taps));
  }
  const auto all = backend_->to_host_f32(batch.logits);
  EXPECT_EQ(all.size(), static_cast<size_t>(6 * c.vocab_size));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ForwardResult alone;
    ASSERT_TRUE(target_->forward(reqs[i], single, &alone).ok());
    EXPECT_EQ(backend_->to_host_f32(alone.logits), batch_logits[i]) << "sequence " << i;
    EXPECT_EQ(backend_->to_host_f32(alone.taps), batch_taps[i]) << "sequence " << i;
  }
}

// A batch whose sequences have unequal rows (a served speculative step where some verify blocks
// are shorter): every run of consecutive sequences with equal rows shares one attention call per
// layer (rows 4, 4, 4, 2, 4, 4: three calls, not six), and each sequence's logits and taps are
// still forward()'s alone, bit for bit.
TEST_P(Batch, UnevenRowsShareAttentionCallsByRuns) {
  test_util::CountingBackend counter(*backend_);
  auto loaded = load_target(GetParam(), counter);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  CausalLM& target = **loaded;
  const auto& c = target.config();
  std::mt19937 rng(11);
  const int64_t blocks = 64;
  KvPool batched = target.make_kv_pool(blocks), single = target.make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  const std::vector<int64_t> cached = {5, 17, 0, 30, 9, 21}, fresh = {4, 4, 4, 2, 4, 4};
  const std::vector<int> taps = {static_cast<int>(c.num_layers - 1)};
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<std::vector<int32_t>> step;
  KvPool* const pools[] = {&batched, &single};
  const std::vector<ForwardRequest> reqs =
      cached_requests(target, pools, alloc, rng, cached, fresh, fresh, taps, seqs, step);
  counter.reset();
  BatchForwardResult batch;
  ASSERT_TRUE(target.forward_batch(reqs, batched, &batch).ok());
  EXPECT_EQ(counter.batched_attention_calls(), 2 * c.num_layers);  // sequences 0-2 and 4-5
  EXPECT_EQ(counter.attention_calls(), c.num_layers);              // sequence 3
  std::vector<std::vector<float>> batch_logits, batch_taps;
  for (const auto& r : batch.seqs) {
    batch_logits.push_back(counter.to_host_f32(r.logits));
    batch_taps.push_back(counter.to_host_f32(r.taps));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ForwardResult alone;
    ASSERT_TRUE(target.forward(reqs[i], single, &alone).ok());
    EXPECT_EQ(counter.to_host_f32(alone.logits), batch_logits[i]) << "sequence " << i;
    EXPECT_EQ(counter.to_host_f32(alone.taps), batch_taps[i]) << "sequence " << i;
  }
}

// The scheduler's mixed step (engine/scheduler.h): one-row decode sequences first, then a prompt
// chunk without logits and a whole prompt with its last row's. The decode rows share one batched
// attention call per layer, each prompt has its own (the prefill path); the logits and the KV
// written (the chunk's only output) equal separate forwards bit for bit.
TEST_P(Batch, MixedStepEqualsSeparateForwards) {
  test_util::CountingBackend counter(*backend_);
  auto loaded = load_target(GetParam(), counter);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  CausalLM& target = **loaded;
  const auto& c = target.config();
  std::mt19937 rng(13);
  const int64_t blocks = 64;
  KvPool mixed = target.make_kv_pool(blocks), single = target.make_kv_pool(blocks);
  for (KvPool* pool : {&mixed, &single}) {
    for (auto* ts : {&pool->k, &pool->v}) {
      for (const Tensor& x : *ts) counter.fill_zero(x);
    }
  }
  BlockAllocator alloc(blocks);
  // Five decoding sequences, a prompt 16 tokens in getting a 40-token chunk, a fresh 23-token one.
  const std::vector<int64_t> cached = {7, 12, 30, 3, 18, 16, 0}, fresh = {1, 1, 1, 1, 1, 40, 23},
                             logits = {1, 1, 1, 1, 1, 0, 1};
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<std::vector<int32_t>> step;
  KvPool* const pools[] = {&mixed, &single};
  const std::vector<ForwardRequest> reqs =
      cached_requests(target, pools, alloc, rng, cached, fresh, logits, {}, seqs, step);
  counter.reset();
  BatchForwardResult batch;
  ASSERT_TRUE(target.forward_batch(reqs, mixed, &batch).ok());
  EXPECT_EQ(counter.batched_attention_calls(), c.num_layers);  // the five decode rows
  EXPECT_EQ(counter.attention_calls(), 2 * c.num_layers);      // each prompt
  ASSERT_EQ(batch.logits.dim(0), 6);
  std::vector<std::vector<float>> batch_logits;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batch.seqs[i].logits.defined(), logits[i] > 0) << "sequence " << i;
    batch_logits.push_back(logits[i] ? counter.to_host_f32(batch.seqs[i].logits)
                                     : std::vector<float>());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ForwardResult alone;
    ASSERT_TRUE(target.forward(reqs[i], single, &alone).ok());
    if (logits[i]) {
      EXPECT_EQ(counter.to_host_f32(alone.logits), batch_logits[i]) << "sequence " << i;
    }
  }
  for (size_t l = 0; l < mixed.k.size(); ++l) {
    EXPECT_EQ(counter.to_host_f32(mixed.k[l]), counter.to_host_f32(single.k[l])) << "K " << l;
    EXPECT_EQ(counter.to_host_f32(mixed.v[l]), counter.to_host_f32(single.v[l])) << "V " << l;
  }
}

TEST_P(Batch, GenerateBatchEqualsGeneratePerPrompt) {
  const auto& c = target_->config();
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts = {random_tokens(rng, 5, c.vocab_size),
                                               random_tokens(rng, 17, c.vocab_size),
                                               random_tokens(rng, 1, c.vocab_size)};
  for (const float temperature : {0.0f, 0.8f}) {
    GenerateOptions o;
    o.max_tokens = 24;
    o.sampling.temperature = temperature;
    o.sampling.seed = 5;
    // A stop token that some sequence produces mid-way (taken from a plain run), so that the
    // sequences finish at different steps.
    auto probe = generate_plain(*target_, prompts[1], o, nullptr, nullptr);
    ASSERT_TRUE(probe.ok());
    o.stop_ids = {(*probe)[6]};
    std::vector<GenerateStats> stats;
    auto batch = generate_plain_batch(*target_, prompts, o, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    ASSERT_EQ(batch->size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateStats alone_stats;
      auto alone = generate_plain(*target_, prompts[i], o, nullptr, &alone_stats);
      ASSERT_TRUE(alone.ok());
      EXPECT_EQ((*batch)[i], *alone) << "prompt " << i << " T=" << temperature;
      EXPECT_EQ(stats[i].finish, alone_stats.finish) << "prompt " << i;
      EXPECT_EQ(stats[i].generated_tokens, alone_stats.generated_tokens) << "prompt " << i;
      EXPECT_EQ(stats[i].prompt_tokens, alone_stats.prompt_tokens) << "prompt " << i;
    }
    EXPECT_EQ(stats[1].finish, FinishReason::kStop);
  }
}

// Prompts admitted together prefill in one forward, so each request's own prefill time is the
// whole group's: the batch's prefill time is the scheduler's, not their sum (summed, 8 long prompts
// with 2 new tokens each gave `bench --batch` a negative decode time on the H200).
TEST_P(Batch, BatchTimesAddUpToTheWallTime) {
  const auto& c = target_->config();
  std::mt19937 rng(11);
  GenerateOptions o;
  o.max_tokens = 2;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_tokens(rng, 200, c.vocab_size));
  std::vector<GenerateStats> stats;
  const auto t0 = std::chrono::steady_clock::now();
  auto batch = generate_plain_batch(*target_, prompts, o, &stats);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  for (const GenerateStats& s : stats) {
    EXPECT_GT(s.prefill_seconds, 0.0);
    EXPECT_GE(s.decode_seconds, 0.0);
    EXPECT_LE(s.prefill_seconds + s.decode_seconds, wall * 1.001);
  }
}

TEST_P(Batch, ContextWindowAndBadInput) {
  const auto& c = target_->config();
  std::mt19937 rng(9);
  GenerateOptions o;
  o.max_tokens = 50;
  o.max_context = 30;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(rng, 25, c.vocab_size),
                                                     random_tokens(rng, 3, c.vocab_size)};
  std::vector<GenerateStats> stats;
  auto batch = generate_plain_batch(*target_, prompts, o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateStats alone_stats;
    auto alone = generate_plain(*target_, prompts[i], o, nullptr, &alone_stats);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*batch)[i], *alone);
    EXPECT_EQ(stats[i].finish, FinishReason::kContext);
  }
  // A bad prompt names its index; an empty batch and mismatched taps are refused.
  std::vector<std::vector<int32_t>> bad = prompts;
  bad[1][0] = static_cast<int32_t>(c.vocab_size);
  auto r = generate_plain_batch(*target_, bad, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prompt 1"), std::string::npos) << r.status().message();
  EXPECT_FALSE(generate_plain_batch(*target_, {}, o, nullptr).ok());
  KvPool pool = target_->make_kv_pool(8);
  BlockAllocator alloc(8);
  SequenceKv a(alloc, kKvBlockSize), b(alloc, kKvBlockSize);
  ASSERT_TRUE(a.reserve(4).ok() && b.reserve(4).ok());
  const std::vector<int32_t> toks = {1, 2};
  const std::vector<int> tap0 = {0};
  std::vector<ForwardRequest> reqs = {{.tokens = toks,
                                       .start_pos = 0,
                                       .block_table = a.block_table(),
                                       .num_logits = 1,
                                       .tap_layers = tap0},
                                      {.tokens = toks,
                                       .start_pos = 0,
                                       .block_table = b.block_table(),
                                       .num_logits = 1,
                                       .tap_layers = {}}};
  BatchForwardResult res;
  const Status st = target_->forward_batch(reqs, pool, &res);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("same layers"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Targets, Batch,
                         ::testing::Values(kStories, kData + "/tiny-qwen3", kData + "/tiny-llama"),
                         [](const auto& info) {
                           std::string n = std::filesystem::path(info.param).filename().string();
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace bs
