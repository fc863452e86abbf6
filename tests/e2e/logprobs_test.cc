// Logprobs (GenerateOptions::logprobs, engine/logprobs.h) on the shipped stories260K target and
// its DFlash drafter: speculative decoding reports bit for bit the logprobs of plain decoding
// (greedy: the same run; seeded sampling: plain decoding's rows for the speculative tokens),
// through the Scheduler each request reports what it reports alone, turning logprobs on changes
// no token, and a greedy run's values match a log-softmax computed here from one
// CausalLM::forward over the whole output.
#include "engine/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"
#include "test_util.h"

namespace bs {
namespace {

const std::vector<std::vector<int32_t>>& kPrompts = test_util::kStoryPrompts;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<int32_t> streamed;
  std::vector<TokenLogprobs> logprobs;
  GenerateStats stats;
};

void expect_same_logprobs(const std::vector<TokenLogprobs>& got,
                          const std::vector<TokenLogprobs>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << where << " token " << i;
    EXPECT_EQ(got[i].logprob, want[i].logprob) << where << " token " << i;  // bit for bit
    ASSERT_EQ(got[i].top.size(), want[i].top.size()) << where << " token " << i;
    for (size_t j = 0; j < got[i].top.size(); ++j) {
      EXPECT_EQ(got[i].top[j].token, want[i].top[j].token) << where << " token " << i;
      EXPECT_EQ(got[i].top[j].logprob, want[i].top[j].logprob) << where << " token " << i;
    }
  }
}

class LogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::load_stories("stories260K-dflash", &backend_, &target_, &drafter_);
  }

  Output generate(const std::vector<int32_t>& prompt, const GenerateOptions& o, bool speculative) {
    Output r;
    const TokenCallback on_token = [&r](int32_t t) {
      // Each token's logprobs arrive just before it.
      EXPECT_EQ(r.logprobs.size(), r.streamed.size() + 1);
      r.streamed.push_back(t);
      return true;
    };
    const LogprobsCallback on_logprobs = [&r](const TokenLogprobs& lp) {
      r.logprobs.push_back(lp);
    };
    auto out =
        speculative
            ? generate_speculative(*target_, *drafter_, prompt, o,
                                   o.logprobs >= 0 ? on_token : nullptr, &r.stats, on_logprobs)
            : generate_plain(*target_, prompt, o, o.logprobs >= 0 ? on_token : nullptr, &r.stats,
                             on_logprobs);
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (out.ok()) r.tokens = *out;
    return r;
  }

  // The logprobs plain decoding reports for `tokens` after `prompt` whatever it would sample:
  // the forwards of PlainSequence (the prompt, then one token per step; logits of the last row),
  // run here on the given tokens.
  std::vector<TokenLogprobs> forced(const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& tokens, int top_n) {
    const int64_t end = static_cast<int64_t>(prompt.size() + tokens.size());
    const int64_t blocks = (end + kKvBlockSize - 1) / kKvBlockSize;
    KvPool pool = target_->make_kv_pool(blocks);
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::vector<TokenLogprobs> out(tokens.size());
    std::span<const int32_t> step = prompt;
    int64_t pos = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t step_end = pos + static_cast<int64_t>(step.size());
      ForwardResult res;
      const Status st =
          target_->forward({.tokens = step,
                            .start_pos = pos,
                            .block_table = std::span<const int32_t>(table).first(
                                static_cast<size_t>((step_end + kKvBlockSize - 1) / kKvBlockSize)),
                            .num_logits = 1},
                           pool, &res);
      EXPECT_TRUE(st.ok()) << st.message();
      token_logprobs(backend_->to_host_f32(res.logits), tokens[i], top_n, &out[i]);
      pos = step_end;
      step = std::span<const int32_t>(tokens).subspan(i, 1);
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
};

std::vector<GenerateOptions> option_sets() {
  GenerateOptions greedy;
  greedy.stop_ids = {2};
  greedy.max_tokens = 48;
  greedy.logprobs = 5;
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 17};
  GenerateOptions sampled_top0 = sampled;
  sampled_top0.logprobs = 0;
  sampled_top0.sampling = {.temperature = 1.3f, .top_k = 40, .seed = 5};
  GenerateOptions greedy_max = greedy;
  greedy_max.logprobs = kMaxTopLogprobs;
  greedy_max.draft_tokens = 3;
  return {greedy, sampled, sampled_top0, greedy_max};
}

TEST_F(LogprobsTest, SpeculativeEqualsPlainAndTokensDoNotChange) {
  int case_index = 0;
  for (const GenerateOptions& o : option_sets()) {
    for (size_t p = 0; p < kPrompts.size(); ++p) {
      const std::string where = fmt::format("options {} prompt {}", case_index, p);
      const Output plain = generate(kPrompts[p], o, /*speculative=*/false);
      const Output spec = generate(kPrompts[p], o, /*speculative=*/true);
      GenerateOptions off = o;
      off.logprobs = -1;
      const Output plain_off = generate(kPrompts[p], off, false);
      const Output spec_off = generate(kPrompts[p], off, true);
      ASSERT_FALSE(plain.tokens.empty()) << where;
      EXPECT_EQ(plain.tokens, plain_off.tokens) << where << " (lossless: logprobs on vs off)";
      EXPECT_EQ(spec.tokens, spec_off.tokens) << where << " (lossless: logprobs on vs off)";
      // Greedy: the same tokens. Sampled: speculative sampling draws other (equally distributed)
      // tokens from the same seed, so its logprobs are compared with plain decoding's rows for
      // its own tokens.
      if (o.sampling.greedy()) {
        EXPECT_EQ(spec.tokens, plain.tokens) << where;
      }
      EXPECT_EQ(plain.streamed, plain.tokens) << where;
      EXPECT_EQ(spec.streamed, spec.tokens) << where;
      EXPECT_EQ(spec.stats.steps, spec_off.stats.steps) << where;
      EXPECT_EQ(spec.stats.accepted, spec_off.stats.accepted) << where;
      EXPECT_TRUE(plain_off.logprobs.empty() && spec_off.logprobs.empty()) << where;
      ASSERT_EQ(plain.logprobs.size(), plain.tokens.size()) << where;
      for (size_t i = 0; i < plain.tokens.size(); ++i) {
        const TokenLogprobs& lp = plain.logprobs[i];
        EXPECT_EQ(lp.token, plain.tokens[i]) << where;
        EXPECT_LE(lp.logprob, 0.0f) << where;
        ASSERT_EQ(lp.top.size(), static_cast<size_t>(o.logprobs)) << where;
        for (size_t j = 1; j < lp.top.size(); ++j) {
          EXPECT_GE(lp.top[j - 1].logprob, lp.top[j].logprob) << where;
        }
        if (o.sampling.greedy() && !lp.top.empty()) {
          EXPECT_EQ(lp.top[0].token, lp.token) << where;  // the argmax
          EXPECT_EQ(lp.top[0].logprob, lp.logprob) << where;
        }
      }
      expect_same_logprobs(plain.logprobs, forced(kPrompts[p], plain.tokens, o.logprobs),
                           where + " plain vs forced");
      expect_same_logprobs(spec.logprobs, forced(kPrompts[p], spec.tokens, o.logprobs),
                           where + " speculative vs forced plain rows");
      if (o.sampling.greedy()) {
        expect_same_logprobs(spec.logprobs, plain.logprobs, where);
      }
      ++case_index;
    }
  }
  // The speculative runs accepted drafts, so rows past the first of a verify pass were used.
  const Output spec = generate(kPrompts[1], option_sets()[0], true);
  EXPECT_GT(spec.stats.accepted, 0);
}

TEST_F(LogprobsTest, SchedulerEqualsSingleRequests) {
  const std::vector<GenerateOptions> sets = option_sets();
  // Whole-prompt prefill and chunked prefill (3 prompt tokens per step).
  for (const int64_t chunk : {int64_t{0}, int64_t{3}}) {
    for (Drafter* drafter : {static_cast<Drafter*>(nullptr), drafter_.get()}) {
      Scheduler s(*target_, drafter, {.max_num_seqs = 4, .max_prefill_tokens = chunk});
      std::map<RequestId, Output> seen;
      std::map<RequestId, Output> want;
      RequestId id = 0;
      for (size_t p = 0; p < kPrompts.size(); ++p) {
        for (size_t k = 0; k < sets.size(); ++k, ++id) {
          GenerateOptions o = sets[k];
          if (id % 3 == 2) o.logprobs = -1;  // some requests beside them without logprobs
          want[id] = generate(kPrompts[p], o, drafter != nullptr);
          Output& r = seen[id];
          ASSERT_TRUE(s.add(
                           id, kPrompts[p], o,
                           [&r](int32_t t) {
                             r.streamed.push_back(t);
                             return true;
                           },
                           [&r](Completion c) { r.tokens = std::move(c.tokens); },
                           [&r](const TokenLogprobs& lp) { r.logprobs.push_back(lp); })
                          .ok());
        }
      }
      while (!s.idle()) ASSERT_TRUE(s.step().ok());
      for (const auto& [rid, w] : want) {
        const std::string where = fmt::format("{} request {}, prefill chunk {}",
                                              drafter ? "speculative" : "plain", rid, chunk);
        EXPECT_EQ(seen[rid].tokens, w.tokens) << where;
        expect_same_logprobs(seen[rid].logprobs, w.logprobs, where);
      }
    }
  }
}

// Log-softmax of `row` in double, independently of engine/logprobs.cc.
std::vector<double> log_softmax(const float* row, int64_t vocab) {
  double max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[v] = row[v] - max - std::log(sum);
  return out;
}

TEST_F(LogprobsTest, GreedyMatchesOneForwardOverTheOutput) {
  GenerateOptions o = option_sets()[0];
  o.logprobs = 4;
  for (bool speculative : {false, true}) {
    const std::vector<int32_t>& prompt = kPrompts[1];
    const Output run = generate(prompt, o, speculative);
    ASSERT_EQ(run.logprobs.size(), run.tokens.size());
    // Row i of one forward over prompt + output[0..n-2] predicts output token i.
    std::vector<int32_t> all(prompt);
    all.insert(all.end(), run.tokens.begin(), run.tokens.end() - 1);
    const int64_t n = static_cast<int64_t>(run.tokens.size());
    const std::vector<float> logits = test_util::forward_logits(*target_, all, n);
    ASSERT_EQ(logits.size(), static_cast<size_t>(n * target_->config().vocab_size));
    const int64_t vocab = target_->config().vocab_size;
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<double> ls = log_softmax(logits.data() + i * vocab, vocab);
      const TokenLogprobs& lp = run.logprobs[i];
      EXPECT_NEAR(lp.logprob, ls[run.tokens[i]], 1e-4) << "token " << i;
      std::vector<int32_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return ls[a] > ls[b]; });
      ASSERT_EQ(lp.top.size(), 4u);
      for (size_t j = 0; j < lp.top.size(); ++j) {
        EXPECT_NEAR(lp.top[j].logprob, ls[order[j]], 1e-4) << "token " << i << " top " << j;
        // Ids agree unless two logits are within rounding of each other.
        if (std::abs(ls[order[j]] - ls[order[j + 1]]) > 1e-4) {
          EXPECT_EQ(lp.top[j].token, order[j]) << "token " << i << " top " << j;
        }
      }
    }
  }
}

TEST_F(LogprobsTest, TopTiesByLowerIdAndRangeChecked) {
  TokenLogprobs lp;
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, -2.0f, 3.0f};
  token_logprobs(row, 3, 4, &lp);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 2);
  EXPECT_EQ(lp.top[2].token, 4);
  EXPECT_EQ(lp.top[3].token, 0);
  const double z = std::log(std::exp(1.0) + 3 * std::exp(3.0) + std::exp(-2.0));
  EXPECT_NEAR(lp.logprob, -2.0 - z, 1e-6);
  EXPECT_NEAR(lp.top[0].logprob, 3.0 - z, 1e-6);

  for (int bad : {-2, kMaxTopLogprobs + 1}) {
    GenerateOptions o;
    o.logprobs = bad;
    auto out = generate_plain(*target_, kPrompts[1], o, nullptr, nullptr);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find("logprobs"), std::string::npos);
  }
}

}  // namespace
}  // namespace bs
