#include "engine/scheduler.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "core/check.h"
#include "engine/generation_common.h"
#include "engine/kv_budget.h"
#include "engine/kv_cache.h"
#include "engine/plain_sequence.h"
#include "engine/speculative_sequence.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

namespace {

// Validates like generate_plain / generate_speculative (resetting `stats` for the request) and
// returns the request's worst-case KV blocks.
Result<int64_t> begin_request(const CausalLM& target, const Drafter* drafter,
                              std::span<const int32_t> prompt, const GenerateOptions& options,
                              GenerateStats& stats) {
  const int64_t max_context = detail::context_window(target, options);
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (drafter) {
    BS_RETURN_IF_ERROR(
        detail::begin_speculative(target, *drafter, prompt, options, max_context, stats).status());
    return detail::speculative_blocks(*drafter, prompt_tokens, options, max_context);
  }
  BS_RETURN_IF_ERROR(detail::begin_generation(target, prompt, options, max_context, stats));
  const int64_t reach =
      std::min(prompt_tokens + std::max<int64_t>(options.max_tokens, 0), max_context);
  return (reach + kKvBlockSize - 1) / kKvBlockSize;
}

// One request: its inputs (owned here; its sequence refers to them), statistics and sequence.
struct Request {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  TokenCallback on_token;
  CompletionCallback on_done;
  LogprobsCallback on_logprobs;
  GenerateStats stats;
  int64_t blocks = 0;     // worst-case KV blocks, held from admission to the end
  bool admitted = false;  // its blocks count against the pool
  bool cancelled = false;
  Clock::time_point added = Clock::now();
  Clock::time_point decode_start = added;
  double prefill_seconds = 0;  // its prefill chunks so far
  double queue_seconds = 0;
  std::unique_ptr<detail::PlainSequence> plain;       // without a drafter
  std::unique_ptr<detail::SpeculativeSequence> spec;  // with one

  bool done() const { return plain ? plain->done() : (!spec || spec->done()); }
  // Prompt tokens its prefill has still to feed.
  int64_t prompt_left() const { return plain ? plain->prompt_left() : spec->prompt_left(); }
  // Begins the sequence's next step; false when it is over.
  Result<bool> begin_step() { return plain ? plain->begin_step() : spec->begin_step(); }
};

using Requests = std::vector<std::unique_ptr<Request>>;

}  // namespace

Result<int64_t> kv_blocks_needed(const CausalLM& target, const Drafter* drafter,
                                 std::span<const int32_t> prompt, const GenerateOptions& options) {
  GenerateStats stats;
  return begin_request(target, drafter, prompt, options, stats);
}

struct Scheduler::Impl {
  Impl(CausalLM& target, Drafter* drafter, SchedulerOptions options);

  void retire_cancelled();
  // Admits waiting requests (to `prefilling`) while they fit, and feeds the front ones' prompts
  // within the step's prefill budget, moving those whose prefill is done to `running`.
  void admit_and_prefill();
  void admit_waiting();
  // Feeds up to `max_tokens` (0: all) of the request's prompt; after the last chunk its first
  // token is committed and its first decode step begun.
  Status prefill(Request& r, int64_t max_tokens);
  Status step_plain();
  Status step_speculative();
  void begin_next_steps();
  // Hands the request its result and frees its KV blocks.
  void complete(std::unique_ptr<Request> r, Status status);
  // Completes and removes every request of `requests` for which `ending(request)` gives a status.
  template <typename Requests, typename Ending>
  void complete_if(Requests& requests, Ending ending);

  CausalLM& target;
  Drafter* drafter;
  int64_t max_num_seqs = 0;
  int64_t max_prefill_tokens = 0;  // per step; 0: every admitted prompt whole
  int64_t num_blocks = 0;
  std::optional<detail::SpeculativeRun> spec;  // with a drafter: both pools, the allocator
  KvPool pool;                                 // without: the target's pool
  std::optional<BlockAllocator> allocator;     // and its allocator
  Tensor ids;  // I32 [max_num_seqs]: a plain step's tokens, chosen on the device
  std::deque<std::unique_ptr<Request>> waiting;
  std::deque<std::unique_ptr<Request>> prefilling;  // admitted, prompt partly cached, FIFO
  Requests running;                                 // each with its next step begun
  int64_t reserved = 0;                             // blocks of the admitted requests' worst cases
  // Plain step scratch.
  std::vector<ForwardRequest> reqs;
  BatchForwardResult res;
  std::vector<detail::PlainSequence*> plain_seqs;  // plain step: the running sequences
  std::vector<detail::SpeculativeSequence*> seqs;  // speculative step: the running sequences
};

Scheduler::Impl::Impl(CausalLM& target, Drafter* drafter, SchedulerOptions options)
    : target(target),
      drafter(drafter),
      max_num_seqs(options.max_num_seqs),
      max_prefill_tokens(options.max_prefill_tokens) {
  BS_CHECK(max_num_seqs >= 1);
  BS_CHECK(max_prefill_tokens >= 0);
  num_blocks = options.kv_blocks > 0
                   ? options.kv_blocks
                   : default_kv_blocks(target, drafter, max_num_seqs, options.max_context);
  if (drafter) {
    spec.emplace(target, *drafter, num_blocks, max_num_seqs);
  } else {
    ids = target.backend().empty({max_num_seqs}, DType::kI32);
    pool = target.make_kv_pool(num_blocks);
    allocator.emplace(num_blocks);
  }
}

void Scheduler::Impl::complete(std::unique_ptr<Request> r, Status status) {
  Completion c{.id = r->id, .status = std::move(status), .queue_seconds = r->queue_seconds};
  if (r->plain || r->spec) {
    if (r->prompt_left() == 0) r->stats.decode_seconds = seconds_since(r->decode_start);
    c.tokens = r->plain ? r->plain->finish() : r->spec->finish();
  }
  r->plain.reset();  // returns the KV blocks
  r->spec.reset();
  if (r->admitted) reserved -= r->blocks;
  c.stats = std::move(r->stats);
  if (r->on_done) r->on_done(std::move(c));
}

template <typename Requests, typename Ending>
void Scheduler::Impl::complete_if(Requests& requests, Ending ending) {
  for (auto it = requests.begin(); it != requests.end();) {
    std::optional<Status> status = ending(**it);
    if (!status) {
      ++it;
      continue;
    }
    std::unique_ptr<Request> r = std::move(*it);
    it = requests.erase(it);
    complete(std::move(r), std::move(*status));
  }
}

void Scheduler::Impl::retire_cancelled() {
  const auto cancelled = [](Request& r) -> std::optional<Status> {
    if (!r.cancelled) return std::nullopt;
    r.stats.finish = FinishReason::kCancelled;
    return Status::Ok();
  };
  complete_if(waiting, cancelled);
  complete_if(prefilling, cancelled);
  complete_if(running, cancelled);
}

Status Scheduler::Impl::prefill(Request& r, int64_t max_tokens) {
  const auto t = Clock::now();
  if (drafter) {
    BS_RETURN_IF_ERROR(r.spec->prefill(max_tokens));
  } else if (max_tokens > 0 && max_tokens < r.plain->prompt_left()) {
    BS_RETURN_IF_ERROR(r.plain->prefill_chunk(target, pool, max_tokens));
  } else {
    bool stepped = false;
    BS_RETURN_IF_ERROR(detail::plain_step(target, pool, ids, *r.plain, &stepped));
  }
  r.prefill_seconds += seconds_since(t);
  if (r.prompt_left() > 0) return Status::Ok();
  r.stats.prefill_seconds = r.prefill_seconds;
  r.decode_start = Clock::now();
  return r.begin_step().status();
}

void Scheduler::Impl::admit_waiting() {
  while (!waiting.empty() &&
         static_cast<int64_t>(running.size() + prefilling.size()) < max_num_seqs &&
         reserved + waiting.front()->blocks <= num_blocks) {
    std::unique_ptr<Request> r = std::move(waiting.front());
    waiting.pop_front();
    r->queue_seconds = seconds_since(r->added);
    if (r->options.max_tokens <= 0) {  // generate_* run nothing either
      complete(std::move(r), Status::Ok());
      continue;
    }
    r->admitted = true;
    reserved += r->blocks;
    if (drafter) {
      r->spec = std::make_unique<detail::SpeculativeSequence>(
          *spec, r->options, r->prompt, r->on_token, r->on_logprobs, r->stats);
    } else {
      r->plain = std::make_unique<detail::PlainSequence>(
          *allocator, r->options, detail::context_window(target, r->options), r->prompt,
          r->on_token, r->on_logprobs, r->stats);
    }
    prefilling.push_back(std::move(r));
  }
}

void Scheduler::Impl::admit_and_prefill() {
  int64_t budget = max_prefill_tokens > 0 ? max_prefill_tokens : -1;  // -1: unlimited
  for (;;) {
    admit_waiting();  // again after a request ended in its prefill and freed its room
    if (prefilling.empty() || budget == 0) return;
    Request& r = *prefilling.front();
    const int64_t n = budget < 0 ? 0 : std::min(budget, r.prompt_left());
    if (budget > 0) budget -= n;
    const Status s = prefill(r, n);
    if (s.ok() && !r.done() && r.prompt_left() > 0) continue;  // the budget is spent
    std::unique_ptr<Request> front = std::move(prefilling.front());
    prefilling.pop_front();
    if (!s.ok() || front->done()) {
      complete(std::move(front), s);
    } else {
      running.push_back(std::move(front));
    }
  }
}

Status Scheduler::Impl::step_plain() {
  reqs.clear();
  plain_seqs.clear();
  for (const auto& r : running) {
    reqs.push_back(r->plain->request());
    plain_seqs.push_back(r->plain.get());
  }
  BS_RETURN_IF_ERROR(target.forward_batch(reqs, pool, &res));
  detail::take_step(target.backend(), plain_seqs, res.logits, ids);
  return Status::Ok();
}

Status Scheduler::Impl::step_speculative() {
  seqs.clear();
  for (const auto& r : running) seqs.push_back(r->spec.get());
  return detail::speculative_step(*spec, seqs);
}

void Scheduler::Impl::begin_next_steps() {
  complete_if(running, [](Request& r) -> std::optional<Status> {
    const Result<bool> stepping = r.begin_step();
    if (stepping.ok() && *stepping) return std::nullopt;
    return stepping.status();
  });
}

Scheduler::Scheduler(CausalLM& target, Drafter* drafter, SchedulerOptions options)
    : impl_(std::make_unique<Impl>(target, drafter, options)) {}

Scheduler::~Scheduler() = default;

Status Scheduler::add(RequestId id, std::vector<int32_t> prompt, GenerateOptions options,
                      TokenCallback on_token, CompletionCallback on_done,
                      LogprobsCallback on_logprobs) {
  Impl& m = *impl_;
  if (!options.trace_path.empty()) {
    return InvalidArgument(
        "trace_path is not supported with continuous batching (trace one sequence with "
        "generate_speculative)");
  }
  const auto same = [id](const std::unique_ptr<Request>& r) { return r->id == id; };
  if (std::any_of(m.waiting.begin(), m.waiting.end(), same) ||
      std::any_of(m.prefilling.begin(), m.prefilling.end(), same) ||
      std::any_of(m.running.begin(), m.running.end(), same)) {
    return InvalidArgument("request id {} is already queued or running", id);
  }
  auto r = std::make_unique<Request>();
  BS_ASSIGN_OR_RETURN(r->blocks, begin_request(m.target, m.drafter, prompt, options, r->stats));
  if (r->blocks > m.num_blocks) {
    return InvalidArgument(
        "request too large for the KV cache: prompt {} + max_tokens {} tokens (context window "
        "{}{}) need {} blocks of {} positions, the pool has {} blocks",
        prompt.size(), options.max_tokens, detail::context_window(m.target, options),
        m.drafter ? fmt::format(", plus the drafter's block of {}", m.drafter->block_size()) : "",
        r->blocks, kKvBlockSize, m.num_blocks);
  }
  r->id = id;
  r->prompt = std::move(prompt);
  r->options = std::move(options);
  r->on_token = std::move(on_token);
  r->on_done = std::move(on_done);
  r->on_logprobs = std::move(on_logprobs);
  m.waiting.push_back(std::move(r));
  return Status::Ok();
}

Status Scheduler::step() {
  Impl& m = *impl_;
  m.retire_cancelled();
  m.admit_and_prefill();
  if (m.running.empty()) return Status::Ok();
  const Status s = m.drafter ? m.step_speculative() : m.step_plain();
  if (!s.ok()) {
    Requests failed = std::move(m.running);
    m.running.clear();
    for (auto& r : failed) m.complete(std::move(r), s);
    return s;
  }
  m.begin_next_steps();
  return Status::Ok();
}

void Scheduler::cancel(RequestId id) {
  Impl& m = *impl_;
  for (auto& r : m.waiting) r->cancelled |= r->id == id;
  for (auto& r : m.prefilling) r->cancelled |= r->id == id;
  for (auto& r : m.running) r->cancelled |= r->id == id;
}

bool Scheduler::idle() const {
  return impl_->waiting.empty() && impl_->prefilling.empty() && impl_->running.empty();
}
int64_t Scheduler::num_running() const {
  return static_cast<int64_t>(impl_->prefilling.size() + impl_->running.size());
}
int64_t Scheduler::num_prefilling() const { return static_cast<int64_t>(impl_->prefilling.size()); }
int64_t Scheduler::num_waiting() const { return static_cast<int64_t>(impl_->waiting.size()); }
int64_t Scheduler::num_kv_blocks() const { return impl_->num_blocks; }
int64_t Scheduler::num_kv_blocks_used() const {
  const BlockAllocator& a = impl_->spec ? impl_->spec->allocator : *impl_->allocator;
  return a.num_blocks() - a.free_blocks();
}

}  // namespace bs
