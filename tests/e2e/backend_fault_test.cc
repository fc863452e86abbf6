// A backend fault (an engine bug the ops can only record: a KV slot outside the pool, see
// Backend's BackendFault) ends the requests of the step it surfaced in with a kInternal error and
// nothing else: generate_* returns the error, the Scheduler fails that step's requests (or the one
// request whose prefill it was; a prompt arriving while others decode rides in their mixed step,
// whose requests all end) and then serves the next ones as if nothing had happened. The
// stories260K target (and a shipped drafter) run on a decorator of the CPU backend that sends the
// next KV write of its choosing to a slot past the pool.
#include <gtest/gtest.h>

#include <map>
#include <memory>
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

// Forwards to the CPU backend; after misplace_next_write(), the next op that writes KV rows
// (kv_write, attention_prologue, prologue_attention) gets its first row's slot moved past the
// pool, as an engine bug would.
class MisplacingBackend : public test_util::CountingBackend {
 public:
  explicit MisplacingBackend(Backend& inner) : CountingBackend(inner), inner_(inner) {}
  void misplace_next_write() { armed_ = true; }
  bool armed() const { return armed_; }

  void kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    CountingBackend::kv_write(k_pool, v_pool, k, v, maybe_misplaced(slots, k_pool));
  }
  void attention_prologue(const Tensor& q_out, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions,
                          const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& slots) override {
    CountingBackend::attention_prologue(q_out, qkv, q_norm, k_norm, eps, positions, inv_freq,
                                        attention_scaling, k_pool, v_pool,
                                        maybe_misplaced(slots, k_pool));
  }
  void prologue_attention(const Tensor& out, const Tensor& q_scratch, const Tensor& qkv,
                          const Tensor& q_norm, const Tensor& k_norm, float eps,
                          const Tensor& positions, const Tensor& inv_freq, float attention_scaling,
                          const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                          const Tensor& block_tables, const Tensor& kv_lens, int64_t max_kv_len,
                          AttentionMask mask, float scale) override {
    CountingBackend::prologue_attention(
        out, q_scratch, qkv, q_norm, k_norm, eps, positions, inv_freq, attention_scaling, k_pool,
        v_pool, maybe_misplaced(slots, k_pool), block_tables, kv_lens, max_kv_len, mask, scale);
  }

 private:
  Tensor maybe_misplaced(const Tensor& slots, const Tensor& k_pool) {
    if (!armed_ || slots.numel() == 0) return slots;
    armed_ = false;
    // The CPU backend's tensors are host memory: read and rewrite them directly (a read-back
    // through the backend would report a pending fault here instead of at the engine's).
    Tensor moved = inner_.empty({slots.numel()}, DType::kI32);
    for (int64_t i = 0; i < slots.numel(); ++i) moved.as<int32_t>()[i] = slots.as<int32_t>()[i];
    moved.as<int32_t>()[0] = static_cast<int32_t>(k_pool.dim(0) * k_pool.dim(1) + 1000);
    return moved;
  }

  Backend& inner_;
  bool armed_ = false;
};

GenerateOptions greedy(int64_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  return o;
}

void expect_fault(const Status& s, const std::string& what) {
  EXPECT_EQ(s.code(), StatusCode::kInternal) << what << ": " << s.message();
  EXPECT_NE(s.message().find("is outside the KV pool of"), std::string::npos)
      << what << ": " << s.message();
}

// Param: the drafter ("" for plain decoding).
class BackendFaults : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string models = std::string(BS_SOURCE_DIR) + "/models";
    cpu_ = make_cpu_backend(1);
    backend_ = std::make_unique<MisplacingBackend>(*cpu_);
    auto t = load_target(models + "/stories260K", *backend_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    target_ = std::move(*t);
    if (GetParam().empty()) return;
    auto d = load_drafter(models + "/" + GetParam(), *target_, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    drafter_ = std::move(*d);
  }
  Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt) {
    return drafter_
               ? generate_speculative(*target_, *drafter_, prompt, greedy(60), nullptr, nullptr)
               : generate_plain(*target_, prompt, greedy(60), nullptr, nullptr);
  }
  // Queues `prompt` as request `id`; its completion lands in done_[id].
  void add(Scheduler& s, RequestId id, const std::vector<int32_t>& prompt) {
    ASSERT_TRUE(s.add(id, prompt, greedy(60), nullptr, [this](Completion c) {
                   done_[c.id] = std::move(c);
                 }).ok());
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<MisplacingBackend> backend_;
  std::unique_ptr<CausalLM> target_;
  std::unique_ptr<Drafter> drafter_;
  std::map<RequestId, Completion> done_;
};

TEST_P(BackendFaults, GenerateReturnsTheFault) {
  const auto& prompt = test_util::kStoryPrompts[1];
  const auto reference = generate(prompt);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  backend_->misplace_next_write();
  const auto faulted = generate(prompt);
  EXPECT_FALSE(backend_->armed());
  expect_fault(faulted.status(), "generate");
  const auto again = generate(prompt);  // the fault was reported once; the backend is clean
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *reference);
}

TEST_P(BackendFaults, SchedulerFailsThatStepAndServesTheNext) {
  const auto& prompts = test_util::kStoryPrompts;
  std::vector<std::vector<int32_t>> reference;
  for (const auto& p : prompts) {
    const auto r = generate(p);
    ASSERT_TRUE(r.ok()) << r.status().message();
    reference.push_back(*r);
  }
  Scheduler s(*target_, drafter_.get(), {.max_num_seqs = 2});
  // Requests 0 and 1 decode together; a fault in their batched step ends both.
  add(s, 0, prompts[1]);
  add(s, 1, prompts[2]);
  ASSERT_TRUE(s.step().ok());  // admits, prefills and decodes both
  ASSERT_EQ(s.num_running(), 2);
  backend_->misplace_next_write();
  expect_fault(s.step(), "the batched step");
  ASSERT_EQ(done_.size(), 2u);
  for (RequestId id : {0, 1}) expect_fault(done_[id].status, "request " + std::to_string(id));
  EXPECT_EQ(s.num_running(), 0);
  // A fault in a prefill ends that request only.
  backend_->misplace_next_write();
  add(s, 2, prompts[1]);
  ASSERT_TRUE(s.step().ok());
  ASSERT_TRUE(done_.count(2));
  expect_fault(done_[2].status, "request 2 (its prefill)");
  EXPECT_TRUE(s.idle());
  // A prompt arriving while request 3 decodes rides in its forward (a mixed step): a fault there
  // ends both, as in a batched step.
  add(s, 3, prompts[3]);
  ASSERT_TRUE(s.step().ok());
  backend_->misplace_next_write();
  add(s, 6, prompts[1]);
  expect_fault(s.step(), "the mixed step");
  for (RequestId id : {3, 6}) {
    ASSERT_TRUE(done_.count(id));
    expect_fault(done_[id].status, "request " + std::to_string(id) + " (the mixed step)");
  }
  EXPECT_TRUE(s.idle());
  add(s, 3, prompts[3]);  // served again below
  // Then everything is served as if nothing had happened.
  add(s, 4, prompts[0]);
  add(s, 5, prompts[2]);
  for (int i = 0; i < 200 && !s.idle(); ++i) ASSERT_TRUE(s.step().ok());
  ASSERT_TRUE(s.idle());
  for (const auto& [id, prompt] : std::map<RequestId, size_t>{{3, 3}, {4, 0}, {5, 2}}) {
    ASSERT_TRUE(done_[id].status.ok()) << id << ": " << done_[id].status.message();
    EXPECT_EQ(done_[id].tokens, reference[prompt]) << "request " << id;
  }
}

INSTANTIATE_TEST_SUITE_P(Decoding, BackendFaults, ::testing::Values("", "stories260K-dflash"),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("plain")
                                                     : test_util::param_name(info.param);
                         });

}  // namespace
}  // namespace bs
