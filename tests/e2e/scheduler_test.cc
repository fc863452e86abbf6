// Continuous batching (engine/scheduler.h): every request's output (tokens, streamed tokens,
// finish reason, counts, speculative statistics) equals what generate_plain / generate_speculative
// give for it alone, whatever runs beside it and whenever it arrives: staggered arrivals, more
// requests than max_num_seqs, mixed max_tokens / stop ids / context windows / draft counts, greedy
// and seeded sampling; cancellation (scheduler and callback) mid-run and while waiting; a request
// too large for the KV pool fails alone, one that does not fit now waits; chunked prefill (long
// prompts in chunks of 1, 7, 64 tokens) changes no output, can be cancelled mid-prompt and lets
// the running requests decode meanwhile. The shipped stories260K target without a drafter and
// with its trained DFlash (batched propose) and FlashMap (one propose per sequence) drafters.
// Expectations come from the single-request engine calls.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "engine/generate.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

const std::vector<std::vector<int32_t>>& kPrompts = test_util::kStoryPrompts;

struct Expected {
  std::vector<int32_t> tokens;
  GenerateStats stats;
};

// What one request saw through the scheduler.
struct Seen {
  std::vector<int32_t> streamed;
  bool completed = false;
  Completion completion;
};

struct Arrival {
  int step;  // added before this step
  std::vector<int32_t> prompt;
  GenerateOptions options;
};

// A target that records the shape of every forward run through it: per call, each request's
// (rows, logit rows).
class ForwardLog final : public CausalLM {
 public:
  using Shape = std::vector<std::pair<int64_t, int64_t>>;
  // `backend`: what backend() reports (the scheduler's own ops and reads go through it; the
  // inner model's ops do not); null: the inner model's.
  explicit ForwardLog(CausalLM& inner, Backend* backend = nullptr) : m_(inner), b_(backend) {}
  std::vector<Shape> calls;
  // > 0: the n-th forward whose first sequence's tokens are on the device (a step queued ahead)
  // fails.
  int fail_queued_ahead = 0;

  const io::TransformerConfig& config() const override { return m_.config(); }
  const TargetSpec& spec() const override { return m_.spec(); }
  Backend& backend() const override { return b_ ? *b_ : m_.backend(); }
  KvPool make_kv_pool(int64_t num_blocks) override { return m_.make_kv_pool(num_blocks); }
  Status forward(const ForwardRequest& req, KvPool& kv, ForwardResult* out) override {
    calls.push_back({{req.size(), req.num_logits}});
    return m_.forward(req, kv, out);
  }
  Status forward_batch(std::span<const ForwardRequest> reqs, KvPool& kv,
                       BatchForwardResult* out) override {
    if (fail_queued_ahead > 0 && reqs[0].device_tokens.defined() && --fail_queued_ahead == 0) {
      return Status(StatusCode::kInternal, "injected failure of a step queued ahead");
    }
    Shape shape;
    for (const ForwardRequest& r : reqs) shape.emplace_back(r.size(), r.num_logits);
    calls.push_back(std::move(shape));
    return m_.forward_batch(reqs, kv, out);
  }
  const Tensor& embed_tokens() const override { return m_.embed_tokens(); }
  const Tensor& lm_head() const override { return m_.lm_head(); }
  int64_t weight_bytes() const override { return m_.weight_bytes(); }

 private:
  CausalLM& m_;
  Backend* b_ = nullptr;
};

// Counts the scheduler's read-backs and how many asynchronous ones were pending at once, and
// logs forwards and read-back ends in order (with ForwardLog: "F" a forward, "R" a begun read,
// "E" an ended one).
class ReadLog final : public test_util::CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  int64_t pending = 0, most_pending = 0, ends = 0;
  int64_t begin_read(const Tensor& src) override {
    most_pending = std::max(most_pending, ++pending);
    return CountingBackend::begin_read(src);
  }
  void end_read(int64_t ticket, void* dst) override {
    --pending;
    ++ends;
    CountingBackend::end_read(ticket, dst);
  }
};

class SchedulerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    test_util::load_stories(GetParam() == "plain" ? "" : GetParam(), &backend_, &target_,
                            &drafter_);
  }

  // The single-request engine output, with `on_token` as its callback.
  Expected alone(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                 const TokenCallback& on_token = nullptr) {
    Expected e;
    auto out = drafter_ ? generate_speculative(*target_, *drafter_, prompt, o, on_token, &e.stats)
                        : generate_plain(*target_, prompt, o, on_token, &e.stats);
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (out.ok()) e.tokens = *out;
    return e;
  }

  // Adds request `id`, recording what it streams and its completion in seen_[id].
  Status add(Scheduler& s, RequestId id, const std::vector<int32_t>& prompt,
             const GenerateOptions& o, std::function<bool(int32_t, size_t)> keep_going = nullptr) {
    Seen& seen = seen_[id];
    return s.add(
        id, prompt, o,
        [&seen, keep_going](int32_t t) {
          seen.streamed.push_back(t);
          return !keep_going || keep_going(t, seen.streamed.size());
        },
        [&seen](Completion c) {
          EXPECT_FALSE(seen.completed) << "completed twice";
          seen.completed = true;
          seen.completion = std::move(c);
        });
  }

  void expect_equal(RequestId id, const Expected& want, const std::string& where) {
    const Seen& seen = seen_[id];
    ASSERT_TRUE(seen.completed) << where;
    const Completion& c = seen.completion;
    EXPECT_TRUE(c.status.ok()) << where << ": " << c.status.message();
    EXPECT_EQ(c.id, id) << where;
    EXPECT_EQ(c.tokens, want.tokens) << where;
    EXPECT_EQ(seen.streamed, want.tokens) << where << " (streamed)";
    test_util::expect_same_counts(c.stats, want.stats, where);
  }

  // The KV blocks of the largest worst case (prompt + max_tokens, + the drafter's block) of
  // `arrivals`.
  int64_t largest_worst_case(const std::vector<Arrival>& arrivals) {
    int64_t blocks = 0;
    for (const Arrival& a : arrivals) {
      auto need = kv_blocks_needed(*target_, drafter_.get(), a.prompt, a.options);
      EXPECT_TRUE(need.ok());
      blocks = std::max(blocks, need.ok() ? *need : 0);
    }
    return blocks;
  }

  // Adds arrival i (as request i) before its step and steps `s` until it is idle, calling
  // `after_step` after each step.
  void run(Scheduler& s, const std::vector<Arrival>& arrivals,
           const std::function<void()>& after_step) {
    size_t next = 0;
    for (int step = 0; next < arrivals.size() || !s.idle(); ++step) {
      for (; next < arrivals.size() && arrivals[next].step == step; ++next) {
        ASSERT_TRUE(add(s, next, arrivals[next].prompt, arrivals[next].options).ok());
      }
      ASSERT_TRUE(s.step().ok());
      after_step();
      ASSERT_LT(step, 5000);
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  std::map<RequestId, Seen> seen_;
};

TEST_P(SchedulerTest, StaggeredArrivalsEqualSingleRequests) {
  GenerateOptions greedy;
  greedy.stop_ids = {2};
  greedy.max_tokens = 60;
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 17};
  // A stop id that one prompt meets mid-way, a window the long prompt reaches, fewer drafts.
  const Expected probe = alone(kPrompts[1], greedy);
  ASSERT_GT(probe.tokens.size(), 8u);
  GenerateOptions stop_mid = greedy;
  stop_mid.stop_ids = {2, probe.tokens[6]};
  GenerateOptions window = greedy;
  window.max_context = 30;
  GenerateOptions few = sampled;
  few.max_tokens = 7;
  few.draft_tokens = 3;
  GenerateOptions one = greedy;
  one.max_tokens = 1;
  GenerateOptions sampled_other_seed = sampled;
  sampled_other_seed.sampling.seed = 5;
  sampled_other_seed.sampling.top_k = 20;

  const std::vector<Arrival> arrivals = {
      {0, kPrompts[1], greedy},   {0, kPrompts[2], sampled},
      {0, kPrompts[0], few},      {1, kPrompts[3], window},
      {1, kPrompts[1], stop_mid}, {3, kPrompts[2], one},
      {4, kPrompts[2], greedy},   {6, kPrompts[3], sampled_other_seed},
      {9, kPrompts[0], greedy},   {15, kPrompts[1], sampled}};
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 3});
  bool saw_queue = false, saw_full = false;
  ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [&] {
    saw_queue |= s.num_waiting() > 0;
    saw_full |= s.num_running() == 3;
    EXPECT_LE(s.num_running(), 3);
  }));
  EXPECT_TRUE(saw_queue);
  EXPECT_TRUE(saw_full);
  bool context_end = false, stopped = false, length = false;
  int64_t accepted = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const Expected want = alone(arrivals[i].prompt, arrivals[i].options);
    expect_equal(i, want, "request " + std::to_string(i));
    context_end |= want.stats.finish == FinishReason::kContext;
    stopped |= want.stats.finish == FinishReason::kStop;
    length |= want.stats.finish == FinishReason::kLength;
    accepted += want.stats.accepted;
    if (drafter_ && arrivals[i].options.sampling.greedy()) {  // lossless: equals plain decoding
      auto plain =
          generate_plain(*target_, arrivals[i].prompt, arrivals[i].options, nullptr, nullptr);
      ASSERT_TRUE(plain.ok());
      EXPECT_EQ(seen_[i].completion.tokens, *plain) << "request " << i << " (plain)";
    }
  }
  EXPECT_TRUE(context_end && stopped && length);
  if (drafter_) {
    EXPECT_GT(accepted, 20);  // trained drafters: long accepted runs
  }
}

TEST_P(SchedulerTest, CancellationEndsOnlyThatRequest) {
  GenerateOptions o;
  o.max_tokens = 50;
  GenerateOptions sampled = o;
  sampled.sampling = {.temperature = 1.0f, .seed = 3};
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 2});
  ASSERT_TRUE(add(s, 1, kPrompts[1], o).ok());
  // A callback that says stop at its 4th token: as generate_* with the same callback.
  const auto stop_at_4 = [](int32_t, size_t n) { return n < 4; };
  ASSERT_TRUE(add(s, 2, kPrompts[2], sampled, stop_at_4).ok());
  ASSERT_TRUE(add(s, 3, kPrompts[3], o).ok());  // waits (max_num_seqs 2)
  ASSERT_TRUE(add(s, 4, kPrompts[0], o).ok());  // cancelled while waiting
  ASSERT_TRUE(s.step().ok());
  ASSERT_TRUE(s.step().ok());
  s.cancel(1);    // mid-run
  s.cancel(4);    // waiting
  s.cancel(999);  // unknown: ignored
  while (!s.idle()) ASSERT_TRUE(s.step().ok());

  const Expected full1 = alone(kPrompts[1], o);
  const Completion& c1 = seen_[1].completion;
  ASSERT_TRUE(seen_[1].completed);
  EXPECT_EQ(c1.stats.finish, FinishReason::kCancelled);
  ASSERT_GT(c1.tokens.size(), 0u);
  ASSERT_LT(c1.tokens.size(), full1.tokens.size());
  EXPECT_TRUE(std::equal(c1.tokens.begin(), c1.tokens.end(), full1.tokens.begin()));
  EXPECT_EQ(seen_[1].streamed, c1.tokens);
  EXPECT_EQ(c1.stats.generated_tokens, static_cast<int64_t>(c1.tokens.size()));

  size_t n = 0;
  const Expected want2 = alone(kPrompts[2], sampled, [&](int32_t t) { return stop_at_4(t, ++n); });
  EXPECT_EQ(want2.stats.finish, FinishReason::kCancelled);
  expect_equal(2, want2, "callback cancel");
  expect_equal(3, alone(kPrompts[3], o), "after a cancel");

  ASSERT_TRUE(seen_[4].completed);
  EXPECT_EQ(seen_[4].completion.stats.finish, FinishReason::kCancelled);
  EXPECT_TRUE(seen_[4].completion.tokens.empty());
  EXPECT_TRUE(seen_[4].streamed.empty());
}

TEST_P(SchedulerTest, KvPoolLimits) {
  GenerateOptions o;
  o.max_tokens = 40;
  // Each request below needs at most ceil((15 + 40 + B) / 16) blocks; a pool of that many holds
  // one of them at a time.
  auto need = kv_blocks_needed(*target_, drafter_.get(), kPrompts[3], o);
  ASSERT_TRUE(need.ok()) << need.status().message();
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 4, .kv_blocks = *need});
  EXPECT_EQ(s.num_kv_blocks(), *need);

  // Never fits: a clear error naming both sizes; nothing queued.
  GenerateOptions huge = o;
  huge.max_tokens = 400;
  const Status too_big = add(s, 7, kPrompts[1], huge);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("too large for the KV cache"), std::string::npos)
      << too_big.message();
  EXPECT_NE(too_big.message().find(fmt::format("the pool has {} blocks", *need)), std::string::npos)
      << too_big.message();
  EXPECT_EQ(s.num_waiting(), 0);

  // Fits, but not two at once: the second waits for the first's blocks.
  ASSERT_TRUE(add(s, 1, kPrompts[3], o).ok());
  ASSERT_TRUE(add(s, 2, kPrompts[1], o).ok());
  ASSERT_TRUE(s.step().ok());
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  while (!s.idle()) ASSERT_TRUE(s.step().ok());
  expect_equal(1, alone(kPrompts[3], o), "first");
  expect_equal(2, alone(kPrompts[1], o), "second");
  // The scheduler still serves.
  ASSERT_TRUE(add(s, 3, kPrompts[0], o).ok());
  while (!s.idle()) ASSERT_TRUE(s.step().ok());
  expect_equal(3, alone(kPrompts[0], o), "third");
}

TEST_P(SchedulerTest, BadRequestsAreRefused) {
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 2});
  GenerateOptions o;
  o.max_tokens = 3;
  EXPECT_FALSE(add(s, 1, {}, o).ok());
  EXPECT_FALSE(add(s, 1, {1, static_cast<int32_t>(target_->config().vocab_size)}, o).ok());
  GenerateOptions traced = o;
  traced.trace_path = "/dev/null";
  const Status t = add(s, 1, kPrompts[1], traced);
  EXPECT_NE(t.message().find("trace_path"), std::string::npos) << t.message();
  ASSERT_TRUE(add(s, 1, kPrompts[1], o).ok());
  const Status dup = add(s, 1, kPrompts[2], o);
  EXPECT_NE(dup.message().find("already"), std::string::npos) << dup.message();
  GenerateOptions none = o;
  none.max_tokens = 0;  // generates nothing, like generate_*
  ASSERT_TRUE(add(s, 2, kPrompts[2], none).ok());
  while (!s.idle()) ASSERT_TRUE(s.step().ok());
  expect_equal(1, alone(kPrompts[1], o), "valid");
  expect_equal(2, alone(kPrompts[2], none), "max_tokens 0");
  EXPECT_TRUE(s.step().ok());  // idle: nothing to do
}

// A prompt of `length` tokens: a story prefix continued by the target's own seeded sampling.
std::vector<int32_t> long_prompt(CausalLM& target, size_t length, uint64_t seed) {
  GenerateOptions o;
  o.max_tokens = static_cast<int64_t>(length - kPrompts[3].size());
  o.sampling = {.temperature = 1.0f, .seed = seed};
  auto out = generate_plain(target, kPrompts[3], o, nullptr, nullptr);
  EXPECT_TRUE(out.ok()) << out.status().message();
  std::vector<int32_t> prompt = kPrompts[3];
  if (out.ok()) prompt.insert(prompt.end(), out->begin(), out->end());
  EXPECT_EQ(prompt.size(), length);
  return prompt;
}

TEST_P(SchedulerTest, ChunkedPrefillEqualsSingleRequests) {
  const GenerateOptions greedy{.max_tokens = 50, .stop_ids = {2}};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 23};
  GenerateOptions window = greedy;  // the long prompt reaches this window
  window.max_context = 230;
  GenerateOptions one = sampled;
  one.max_tokens = 1;
  const std::vector<int32_t> p120 = long_prompt(*target_, 120, 1);
  const std::vector<int32_t> p290 = long_prompt(*target_, 290, 2);
  const std::vector<int32_t> p200 = long_prompt(*target_, 200, 3);
  const std::vector<Arrival> arrivals = {{0, kPrompts[1], greedy}, {0, p290, sampled},
                                         {1, p120, greedy},        {2, kPrompts[2], sampled},
                                         {3, p200, window},        {3, p290, one},
                                         {5, kPrompts[3], greedy}, {8, p120, sampled}};
  std::vector<Expected> want;
  for (const Arrival& a : arrivals) want.push_back(alone(a.prompt, a.options));
  for (const int64_t chunk : {1, 7, 64}) {
    seen_.clear();
    Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 3, .max_prefill_tokens = chunk});
    bool saw_prefilling = false;
    ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [&] {
      saw_prefilling |= s.num_prefilling() > 0;
      EXPECT_LE(s.num_running(), 3);
    }));
    EXPECT_TRUE(saw_prefilling);
    for (size_t i = 0; i < arrivals.size(); ++i) {
      expect_equal(i, want[i], fmt::format("chunk {}, request {}", chunk, i));
    }
  }
  EXPECT_EQ(want[4].stats.finish, FinishReason::kContext);
}

TEST_P(SchedulerTest, CancellationDuringChunkedPrefill) {
  GenerateOptions o;  // no stop ids: request 1 runs for as long as the test looks
  o.max_tokens = 200;
  GenerateOptions sampled;
  sampled.max_tokens = 30;
  sampled.sampling = {.temperature = 1.0f, .seed = 9};
  const std::vector<int32_t> long1 = long_prompt(*target_, 250, 4);
  const std::vector<int32_t> long2 = long_prompt(*target_, 150, 5);
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 2, .max_prefill_tokens = 7});
  ASSERT_TRUE(add(s, 1, kPrompts[1], o).ok());
  ASSERT_TRUE(s.step().ok());
  ASSERT_TRUE(add(s, 2, long1, sampled).ok());  // cancelled while prefilling
  ASSERT_TRUE(add(s, 3, long2, sampled).ok());  // waits, then takes its place
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.step().ok());
  EXPECT_EQ(s.num_prefilling(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  s.cancel(2);
  ASSERT_TRUE(s.step().ok());
  ASSERT_TRUE(seen_[2].completed);
  EXPECT_EQ(s.num_waiting(), 0);  // request 3 took its slot and KV at once
  while (!s.idle()) ASSERT_TRUE(s.step().ok());

  const Completion& c2 = seen_[2].completion;
  EXPECT_TRUE(c2.status.ok()) << c2.status.message();
  EXPECT_EQ(c2.stats.finish, FinishReason::kCancelled);
  EXPECT_TRUE(c2.tokens.empty());
  EXPECT_TRUE(seen_[2].streamed.empty());
  EXPECT_EQ(c2.stats.generated_tokens, 0);
  expect_equal(1, alone(kPrompts[1], o), "running beside");
  expect_equal(3, alone(long2, sampled), "after the cancel");
}

TEST_P(SchedulerTest, RunningRequestDecodesWhileAnotherPrefills) {
  GenerateOptions o;  // no stop ids: runs its max_tokens, more than 19 steps give it
  o.max_tokens = 400;
  GenerateOptions long_o;
  long_o.max_tokens = 20;
  const std::vector<int32_t> prompt = long_prompt(*target_, 290, 6);
  for (const int64_t chunk : {0, 16}) {
    seen_.clear();
    Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 2, .max_prefill_tokens = chunk});
    ASSERT_TRUE(add(s, 1, kPrompts[1], o).ok());
    ASSERT_TRUE(s.step().ok());
    ASSERT_TRUE(add(s, 2, prompt, long_o).ok());
    int steps = 0;
    const size_t before = seen_[1].streamed.size();
    while (seen_[2].streamed.empty()) {
      ASSERT_TRUE(s.step().ok());
      ++steps;
      // Each step gives the running request at least one token.
      EXPECT_GE(seen_[1].streamed.size(), before + steps) << "chunk " << chunk;
      ASSERT_FALSE(seen_[1].completed) << "chunk " << chunk;
      ASSERT_LT(steps, 1000);
    }
    // 290 prompt tokens in chunks of 16: the first token comes with the 19th chunk.
    EXPECT_EQ(steps, chunk == 0 ? 1 : 19) << "chunk " << chunk;
    while (!s.idle()) ASSERT_TRUE(s.step().ok());
    expect_equal(1, alone(kPrompts[1], o), fmt::format("chunk {}, running", chunk));
    expect_equal(2, alone(prompt, long_o), fmt::format("chunk {}, long prompt", chunk));
  }
}

// Out of memory (Backend's AllocationError, injected at every allocation point of a window of
// steps in turn): the request whose prefill or batched step could not get memory ends alone
// with kOutOfMemory, its blocks freed; every other request finishes with its single-run output
// and the scheduler keeps serving new requests.
TEST_P(SchedulerTest, AllocationFailureEndsOneRequestAndTheOthersGoOn) {
  const GenerateOptions greedy{.max_tokens = 30, .stop_ids = {2}};
  GenerateOptions longer = greedy;
  longer.max_tokens = 60;
  const std::vector<int32_t> p120 = long_prompt(*target_, 120, 7);
  const std::vector<std::pair<std::vector<int32_t>, GenerateOptions>> requests = {
      {kPrompts[1], longer}, {p120, greedy}, {kPrompts[2], greedy}, {kPrompts[3], greedy}};
  std::vector<Expected> want;
  for (const auto& [prompt, o] : requests) want.push_back(alone(prompt, o));
  // Mixed steps on (the prompts ride in request 0's steps) and off (prefills of their own).
  for (const bool mixed : {false, true}) {
    if (mixed) {  // a fresh model: its scratch grows again (allocation points)
      drafter_.reset();
      target_.reset();
      test_util::load_stories(GetParam() == "plain" ? "" : GetParam(), &backend_, &target_,
                              &drafter_);
    }
    int fired = 0, in_mixed_step = 0;
    for (int64_t nth = 1; nth <= 400; ++nth) {
      seen_.clear();
      Scheduler s(*target_, drafter_.get(),
                  {.max_num_seqs = 3, .max_prefill_tokens = 32, .mixed_steps = mixed});
      ASSERT_TRUE(add(s, 0, requests[0].first, requests[0].second).ok());
      ASSERT_TRUE(s.step().ok());
      ASSERT_TRUE(s.step().ok());
      // Armed while request 0 decodes, request 1 prefills in chunks and request 2 joins.
      inject_allocation_failure(nth);
      ASSERT_TRUE(add(s, 1, requests[1].first, requests[1].second).ok());
      ASSERT_TRUE(add(s, 2, requests[2].first, requests[2].second).ok());
      for (int step = 0; !s.idle(); ++step) {
        ASSERT_TRUE(s.step().ok()) << "failure at allocation " << nth;
        ASSERT_LT(step, 1000);
      }
      const bool did_fire = !allocation_failure_pending();
      inject_allocation_failure(0);
      int failed = 0;
      for (RequestId id = 0; id < 3; ++id) {
        const std::string where =
            fmt::format("mixed {}, failure at allocation {}, request {}", mixed, nth, id);
        ASSERT_TRUE(seen_[id].completed) << where;
        const Status& st = seen_[id].completion.status;
        if (!st.ok()) {
          ++failed;
          EXPECT_EQ(st.code(), StatusCode::kOutOfMemory) << where << ": " << st.message();
          EXPECT_NE(st.message().find("injected"), std::string::npos) << st.message();
          if (st.message().find("the mixed step") != std::string::npos) {
            EXPECT_NE(id, 0) << where << ": a prompt of the step, not the decoding request";
            ++in_mixed_step;
          }
          continue;
        }
        expect_equal(id, want[id], where);
      }
      EXPECT_EQ(failed, did_fire ? 1 : 0) << "failure at allocation " << nth;
      // Still serving, with every block back.
      ASSERT_TRUE(add(s, 3, requests[3].first, requests[3].second).ok());
      while (!s.idle()) ASSERT_TRUE(s.step().ok());
      expect_equal(3, want[3], fmt::format("after the failure at allocation {}", nth));
      if (!did_fire) break;
      ++fired;
    }
    // Prefills and batched steps allocate, so several points were hit (a mixed step's scratch may
    // grow once for all).
    EXPECT_GE(fired, mixed ? 1 : 2) << "mixed " << mixed;
    EXPECT_EQ(in_mixed_step > 0, mixed) << "mixed " << mixed;
  }
}

// Preemption (recompute): a KV pool that holds one request's worst case but admits several
// optimistically; when it runs full the newest request is preempted and later re-prefills its
// prompt and committed tokens. Nothing is lost, nothing streamed twice, and every greedy output
// (and every sampled plain one) equals its single run.
TEST_P(SchedulerTest, PreemptionLosesNothingAndKeepsOutputs) {
  const GenerateOptions greedy{.max_tokens = 80};  // no stop ids: every request grows to the end
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 31};
  const std::vector<int32_t> p60 = long_prompt(*target_, 60, 9);
  GenerateOptions stopping = greedy;  // ends at a stop token, possibly in the step it is preempted
  stopping.stop_ids = {2};
  std::vector<Arrival> arrivals = {{0, kPrompts[1], greedy},
                                   {0, kPrompts[2], stopping},
                                   {1, p60, greedy},
                                   {2, kPrompts[3], greedy},
                                   {3, kPrompts[0], stopping}};
  if (!drafter_) arrivals.push_back({4, kPrompts[2], sampled});
  // Penalties count the output generated before a preemption as output, not as prompt.
  GenerateOptions penalized = greedy;
  penalized.sampling.frequency_penalty = 0.6f;
  penalized.sampling.presence_penalty = 0.3f;
  penalized.sampling.repetition_penalty = 1.2f;
  arrivals.push_back({5, kPrompts[1], penalized});
  std::vector<Expected> want;
  for (const Arrival& a : arrivals) want.push_back(alone(a.prompt, a.options));
  const int64_t blocks = largest_worst_case(arrivals);  // p60 + 80 tokens
  for (const int64_t chunk : {int64_t{0}, int64_t{16}}) {
    seen_.clear();
    Scheduler s(
        *target_, drafter_.get(),
        {.max_num_seqs = 4, .kv_blocks = blocks, .max_prefill_tokens = chunk, .preemption = true});
    int most_running = 0;
    ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [&] {
      most_running = std::max<int>(most_running, static_cast<int>(s.num_running()));
    }));
    EXPECT_GT(s.num_preemptions(), 0) << "chunk " << chunk;
    EXPECT_GT(most_running, 1);  // admitted optimistically, more than the worst case allows
    for (size_t i = 0; i < arrivals.size(); ++i) {
      const std::string where = fmt::format("chunk {}, request {}", chunk, i);
      const Seen& seen = seen_[i];
      ASSERT_TRUE(seen.completed) << where;
      EXPECT_TRUE(seen.completion.status.ok()) << where << ": " << seen.completion.status.message();
      EXPECT_EQ(seen.completion.tokens, want[i].tokens) << where;
      EXPECT_EQ(seen.streamed, want[i].tokens) << where << " (streamed)";
      EXPECT_EQ(seen.completion.stats.generated_tokens, want[i].stats.generated_tokens) << where;
      EXPECT_EQ(seen.completion.stats.prompt_tokens, want[i].stats.prompt_tokens) << where;
      EXPECT_EQ(seen.completion.stats.finish, want[i].stats.finish) << where;
    }
  }
}

// Prefix caching: prompts that share a 60-token head (3 whole blocks), arriving after the first
// has prefilled, take those blocks from the cache; an identical prompt takes all but the block of
// its last token; a prompt with another head of the same length takes none. Every output and count
// (drafts and acceptances too: the drafter's context K/V comes from the same blocks) equals the
// single run's, greedy and sampled, with chunked prefill, with a pool small enough that cached
// blocks are evicted, and with preemption.
TEST_P(SchedulerTest, PrefixCachingReusesBlocksAndKeepsOutputs) {
  const std::vector<int32_t> head = long_prompt(*target_, 60, 5);
  std::vector<std::vector<int32_t>> prompts;
  for (const int32_t tail : {300, 301, 302}) {
    prompts.push_back(head);
    prompts.back().insert(prompts.back().end(), {tail, 262, tail});
  }
  prompts.push_back(prompts[0]);                         // identical: 63 tokens, 48 cached
  prompts.push_back({head.begin(), head.begin() + 40});  // shorter: 2 blocks cached
  prompts.push_back(long_prompt(*target_, 63, 6));       // another head: nothing cached
  prompts.back()[1] = head[1] + 1;
  const GenerateOptions greedy{.max_tokens = 30, .stop_ids = {2}};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 29};
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < prompts.size(); ++i) {
    arrivals.push_back({static_cast<int>(8 * i), prompts[i], i % 2 ? sampled : greedy});
  }
  std::vector<Expected> want;
  for (const Arrival& a : arrivals) want.push_back(alone(a.prompt, a.options));
  const int64_t worst = largest_worst_case(arrivals);
  struct Setup {
    int64_t chunk, kv_blocks;
    bool preemption;
  };
  for (const Setup& setup : {Setup{0, 0, false}, Setup{16, 0, false}, Setup{0, worst + 2, false},
                             Setup{16, worst, true}}) {
    const std::string where = fmt::format("chunk {}, kv_blocks {}, preemption {}", setup.chunk,
                                          setup.kv_blocks, setup.preemption);
    seen_.clear();
    Scheduler s(*target_, drafter_.get(),
                {.max_num_seqs = 4,
                 .kv_blocks = setup.kv_blocks,
                 .max_prefill_tokens = setup.chunk,
                 .preemption = setup.preemption,
                 .prefix_caching = true});
    ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [] {}));
    for (size_t i = 0; i < arrivals.size(); ++i) {
      expect_equal(i, want[i], fmt::format("{}, request {}", where, i));
    }
    // The first prompt computes its head; the others find it (unless evicted by then).
    EXPECT_EQ(seen_[0].completion.stats.cached_tokens, 0) << where;
    if (setup.kv_blocks == 0) {
      for (size_t i = 1; i < 4; ++i) {
        EXPECT_EQ(seen_[i].completion.stats.cached_tokens, 48) << where << ", request " << i;
      }
      EXPECT_EQ(seen_[4].completion.stats.cached_tokens, 32) << where;
      EXPECT_EQ(seen_[5].completion.stats.cached_tokens, 0) << where;
    }
  }
  // Without prefix caching nothing is cached.
  seen_.clear();
  Scheduler off(*target_, drafter_.get(), {.max_num_seqs = 4});
  ASSERT_NO_FATAL_FAILURE(run(off, arrivals, [] {}));
  for (size_t i = 0; i < arrivals.size(); ++i) {
    EXPECT_EQ(seen_[i].completion.stats.cached_tokens, 0);
  }
}

// The default prefill is chunked (kDefaultPrefillChunk tokens per forward) in the scheduler, the
// server and generate_*; chunking changes no output of generate_plain / generate_speculative.
TEST_P(SchedulerTest, GeneratePrefillsInChunksWithTheSameOutput) {
  EXPECT_EQ(SchedulerOptions{}.max_prefill_tokens, kDefaultPrefillChunk);
  EXPECT_EQ(GenerateOptions{}.prefill_chunk, kDefaultPrefillChunk);
  const std::vector<int32_t> prompt = long_prompt(*target_, 300, 8);
  GenerateOptions o{.max_tokens = 40, .stop_ids = {2}};
  o.prefill_chunk = 0;
  const Expected whole = alone(prompt, o);
  for (const int64_t chunk : std::vector<int64_t>{1, 7, 64, 299, kDefaultPrefillChunk}) {
    o.prefill_chunk = chunk;
    const Expected chunked = alone(prompt, o);
    EXPECT_EQ(chunked.tokens, whole.tokens) << "chunk " << chunk;
    EXPECT_EQ(chunked.stats.accepted, whole.stats.accepted) << "chunk " << chunk;
  }
  // The scheduler with its default options equals the single run.
  Scheduler s(*target_, drafter_.get(), {});
  ASSERT_TRUE(add(s, 1, prompt, o).ok());
  while (!s.idle()) ASSERT_TRUE(s.step().ok());
  expect_equal(1, whole, "default options");
}

// Mixed steps: while a request decodes, arriving prompts (several at once, a long one in chunks
// of the step's budget, one arriving mid-decode) go into its forward (plain: the decode forward;
// speculative: the verify forward): every step runs one target forward, prompt chunks without
// logits, completed prompts with their last row's; every output is still the single run's. With
// mixed_steps off the same arrivals take forwards of their own.
TEST_P(SchedulerTest, MixedStepsRunOneForwardPerStep) {
  // No stop ids: decodes through the test (speculative steps commit several tokens each).
  const GenerateOptions decoding{.max_tokens = drafter_ ? 400 : 90};
  const GenerateOptions greedy{.max_tokens = 20, .stop_ids = {2}};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 41};
  GenerateOptions with_logprobs = greedy;
  with_logprobs.logprobs = 2;
  GenerateOptions one = greedy;
  one.max_tokens = 1;
  const std::vector<int32_t> p130 = long_prompt(*target_, 130, 11);
  const std::vector<int32_t> p100 = long_prompt(*target_, 100, 12);
  const std::vector<Arrival> arrivals = {
      {0, kPrompts[1], decoding},      {2, p130, greedy},  {2, kPrompts[2], sampled},
      {2, kPrompts[3], with_logprobs}, {9, p100, sampled}, {9, kPrompts[0], one},
      {14, kPrompts[2], greedy}};
  std::vector<Expected> want;
  for (const Arrival& a : arrivals) want.push_back(alone(a.prompt, a.options));
  for (const int64_t chunk : {0, 48}) {
    for (const bool mixed : {true, false}) {
      const std::string where = fmt::format("chunk {}, mixed {}", chunk, mixed);
      seen_.clear();
      ForwardLog log(*target_);
      // Synchronous steps: an overlapped step() queues the next step's forward as well
      // (OverlappedStepsEqualSynchronousOnes counts those).
      Scheduler s(
          log, drafter_.get(),
          {.max_num_seqs = 4, .max_prefill_tokens = chunk, .mixed_steps = mixed, .overlap = false});
      size_t before = 0;
      int most = 0;
      ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [&] {
        if (!seen_[0].completed && before > 0) {
          most = std::max(most, static_cast<int>(log.calls.size() - before));
        }
        before = log.calls.size();
      }));
      for (size_t i = 0; i < arrivals.size(); ++i) {
        expect_equal(i, want[i], fmt::format("{}, request {}", where, i));
      }
      if (!mixed) {
        EXPECT_GT(most, 1) << where;  // the arrivals' prefill, then the batched step
        EXPECT_EQ(s.times().mixed_steps, 0) << where;
        continue;
      }
      EXPECT_EQ(most, 1) << where;  // while request 0 decodes: one forward per step
      EXPECT_GE(s.times().mixed_steps, chunk ? 5 : 2) << where;
      // The shapes: decode rows / verify blocks (logits of every row) first, then the prompts'
      // rows (a chunk's without logits, a completed prompt's last row's).
      bool chunk_beside_decode = false, prompts_together = false;
      for (const ForwardLog::Shape& call : log.calls) {
        int64_t completed = 0, prompt_rows = 0;
        bool chunked = false;
        for (size_t i = 0; i < call.size(); ++i) {
          const auto [rows, logits] = call[i];
          if (logits == rows) continue;  // a decode row or verify block
          if (logits == 0) {
            chunked = true;
            EXPECT_EQ(i, call.size() - 1) << where << ": a chunk comes last";
          }
          completed += logits == 1;
          prompt_rows += rows;
        }
        const bool beside_decode = call[0].first == call[0].second;
        if (chunked) {
          EXPECT_EQ(prompt_rows, 48) << where << ": a chunk takes the rest of the budget";
        }
        chunk_beside_decode |= chunked && beside_decode;
        prompts_together |= completed >= 2 && beside_decode;
      }
      EXPECT_EQ(chunk_beside_decode, chunk > 0) << where;
      EXPECT_TRUE(prompts_together) << where;
    }
  }
}

// Overlapped steps (SchedulerOptions::overlap): many requests with staggered arrivals (more than
// max_num_seqs, so that some wait while the batch decodes in the steady state), different
// max_tokens, stop ids met mid-way, a context window, seeded sampling, logprobs, a callback
// that ends its request and a cancellation between steps give the same tokens, streams and
// finish reasons with overlap on and off, and the single-request engine's where it applies;
// steps were queued ahead (two read-backs pending at once, one read-back per forward) only when
// on; every KV block is free again at the end.
TEST_P(SchedulerTest, OverlappedStepsEqualSynchronousOnes) {
  if (drafter_) GTEST_SKIP() << "overlap is for plain decoding";
  GenerateOptions greedy{.max_tokens = 40, .stop_ids = {2}};
  const Expected probe = alone(kPrompts[1], greedy);
  ASSERT_GT(probe.tokens.size(), 12u);
  GenerateOptions stop_mid = greedy;
  stop_mid.stop_ids = {2, probe.tokens[9]};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.9f, .top_p = 0.95f, .seed = 23};
  GenerateOptions sampled_long = sampled;
  sampled_long.max_tokens = 70;
  sampled_long.sampling.seed = 7;
  GenerateOptions short_one = greedy;
  short_one.max_tokens = 3;
  GenerateOptions window = greedy;
  window.max_context = 28;
  GenerateOptions with_logprobs = greedy;
  with_logprobs.logprobs = 2;
  with_logprobs.max_tokens = 12;
  GenerateOptions two = greedy;
  two.max_tokens = 2;
  const std::vector<Arrival> arrivals = {
      {0, kPrompts[1], greedy},         {0, kPrompts[2], sampled},   {0, kPrompts[0], stop_mid},
      {3, kPrompts[3], short_one},      {8, kPrompts[1], stop_mid},  {12, kPrompts[2], window},
      {12, kPrompts[3], sampled_long},  {13, kPrompts[0], two},      {30, kPrompts[2], greedy},
      {31, kPrompts[3], sampled},       {45, kPrompts[0], greedy},   {46, kPrompts[1], sampled},
      {60, kPrompts[1], with_logprobs}, {61, kPrompts[2], greedy},   {90, kPrompts[3], greedy},
      {91, kPrompts[0], sampled_long},  {92, kPrompts[2], short_one}};
  const RequestId ended_by_callback = 8, cancelled = 9;
  std::map<bool, std::map<RequestId, Seen>> runs;
  for (const bool overlap : {true, false}) {
    const std::string where = fmt::format("overlap {}", overlap);
    seen_.clear();
    ReadLog reads(*backend_);
    ForwardLog log(*target_, &reads);
    Scheduler s(log, nullptr, {.max_num_seqs = 4, .overlap = overlap});
    ASSERT_EQ(s.num_kv_blocks_used(), 0);
    size_t next = 0;
    for (int step = 0; next < arrivals.size() || !s.idle(); ++step) {
      for (; next < arrivals.size() && arrivals[next].step == step; ++next) {
        // Request 8's callback ends it at its 5th token.
        ASSERT_TRUE(add(s, next, arrivals[next].prompt, arrivals[next].options,
                        next == ended_by_callback ? std::function<bool(int32_t, size_t)>(
                                                        [](int32_t, size_t n) { return n < 5; })
                                                  : nullptr)
                        .ok());
      }
      ASSERT_TRUE(s.step().ok()) << where;
      if (seen_.count(cancelled) && seen_[cancelled].streamed.size() >= 6) s.cancel(cancelled);
      ASSERT_LT(step, 5000);
    }
    EXPECT_EQ(s.num_kv_blocks_used(), 0) << where;
    EXPECT_EQ(reads.pending, 0) << where;
    // One read-back per forward that chose tokens (no chunked prefill here: every forward does);
    // the logprobs request's rows add one logits read per step it ran.
    int64_t logits_reads = 0;
    for (const auto& r : reads.reads()) logits_reads += r.f32;
    EXPECT_EQ(static_cast<int64_t>(reads.reads().size()) - logits_reads,
              static_cast<int64_t>(log.calls.size()))
        << where;
    if (overlap) {
      EXPECT_EQ(reads.most_pending, 2) << where << ": a step was queued before the last read";
      EXPECT_GT(s.times().overlapped_steps, 60) << where;
    } else {
      EXPECT_EQ(reads.most_pending, 0) << where;
      EXPECT_EQ(s.times().overlapped_steps, 0) << where;
    }
    for (size_t i = 0; i < arrivals.size(); ++i) {
      const std::string id = fmt::format("{}, request {}", where, i);
      ASSERT_TRUE(seen_[i].completed) << id;
      const Completion& c = seen_[i].completion;
      EXPECT_TRUE(c.status.ok()) << id << ": " << c.status.message();
      EXPECT_EQ(seen_[i].streamed, c.tokens) << id;
      if (i == cancelled) {
        EXPECT_EQ(c.stats.finish, FinishReason::kCancelled) << id;
        EXPECT_EQ(c.tokens.size(), 6u) << id;
        continue;
      }
      if (i == ended_by_callback) {
        EXPECT_EQ(c.stats.finish, FinishReason::kCancelled) << id;
        EXPECT_EQ(c.tokens.size(), 5u) << id;
        continue;
      }
      expect_equal(i, alone(arrivals[i].prompt, arrivals[i].options), id);
    }
    runs[overlap] = seen_;
  }
  std::set<FinishReason> reasons;
  for (const auto& [id, seen] : runs[false]) reasons.insert(seen.completion.stats.finish);
  EXPECT_EQ(reasons.size(), 4u) << "length, stop, context and cancelled";
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const Completion& on = runs[true][i].completion;
    const Completion& off = runs[false][i].completion;
    EXPECT_EQ(on.tokens, off.tokens) << "request " << i;
    EXPECT_EQ(on.stats.finish, off.stats.finish) << "request " << i;
    EXPECT_EQ(on.stats.generated_tokens, off.stats.generated_tokens) << "request " << i;
  }
}

// A step that cannot be queued ahead (its forward fails) leaves the in-flight step to be read
// back as usual; the next step runs synchronously (and succeeds here), then overlap resumes:
// no output changes.
TEST_P(SchedulerTest, AFailedQueuedStepFallsBackToASynchronousOne) {
  if (drafter_) GTEST_SKIP() << "overlap is for plain decoding";
  GenerateOptions greedy{.max_tokens = 30, .stop_ids = {2}};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .seed = 3};
  const std::vector<Arrival> arrivals = {{0, kPrompts[1], greedy}, {0, kPrompts[2], sampled}};
  ForwardLog log(*target_);
  log.fail_queued_ahead = 5;
  Scheduler s(log, nullptr, {.max_num_seqs = 2});
  ASSERT_NO_FATAL_FAILURE(run(s, arrivals, [] {}));
  EXPECT_EQ(log.fail_queued_ahead, 0) << "the failure was injected";
  EXPECT_GT(s.times().overlapped_steps, 10) << "overlap resumed";
  for (size_t i = 0; i < arrivals.size(); ++i) {
    expect_equal(i, alone(arrivals[i].prompt, arrivals[i].options), fmt::format("request {}", i));
  }
  EXPECT_EQ(s.num_kv_blocks_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shipped, SchedulerTest,
                         ::testing::Values("plain", "stories260K-dflash", "stories260K-flashmap"),
                         [](const auto& info) { return test_util::param_name(info.param); });

}  // namespace
}  // namespace bs
