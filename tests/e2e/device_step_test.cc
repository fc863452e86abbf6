// The greedy speculative step on the device: the verify forward reads its tokens from the device
// (ForwardRequest::device_tokens gives what host tokens give, bit for bit), and a greedy step
// reads back from the device exactly once: the stories260K target and its shipped DFlash and
// FlashMap drafters run on a backend decorator that counts every device-to-host read, for one
// sequence (generate_speculative) and for a batch (generate_speculative_batch / the Scheduler),
// while the output still equals plain greedy decoding.
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

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<CountingBackend> counting_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

TEST_P(OneReadBack, GreedySingleSequence) {
  const GenerateOptions o = greedy(60);
  const CausalLM& target = *target_;
  for (const auto& prompt : test_util::kStoryPrompts) {
    auto plain = generate_plain(*target_, prompt, o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status().message();

    // Reads so far when each token is committed: the tokens of one step share the count, and
    // consecutive steps must be exactly one read apart.
    counting_->reset();
    std::vector<int64_t> reads_at_token;
    const auto on_token = [&](int32_t) {
      reads_at_token.push_back(static_cast<int64_t>(counting_->reads().size()));
      return true;
    };
    GenerateStats st;
    auto spec = generate_speculative(*target_, *drafter_, prompt, o, on_token, &st);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(*spec, *plain);
    ASSERT_GT(st.steps, 3);
    EXPECT_GT(st.accepted, 0);  // real multi-token steps

    const auto& reads = counting_->reads();
    // The prefill reads the first token's logits row; every step after it one result.
    ASSERT_EQ(static_cast<int64_t>(reads.size()), 1 + st.steps);
    EXPECT_TRUE(reads[0].f32 && reads[0].numel == target.config().vocab_size);
    for (size_t i = 1; i < reads.size(); ++i) {
      expect_step_read(reads[i], 1, "step " + std::to_string(i));
    }
    EXPECT_EQ(reads_at_token.front(), 1);
    int64_t groups = 0;
    for (size_t i = 1; i < reads_at_token.size(); ++i) {
      const int64_t gap = reads_at_token[i] - reads_at_token[i - 1];
      EXPECT_TRUE(gap == 0 || gap == 1) << "token " << i << ": " << gap << " reads apart";
      groups += gap;
    }
    EXPECT_EQ(groups, st.steps);
    EXPECT_EQ(counting_->syncs(), 0);  // and no other wait on the device
  }
}

TEST_P(OneReadBack, GreedyBatch) {
  const auto& prompts = test_util::kStoryPrompts;
  const GenerateOptions o = greedy(50);
  const CausalLM& target = *target_;
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
  ASSERT_EQ(static_cast<int64_t>(reads.size()), P + steps);
  // The prefills first (one logits row each), then one [running sequences, width] result a step,
  // fewer rows as sequences finish.
  for (int64_t i = 0; i < P; ++i) {
    EXPECT_TRUE(reads[i].f32 && reads[i].numel == target.config().vocab_size);
  }
  int64_t running_prev = P;
  for (size_t i = static_cast<size_t>(P); i < reads.size(); ++i) {
    const int64_t running = reads[i].numel / result_width();
    expect_step_read(reads[i], running, "batch step " + std::to_string(i - P));
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

TEST_P(OneReadBack, HostPathsStillReadLogits) {
  // The control: sampling and logprobs keep reading logits back (the counter sees them), and a
  // batch mixing them with greedy requests still decodes every request as it would alone.
  GenerateOptions sampled = greedy(30);
  sampled.sampling = {.temperature = 0.8f, .seed = 3};
  GenerateStats st;
  counting_->reset();
  auto r =
      generate_speculative(*target_, *drafter_, test_util::kStoryPrompts[1], sampled, nullptr, &st);
  ASSERT_TRUE(r.ok());
  int64_t logits_reads = 0;
  for (const auto& read : counting_->reads()) logits_reads += read.f32;
  EXPECT_GE(logits_reads, 1 + st.steps);  // prefill, then at least every verify's rows

  GenerateOptions with_logprobs = greedy(30);
  with_logprobs.logprobs = 2;
  counting_->reset();
  const LogprobsCallback on_logprobs = [](const TokenLogprobs&) {};
  auto lp = generate_speculative(*target_, *drafter_, test_util::kStoryPrompts[1], with_logprobs,
                                 nullptr, &st, on_logprobs);
  ASSERT_TRUE(lp.ok());
  EXPECT_GT(static_cast<int64_t>(counting_->reads().size()), 1 + st.steps);
  auto plain = generate_plain(*target_, test_util::kStoryPrompts[1], greedy(30), nullptr, nullptr);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*lp, *plain);

  // A scheduler batch mixing the three kinds: each request equals its single-request run.
  const std::vector<GenerateOptions> kinds = {greedy(30), sampled, with_logprobs};
  Scheduler scheduler(*target_, drafter_.get(), {.max_num_seqs = 3});
  std::vector<std::vector<int32_t>> outputs(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    ASSERT_TRUE(scheduler
                    .add(
                        i, test_util::kStoryPrompts[i + 1], kinds[i], nullptr,
                        [&, i](Completion c) {
                          EXPECT_TRUE(c.status.ok()) << c.status.message();
                          outputs[i] = std::move(c.tokens);
                        },
                        on_logprobs)
                    .ok());
  }
  while (!scheduler.idle()) ASSERT_TRUE(scheduler.step().ok());
  for (size_t i = 0; i < kinds.size(); ++i) {
    auto alone = generate_speculative(*target_, *drafter_, test_util::kStoryPrompts[i + 1],
                                      kinds[i], nullptr, nullptr, on_logprobs);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(outputs[i], *alone) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, OneReadBack,
                         ::testing::Values("stories260K-dflash", "stories260K-flashmap"),
                         [](const auto& info) { return test_util::param_name(info.param); });

}  // namespace
}  // namespace bs
