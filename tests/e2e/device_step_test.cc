// The speculative step on the device: the verify forward reads its tokens from the device
// (ForwardRequest::device_tokens gives what host tokens give, bit for bit), and a step, greedy or
// sampled, reads back from the device exactly once (a small I32 result; logits only for the
// committed rows of a request that wants logprobs): the stories260K target and its shipped DFlash
// and FlashMap drafters run on a backend decorator that counts every device-to-host read, for one
// sequence (generate_speculative) and for a batch (generate_speculative_batch / the Scheduler),
// while greedy output still equals plain greedy decoding and seeded sampled output equals the
// host reference (host_speculative.h: host logits, Sampler, accept_sampled).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"
#include "host_speculative.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

using test_util::CountingBackend;

const std::string kModels = std::string(BS_SOURCE_DIR) + "/models";

Tensor ints(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = be.empty({static_cast<int64_t>(v.size())}, DType::kI32);
  be.copy_from_host(t, v.data());
  return t;
}

TEST(DeviceTokens, ForwardEqualsHostTokens) {
  auto be = make_cpu_backend(1);
  auto t = load_target(kModels + "/stories260K", *be);
  ASSERT_TRUE(t.ok()) << t.status().message();
  CausalLM& target = **t;
  const std::vector<std::vector<int32_t>> seqs = {
      {1, 403, 407, 261, 378}, {1, 291, 376}, {1, 274, 287, 381, 261, 352, 266}};
  const int64_t blocks_per_seq = 2;
  KvPool pool = target.make_kv_pool(blocks_per_seq * static_cast<int64_t>(seqs.size()));
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    tables[i] = {static_cast<int32_t>(2 * i), static_cast<int32_t>(2 * i + 1)};
  }
  const std::vector<int> taps = {0, 2};
  // Every mix of host and device tokens over the three sequences (0: all on the host).
  std::vector<float> reference_logits, reference_taps;
  for (int mask = 0; mask < 8; ++mask) {
    std::vector<ForwardRequest> reqs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ForwardRequest req{.tokens = seqs[i],
                         .start_pos = 0,
                         .block_table = tables[i],
                         .num_logits = static_cast<int64_t>(seqs[i].size()),
                         .tap_layers = taps};
      if (mask & (1 << i)) {
        req.tokens = {};  // nothing on the host: the forward must take the device's
        req.device_tokens = ints(*be, seqs[i]);
      }
      reqs.push_back(req);
    }
    BatchForwardResult res;
    ASSERT_TRUE(target.forward_batch(reqs, pool, &res).ok());
    std::vector<float> logits = be->to_host_f32(res.logits), tap_values;
    for (const ForwardResult& r : res.seqs) {
      const auto v = be->to_host_f32(r.taps);
      tap_values.insert(tap_values.end(), v.begin(), v.end());
    }
    if (mask == 0) {
      reference_logits = logits;
      reference_taps = tap_values;
      continue;
    }
    EXPECT_EQ(logits, reference_logits) << "mask " << mask;
    EXPECT_EQ(tap_values, reference_taps) << "mask " << mask;
  }
  // One sequence through forward().
  ForwardResult host, device;
  ASSERT_TRUE(
      target
          .forward({.tokens = seqs[0], .start_pos = 0, .block_table = tables[0], .num_logits = 2},
                   pool, &host)
          .ok());
  const std::vector<float> host_logits = be->to_host_f32(host.logits);
  ForwardRequest req{.start_pos = 0, .block_table = tables[0], .num_logits = 2};
  req.device_tokens = ints(*be, seqs[0]);
  ASSERT_TRUE(target.forward(req, pool, &device).ok());
  EXPECT_EQ(be->to_host_f32(device.logits), host_logits);
  // A device tensor of the wrong type is refused.
  req.device_tokens = be->empty({5}, DType::kF32);
  EXPECT_EQ(target.forward(req, pool, &device).code(), StatusCode::kInvalidArgument);
}

// The stories260K target and a shipped drafter, loaded on a CountingBackend over the CPU.
class OneReadBack : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_backend(1);
    counting_ = std::make_unique<CountingBackend>(*cpu_);
    auto t = load_target(kModels + "/stories260K", *counting_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    auto d = load_drafter(kModels + "/" + GetParam(), *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    drafter_ = std::move(*d);
  }
  static GenerateOptions greedy(int64_t max_tokens) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_ids = {2};
    return o;
  }
  // Width of a step's read-back row: [a, next, drafts...].
  int64_t result_width() const {
    return std::max(drafter_->block_size(), drafter_->max_drafts()) + 2;
  }
  // The read is the step's one result: an I32 [sequences, width] copy (no logits).
  void expect_step_read(const CountingBackend::Read& r, int64_t seqs, const std::string& what) {
    EXPECT_FALSE(r.f32) << what;
    EXPECT_EQ(r.dtype, DType::kI32) << what;
    EXPECT_EQ(r.numel, seqs * result_width()) << what;
  }
  // A prefill's read: the first token's id, chosen on the device (of `n` prompts prefilled
  // together: their ids at once).
  static void expect_token_read(const CountingBackend::Read& r, const std::string& what,
                                int64_t n = 1) {
    EXPECT_FALSE(r.f32) << what;
    EXPECT_EQ(r.dtype, DType::kI32) << what;
    EXPECT_EQ(r.numel, n) << what;
  }
  // Runs generate_speculative on the counting backend and checks that the prefill reads one id and
  // every step one result, the tokens of a step committed together after its read. Returns the
  // tokens.
  std::vector<int32_t> run_counted(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                   const std::string& what) {
    counting_->reset();
    std::vector<int64_t> reads_at_token;
    const auto on_token = [&](int32_t) {
      reads_at_token.push_back(static_cast<int64_t>(counting_->reads().size()));
      return true;
    };
    GenerateStats st;
    auto spec = generate_speculative(*target_, *drafter_, prompt, o, on_token, &st);
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    if (!spec.ok()) return {};
    EXPECT_GT(st.steps, 3) << what;
    const auto& reads = counting_->reads();
    EXPECT_EQ(static_cast<int64_t>(reads.size()), 1 + st.steps) << what;
    if (reads.empty()) return *spec;
    expect_token_read(reads[0], what + " prefill");
    for (size_t i = 1; i < reads.size(); ++i) {
      expect_step_read(reads[i], 1, what + " step " + std::to_string(i));
    }
    // The tokens of one step share the read count; consecutive steps are one read apart.
    EXPECT_EQ(reads_at_token.front(), 1) << what;
    int64_t groups = 0;
    for (size_t i = 1; i < reads_at_token.size(); ++i) {
      const int64_t gap = reads_at_token[i] - reads_at_token[i - 1];
      EXPECT_TRUE(gap == 0 || gap == 1) << what << " token " << i << ": " << gap << " reads apart";
      groups += gap;
    }
    EXPECT_EQ(groups, st.steps) << what;
    EXPECT_EQ(counting_->syncs(), 0) << what;  // and no other wait on the device
    return *spec;
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<CountingBackend> counting_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

TEST_P(OneReadBack, GreedySingleSequence) {
  const GenerateOptions o = greedy(60);
  for (size_t p = 0; p < test_util::kStoryPrompts.size(); ++p) {
    const auto& prompt = test_util::kStoryPrompts[p];
    auto plain = generate_plain(*target_, prompt, o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    GenerateStats st;
    auto spec = generate_speculative(*target_, *drafter_, prompt, o, nullptr, &st);
    ASSERT_TRUE(spec.ok());
    EXPECT_GT(st.accepted, 0);  // real multi-token steps
    EXPECT_EQ(run_counted(prompt, o, "prompt " + std::to_string(p)), *plain);
  }
}

TEST_P(OneReadBack, GreedyBatch) {
  const auto& prompts = test_util::kStoryPrompts;
  const GenerateOptions o = greedy(50);
  counting_->reset();
  std::vector<GenerateStats> stats;
  auto batch = generate_speculative_batch(*target_, *drafter_, prompts, o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  const auto reads = counting_->reads();
  const int64_t P = static_cast<int64_t>(prompts.size());
  // All prompts are admitted together, so the batch runs as many steps as its longest sequence.
  int64_t steps = 0, accepted = 0;
  for (const GenerateStats& s : stats) {
    steps = std::max(steps, s.steps);
    accepted += s.accepted;
  }
  EXPECT_GT(accepted, 0);
  ASSERT_EQ(static_cast<int64_t>(reads.size()), 1 + steps);
  // The prompts' batched prefill first (every first token id at once), then one [running
  // sequences, width] result a step, fewer rows as sequences finish.
  expect_token_read(reads[0], "prefill", P);
  int64_t running_prev = P;
  for (size_t i = 1; i < reads.size(); ++i) {
    const int64_t running = reads[i].numel / result_width();
    expect_step_read(reads[i], running, "batch step " + std::to_string(i - 1));
    EXPECT_LE(running, running_prev);
    running_prev = running;
  }
  EXPECT_EQ(counting_->syncs(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto plain = generate_plain(*target_, prompts[i], o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ((*batch)[i], *plain) << "prompt " << i;
  }
}

// Seeded sampled runs: varied filters and draft budgets (both accept and reject occur).
std::vector<GenerateOptions> sampled_runs() {
  std::vector<GenerateOptions> runs;
  const SamplingParams params[] = {{.temperature = 0.8f, .seed = 3},
                                   {.temperature = 1.1f, .top_k = 40, .top_p = 0.9f, .seed = 11},
                                   {.temperature = 0.6f, .top_p = 0.8f, .seed = 5},
                                   {.temperature = 1.0f, .top_k = 3, .seed = 1234567}};
  for (size_t i = 0; i < std::size(params); ++i) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.stop_ids = {2};
    o.sampling = params[i];
    o.draft_tokens = i == 2 ? 3 : 0;
    runs.push_back(o);
  }
  return runs;
}

TEST_P(OneReadBack, SampledOutputEqualsHostReference) {
  // The device draws (CPU backend: the host sampling functions) give the host path's tokens.
  const auto runs = sampled_runs();
  int64_t accepted = 0, rejected = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (size_t p = 0; p < test_util::kStoryPrompts.size(); ++p) {
      const auto& prompt = test_util::kStoryPrompts[p];
      GenerateStats st;
      auto spec = generate_speculative(*target_, *drafter_, prompt, runs[r], nullptr, &st);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      EXPECT_EQ(*spec, test_util::host_speculative(*target_, *drafter_, prompt, runs[r]))
          << "run " << r << " prompt " << p;
      accepted += st.accepted;
      rejected += st.drafted - st.accepted;
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
}

TEST_P(OneReadBack, SampledSingleSequence) {
  // Sampled steps too read back one small result: the drafts are drawn into the verify input on
  // the device and rejection sampling runs there.
  const auto runs = sampled_runs();
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& prompt = test_util::kStoryPrompts[1 + r % 3];
    EXPECT_EQ(run_counted(prompt, runs[r], "run " + std::to_string(r)),
              test_util::host_speculative(*target_, *drafter_, prompt, runs[r]))
        << "run " << r;
  }
}

TEST_P(OneReadBack, SampledBatch) {
  // A Scheduler batch of sampled requests, each with its own seed and filter: one read per step
  // for all of them, and each request's tokens are the host reference's for it alone.
  const auto runs = sampled_runs();
  const int64_t n = static_cast<int64_t>(runs.size());
  Scheduler scheduler(*target_, drafter_.get(), {.max_num_seqs = n});
  std::vector<Completion> done(runs.size());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(scheduler
                    .add(i, test_util::kStoryPrompts[i % 4], runs[i], nullptr,
                         [&, i](Completion c) { done[i] = std::move(c); })
                    .ok());
  }
  counting_->reset();
  while (!scheduler.idle()) ASSERT_TRUE(scheduler.step().ok());
  const auto reads = counting_->reads();  // before the reference runs below add theirs
  const int64_t syncs = counting_->syncs();
  int64_t steps = 0, accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(done[i].status.ok()) << done[i].status.message();
    EXPECT_EQ(done[i].tokens, test_util::host_speculative(*target_, *drafter_,
                                                          test_util::kStoryPrompts[i % 4], runs[i]))
        << "request " << i;
    steps = std::max(steps, done[i].stats.steps);  // all run from the first step on
    accepted += done[i].stats.accepted;
  }
  EXPECT_GT(accepted, 0);
  ASSERT_EQ(static_cast<int64_t>(reads.size()), 1 + steps);
  expect_token_read(reads[0], "prefill", n);  // the prompts prefill together
  for (size_t i = 1; i < reads.size(); ++i) {
    expect_step_read(reads[i], reads[i].numel / result_width(), "step " + std::to_string(i - 1));
  }
  EXPECT_EQ(syncs, 0);
}

TEST_P(OneReadBack, LogprobsReadOnlyTheCommittedRows) {
  // A batch mixing greedy and sampled requests with and without logprobs: each request decodes
  // as it does alone (logprobs never change the tokens), a step still reads one result for all,
  // and a request that wants logprobs reads its own committed rows' logits and nothing more: one
  // row at its prefill, rows 0..a of its verify block each step.
  GenerateOptions sampled = greedy(30);
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 3};
  GenerateOptions greedy_lp = greedy(30), sampled_lp = sampled;
  greedy_lp.logprobs = 2;
  sampled_lp.logprobs = 0;
  const std::vector<GenerateOptions> kinds = {greedy(30), sampled, greedy_lp, sampled_lp};
  const int64_t n = static_cast<int64_t>(kinds.size());
  const int64_t vocab = target_->config().vocab_size;
  std::vector<std::vector<TokenLogprobs>> logprobs(kinds.size());
  std::vector<Completion> done(kinds.size());
  Scheduler scheduler(*target_, drafter_.get(), {.max_num_seqs = n});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(scheduler
                    .add(
                        i, test_util::kStoryPrompts[1 + i % 3], kinds[i], nullptr,
                        [&, i](Completion c) { done[i] = std::move(c); },
                        [&, i](const TokenLogprobs& lp) { logprobs[i].push_back(lp); })
                    .ok());
  }
  counting_->reset();
  while (!scheduler.idle()) ASSERT_TRUE(scheduler.step().ok());
  const auto reads = counting_->reads();  // before the reference runs below add theirs
  const int64_t syncs = counting_->syncs();
  int64_t steps = 0, lp_reads = 0, lp_rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(done[i].status.ok()) << done[i].status.message();
    std::vector<TokenLogprobs> alone_lp;
    auto alone = generate_speculative(*target_, *drafter_, test_util::kStoryPrompts[1 + i % 3],
                                      kinds[i], nullptr, nullptr,
                                      [&](const TokenLogprobs& lp) { alone_lp.push_back(lp); });
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(done[i].tokens, *alone) << "request " << i;
    GenerateOptions no_lp = kinds[i];
    no_lp.logprobs = -1;
    auto without = generate_speculative(*target_, *drafter_, test_util::kStoryPrompts[1 + i % 3],
                                        no_lp, nullptr, nullptr);
    ASSERT_TRUE(without.ok());
    EXPECT_EQ(done[i].tokens, *without) << "request " << i;
    const GenerateStats& st = done[i].stats;
    steps = std::max(steps, st.steps);
    if (kinds[i].logprobs < 0) continue;
    ASSERT_EQ(logprobs[i].size(), done[i].tokens.size()) << "request " << i;
    ASSERT_EQ(alone_lp.size(), logprobs[i].size());
    for (size_t t = 0; t < alone_lp.size(); ++t) {
      EXPECT_EQ(logprobs[i][t].token, done[i].tokens[t]);
      EXPECT_EQ(logprobs[i][t].logprob, alone_lp[t].logprob) << "request " << i << " token " << t;
    }
    lp_reads += 1 + st.steps;
    lp_rows += 1 + st.steps + st.accepted;  // the prefill row, rows 0..a of every step
  }
  int64_t f32_reads = 0, f32_rows = 0, i32_reads = 0;
  for (const auto& r : reads) {
    if (r.f32) {
      ++f32_reads;
      EXPECT_EQ(r.numel % vocab, 0);
      EXPECT_LE(r.numel / vocab, drafter_->max_drafts() + 1);
      f32_rows += r.numel / vocab;
    } else {
      ++i32_reads;
    }
  }
  EXPECT_EQ(i32_reads, 1 + steps);  // the batched prefill's token ids, one result per step
  EXPECT_EQ(f32_reads, lp_reads);
  EXPECT_EQ(f32_rows, lp_rows);
  EXPECT_EQ(syncs, 0);
}

TEST(PlainBatch, ReadsTheTokenIdsOnceAStep) {
  // The Scheduler's batched plain step chooses every token on the device (one argmax for the
  // greedy rows, a draw for each sampled one) and reads the ids back once: a batch of greedy and
  // sampled requests (one with logprobs) reads one I32 [running] a step, plus its logprobs row.
  // Prompts admitted together prefill in one forward and read their first ids at once too.
  auto cpu = make_cpu_backend(1);
  CountingBackend counting(*cpu);
  auto t = load_target(kModels + "/stories260K", counting);
  ASSERT_TRUE(t.ok()) << t.status().message();
  CausalLM& target = **t;
  std::vector<GenerateOptions> kinds(4);
  for (GenerateOptions& o : kinds) o.max_tokens = 25;
  kinds[1].sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 3};
  kinds[2].sampling = {.temperature = 1.2f, .top_k = 20, .seed = 4};
  kinds[3] = kinds[1];
  kinds[3].logprobs = 1;
  const int64_t n = static_cast<int64_t>(kinds.size());
  std::vector<Completion> done(kinds.size());
  Scheduler scheduler(target, nullptr, {.max_num_seqs = n});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(scheduler
                    .add(
                        i, test_util::kStoryPrompts[i], kinds[i], nullptr,
                        [&, i](Completion c) { done[i] = std::move(c); },
                        [](const TokenLogprobs&) {})
                    .ok());
  }
  counting.reset();
  int64_t steps = 0;
  for (; !scheduler.idle(); ++steps) ASSERT_TRUE(scheduler.step().ok());
  const auto reads = counting.reads();
  const int64_t vocab = target.config().vocab_size;
  // Every request makes 25 tokens (no stop tokens) from the first step on: the prompts' batched
  // prefill and a batched step there, then one batched step per scheduler step, 24 in all.
  ASSERT_EQ(steps, 24);
  int64_t f32 = 0, i32 = 0;
  for (const auto& r : reads) {
    if (r.f32) {
      ++f32;
      EXPECT_EQ(r.numel, vocab);
    } else {
      ++i32;
      EXPECT_EQ(r.dtype, DType::kI32);
      EXPECT_EQ(r.numel, n);  // the prefill's first ids, a step's ids
    }
  }
  EXPECT_EQ(i32, 1 + 24);
  EXPECT_EQ(f32, 25);  // the logprobs request's rows
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(done[i].status.ok());
    auto alone = generate_plain(target, test_util::kStoryPrompts[i], kinds[i], nullptr, nullptr,
                                [](const TokenLogprobs&) {});
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(done[i].tokens, *alone) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, OneReadBack,
                         ::testing::Values("stories260K-dflash", "stories260K-flashmap"),
                         [](const auto& info) { return test_util::param_name(info.param); });

}  // namespace
}  // namespace bs
