// Batched speculative prefill (Scheduler, detail::prefill_batch): speculative requests admitted
// together whose prompts fit the step's prefill budget go through one target forward_batch (the
// drafter's layers tapped), one drafter observe_batch and one read-back of their first tokens.
// Every request's output (tokens, streamed tokens, logprobs, finish reason, counts, acceptance
// statistics) equals generate_speculative's for it alone, greedy and seeded sampling, for the
// DFlash, DSpark, DFlash2 and FlashMap test drafters on the stories260K target (CPU, where rows do
// not depend on what shares a forward), and for the shipped trained DFlash2 and FlashMap drafters
// (long accepted runs: a wrong drafter context shows in the acceptance statistics). The tests check
// that the prompts did prefill together (SchedulerTimes::prefill_batches and the reads: one I32 [n]
// of first tokens, no I32 [1] of a prefill alone), and that a batched prefill that runs out of
// memory ends only the newest of its requests while the others go on with their single-run output.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

const std::vector<std::vector<int32_t>>& kPrompts = test_util::kStoryPrompts;
const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

// What one request produced, alone or through the scheduler.
struct Output {
  std::vector<int32_t> tokens;    // returned (alone) / completed (scheduler)
  std::vector<int32_t> streamed;  // through on_token
  std::vector<TokenLogprobs> logprobs;
  GenerateStats stats;
  Status status;
  bool completed = false;
};

struct Req {
  std::vector<int32_t> prompt;
  GenerateOptions options;
};

class SpeculativePrefill : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_backend(1);
    counting_ = std::make_unique<test_util::CountingBackend>(*cpu_);
    auto t = load_target(kStories, *counting_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/" + GetParam(), *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    drafter_ = std::move(*d);
  }

  Output alone(const Req& r) {
    Output o;
    auto out = generate_speculative(
        *target_, *drafter_, r.prompt, r.options,
        [&](int32_t t) {
          o.streamed.push_back(t);
          return true;
        },
        &o.stats, [&](const TokenLogprobs& l) { o.logprobs.push_back(l); });
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (out.ok()) o.tokens = *out;
    o.completed = true;
    return o;
  }

  Status add(Scheduler& s, RequestId id, const Req& r) {
    Output& o = seen_[id];
    return s.add(
        id, r.prompt, r.options,
        [&o](int32_t t) {
          o.streamed.push_back(t);
          return true;
        },
        [&o](Completion c) {
          EXPECT_FALSE(o.completed) << "completed twice";
          o.completed = true;
          o.tokens = std::move(c.tokens);
          o.stats = std::move(c.stats);
          o.status = std::move(c.status);
        },
        [&o](const TokenLogprobs& l) { o.logprobs.push_back(l); });
  }

  static void expect_equal(const Output& got, const Output& want, const std::string& where) {
    ASSERT_TRUE(got.completed) << where;
    EXPECT_TRUE(got.status.ok()) << where << ": " << got.status.message();
    EXPECT_EQ(got.tokens, want.tokens) << where;
    EXPECT_EQ(got.streamed, want.tokens) << where << " (streamed)";
    test_util::expect_same_counts(got.stats, want.stats, where);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << where;
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      const TokenLogprobs &a = got.logprobs[i], &b = want.logprobs[i];
      EXPECT_EQ(a.token, b.token) << where << ", logprobs " << i;
      EXPECT_EQ(a.logprob, b.logprob) << where << ", logprobs " << i;
      ASSERT_EQ(a.top.size(), b.top.size()) << where << ", logprobs " << i;
      for (size_t j = 0; j < a.top.size(); ++j) {
        EXPECT_EQ(a.top[j].token, b.top[j].token) << where << ", logprobs " << i;
        EXPECT_EQ(a.top[j].logprob, b.top[j].logprob) << where << ", logprobs " << i;
      }
    }
  }

  // Greedy and sampled requests with different prompts, lengths and ends: one ends at its first
  // token (max_tokens 1), one reports logprobs, one starts from a 40-token prompt.
  std::vector<Req> requests() {
    GenerateOptions greedy{.max_tokens = 40, .stop_ids = {2}};
    GenerateOptions sampled = greedy;
    sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 17};
    GenerateOptions other_seed = sampled;
    other_seed.sampling.seed = 5;
    other_seed.sampling.top_k = 20;
    GenerateOptions with_logprobs = greedy;
    with_logprobs.logprobs = 2;
    GenerateOptions one = sampled;
    one.max_tokens = 1;
    GenerateOptions few = greedy;
    few.max_tokens = 9;
    few.draft_tokens = 2;
    // A longer prompt: a story prefix continued by the target's own greedy tokens.
    auto more = generate_plain(*target_, kPrompts[3], {.max_tokens = 25}, nullptr, nullptr);
    EXPECT_TRUE(more.ok());
    std::vector<int32_t> p40 = kPrompts[3];
    if (more.ok()) p40.insert(p40.end(), more->begin(), more->end());
    return {{kPrompts[1], greedy},     {kPrompts[2], sampled}, {p40, with_logprobs},
            {kPrompts[0], other_seed}, {kPrompts[3], one},     {kPrompts[2], few},
            {kPrompts[1], sampled}};
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<test_util::CountingBackend> counting_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  std::map<RequestId, Output> seen_;
};

TEST_P(SpeculativePrefill, PromptsPrefillTogetherWithTheSingleRunsOutput) {
  const std::vector<Req> reqs = requests();
  std::vector<Output> want;
  for (const Req& r : reqs) want.push_back(alone(r));
  const int64_t n = static_cast<int64_t>(reqs.size());
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = n});
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(add(s, i, reqs[i]).ok());
  counting_->reset();
  ASSERT_TRUE(s.step().ok());
  // Every prompt prefilled in the one batch: one read of the n first tokens, none of one alone.
  EXPECT_EQ(s.times().prefill_batches, 1);
  EXPECT_EQ(s.num_prefilling(), 0);
  int64_t first_reads = 0;
  for (const auto& r : counting_->reads()) {
    if (r.f32 || r.dtype != DType::kI32) continue;
    EXPECT_NE(r.numel, 1) << "a prompt prefilled alone";
    first_reads += r.numel == n;
  }
  EXPECT_EQ(first_reads, 1);
  for (int step = 0; !s.idle(); ++step) {
    ASSERT_TRUE(s.step().ok());
    ASSERT_LT(step, 1000);
  }
  EXPECT_EQ(s.times().prefill_batches, 1);
  bool sampled = false, greedy = false, logprobs = false;
  for (int64_t i = 0; i < n; ++i) {
    expect_equal(seen_[i], want[static_cast<size_t>(i)], fmt::format("request {}", i));
    sampled |= !reqs[i].options.sampling.greedy();
    greedy |= reqs[i].options.sampling.greedy();
    logprobs |= !want[static_cast<size_t>(i)].logprobs.empty();
  }
  EXPECT_TRUE(sampled && greedy && logprobs);
  EXPECT_EQ(want[4].tokens.size(), 1u);  // ended at its first token
}

// The step's prefill budget decides who goes together: with a budget of 12 tokens, prompts of 5,
// 5 and 1 tokens prefill in one forward, the 15-token prompt behind them in chunks of its own
// (taking the rest of the budget), and every output is still the single run's.
TEST_P(SpeculativePrefill, TheBudgetBoundsTheBatch) {
  const GenerateOptions greedy{.max_tokens = 20, .stop_ids = {2}};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .seed = 3};
  const std::vector<Req> reqs = {
      {kPrompts[1], greedy}, {kPrompts[2], sampled}, {kPrompts[0], greedy}, {kPrompts[3], sampled}};
  std::vector<Output> want;
  for (const Req& r : reqs) want.push_back(alone(r));
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 4, .max_prefill_tokens = 12});
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(add(s, i, reqs[i]).ok());
  ASSERT_TRUE(s.step().ok());
  EXPECT_EQ(s.times().prefill_batches, 1);
  EXPECT_EQ(s.num_prefilling(), 1);  // the long prompt, one chunk in
  for (int step = 0; !s.idle(); ++step) {
    ASSERT_TRUE(s.step().ok());
    ASSERT_LT(step, 1000);
  }
  EXPECT_EQ(s.times().prefill_batches, 1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_equal(seen_[i], want[i], fmt::format("request {}", i));
  }
}

// An allocation failure at each allocation of the first step (the batched prefill, then the
// batched step): only one request ends, with kOutOfMemory; when it hit the batched prefill that is
// the newest of its requests and the others prefill again; the others' outputs are their single
// runs'.
TEST_P(SpeculativePrefill, AllocationFailureEndsTheNewest) {
  const GenerateOptions greedy{.max_tokens = 20, .stop_ids = {2}};
  const std::vector<Req> reqs = {
      {kPrompts[1], greedy}, {kPrompts[2], greedy}, {kPrompts[3], greedy}};
  std::vector<Output> want;
  for (const Req& r : reqs) want.push_back(alone(r));
  int in_prefill = 0;
  for (int64_t nth = 1; nth <= 400; ++nth) {
    seen_.clear();
    Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 3});
    for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(add(s, i, reqs[i]).ok());
    inject_allocation_failure(nth);
    const Status first = s.step();
    const bool fired = !allocation_failure_pending();
    inject_allocation_failure(0);
    if (!fired) break;
    ASSERT_TRUE(first.ok()) << first.message();
    for (int step = 0; !s.idle(); ++step) {
      ASSERT_TRUE(s.step().ok());
      ASSERT_LT(step, 1000);
    }
    int failed = 0;
    for (RequestId id = 0; id < reqs.size(); ++id) {
      const std::string where = fmt::format("failure at allocation {}, request {}", nth, id);
      const Output& o = seen_[id];
      ASSERT_TRUE(o.completed) << where;
      if (o.status.ok()) {
        expect_equal(o, want[id], where);
        continue;
      }
      ++failed;
      EXPECT_EQ(o.status.code(), StatusCode::kOutOfMemory) << where << ": " << o.status.message();
      if (o.status.message().find("batched prefill") != std::string::npos) {
        EXPECT_EQ(id, reqs.size() - 1) << where;  // the newest of the batch
        ++in_prefill;
      }
    }
    EXPECT_EQ(failed, 1) << "failure at allocation " << nth;
  }
  EXPECT_GE(in_prefill, 1);
}

// Counts matmuls (one context K/V pass is a fixed number of them).
class MatmulCounter : public test_util::CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  int64_t matmuls = 0;
  void matmul(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
              bool accumulate) override {
    ++matmuls;
    CountingBackend::matmul(y, x, w, bias, accumulate);
  }
};

// Every drafter's observe_batch writes what one observe per request writes (bit for bit on the
// CPU) in one pass: as many matmuls as one observe (FlashMap had only the default loop).
TEST_P(SpeculativePrefill, ObserveBatchIsOnePassWithTheSameCache) {
  auto cpu = make_cpu_backend(1);
  MatmulCounter counter(*cpu);
  auto t = load_target(kStories, counter);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/" + GetParam(), **t, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  Drafter& drafter = **d;
  const int64_t width =
      static_cast<int64_t>(drafter.target_layers().size()) * (*t)->config().hidden_size;
  const int64_t blocks = 12;
  KvPool batched = drafter.make_kv_pool(blocks), single = drafter.make_kv_pool(blocks);
  for (KvPool* pool : {&batched, &single}) {
    for (auto* ts : {&pool->k, &pool->v}) {
      for (const Tensor& x : *ts) counter.fill_zero(x);
    }
  }
  // Three sequences (blocks 0-3, 4-7, 8-11): 21 rows at 0, none, 9 rows at 30.
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  const std::vector<int64_t> rows = {21, 0, 9}, starts = {0, 5, 30};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<ObserveRequest> reqs;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<float> host(static_cast<size_t>(rows[i] * width));
    for (float& x : host) x = normal(rng);
    Tensor taps = counter.empty({std::max<int64_t>(rows[i], 1), width});
    if (rows[i] > 0) counter.copy_from_host(taps, host.data());  // activation dtype F32 on the CPU
    reqs.push_back(
        {.block_table = tables[i], .taps = taps.rows(0, rows[i]), .start_pos = starts[i]});
  }
  counter.matmuls = 0;
  ASSERT_TRUE(drafter.observe(single, reqs[0].block_table, reqs[0].taps, reqs[0].start_pos).ok());
  const int64_t one_pass = counter.matmuls;
  for (size_t i = 1; i < reqs.size(); ++i) {
    ASSERT_TRUE(drafter.observe(single, reqs[i].block_table, reqs[i].taps, reqs[i].start_pos).ok());
  }
  counter.matmuls = 0;
  ASSERT_TRUE(drafter.observe_batch(batched, reqs).ok());
  EXPECT_EQ(counter.matmuls, one_pass);
  for (size_t l = 0; l < batched.k.size(); ++l) {
    EXPECT_EQ(counter.to_host_f32(batched.k[l]), counter.to_host_f32(single.k[l])) << "K " << l;
    EXPECT_EQ(counter.to_host_f32(batched.v[l]), counter.to_host_f32(single.v[l])) << "V " << l;
  }
}

// A step's verify blocks go longest first: a block that max_tokens shortened (request 1: one
// draft left) goes after the full ones, so that the full blocks share one attention call per
// target layer and the short one has its own (in arrival order: three calls per layer). The
// outputs stay the single runs'.
class ShortBlocksLast : public SpeculativePrefill {};

TEST_P(ShortBlocksLast, FullBlocksShareTheAttentionCall) {
  const GenerateOptions full{.max_tokens = 40};
  GenerateOptions short_block = full;
  short_block.max_tokens = 3;  // its first step verifies 1 draft (2 rows), the others the budget
  const std::vector<Req> reqs = {
      {kPrompts[1], full}, {kPrompts[2], short_block}, {kPrompts[1], full}};
  std::vector<Output> want;
  for (const Req& r : reqs) want.push_back(alone(r));
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 3});
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(add(s, i, reqs[i]).ok());
  counting_->reset();
  ASSERT_TRUE(s.step().ok());  // the prompts' batched prefill (even: 5 rows each), then a step
  EXPECT_EQ(s.times().prefill_batches, 1);
  EXPECT_EQ(counting_->attention_calls(), target_->config().num_layers);
  while (!s.idle()) ASSERT_TRUE(s.step().ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_equal(seen_[i], want[i], fmt::format("request {}", i));
  }
}

INSTANTIATE_TEST_SUITE_P(Drafters, ShortBlocksLast,
                         ::testing::Values("tests/data/dflash-stories260K",
                                           "tests/data/dflash2-stories260K"),
                         [](const auto& info) { return test_util::param_name(info.param); });

INSTANTIATE_TEST_SUITE_P(
    Drafters, SpeculativePrefill,
    ::testing::Values("tests/data/dflash-stories260K", "tests/data/dspark-stories260K",
                      "tests/data/dflash2-stories260K", "tests/data/flashmap-stories260K",
                      "models/stories260K-dflash2", "models/stories260K-flashmap"),
    [](const auto& info) { return test_util::param_name(info.param); });

}  // namespace
}  // namespace bs
