#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <optional>
#include <utility>

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
  int64_t committed = 0;  // tokens handed to on_token so far
  // Overlap: the request has a row in the step queued ahead (Impl::inflight); `taken`: the step
  // just read back had one (read_inflight), its end not processed yet.
  bool in_flight = false;
  bool taken = false;
  // Preemption (SchedulerOptions::preemption): the tokens committed before the request was last
  // preempted, and what its current sequence runs on: prompt + resumed, max_tokens less them.
  std::vector<int32_t> resumed;
  std::vector<int32_t> seq_prompt;
  GenerateOptions seq_options;
  std::optional<Sampler> sampler;  // a preempted plain sequence's sampler, carried over
  int64_t held = 0;                // blocks counted in Impl::reserved while admitted
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

// The KV pool had no block left (BlockAllocator), as opposed to the device's memory.
bool is_kv_full(const Status& s) {
  return s.code() == StatusCode::kOutOfMemory &&
         s.message().find(kKvCacheFull) != std::string::npos;
}

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
  // Chunked prefill: the front prefilling requests whose whole remaining prompt fits `budget` go
  // through one forward_batch, each taking its first token as a prefill alone does (one weight
  // stream for all their prompts instead of one each); with a drafter the forward taps its layers
  // and one Drafter::observe_batch takes every prompt's taps (detail::prefill_batch). The budget
  // shrinks by their tokens. When the batch runs out of memory the newest of them ends with that
  // error (as in a batched step) and the others stay. False (nothing changed but KV reservations,
  // which their own prefill reuses) when fewer than two qualify, the KV pool is full (preemption)
  // or their batch fails otherwise: then each prefills alone.
  bool prefill_together(int64_t& budget);
  // Mixed steps (requests running): the prompt rows the step's prefill budget allows (the front
  // prefilling requests' prompts, whole while they fit, then a chunk of the next, as
  // admit_and_prefill feeds them) go into the running requests' forward_batch (plain: the decode
  // forward; speculative: the verify forward, detail::SpeculativeStep with prompts), so that the
  // weights stream once per step. plan_mixed_step lists them in `parts` and reserves their KV;
  // false (nothing to mix, or a request's step cannot begin: the unmixed path then handles it as
  // it always has) leaves the step unmixed.
  bool plan_mixed_step();
  enum class Mixed {
    kRan,       // every request stepped; completed prompts joined `running`
    kRetry,     // out of memory: the newest prompt's request ended, the others repeat the step
    kFallback,  // the forward returned another error, nothing changed: run the step unmixed
    kFailed,    // a backend fault, or a failure after tokens were committed: every request of the
                // step ended with mixed_error
  };
  Mixed step_mixed();
  // A plain mixed step's forward and token choice; an error it returns changed nothing.
  Status forward_mixed();
  Status step_plain();
  Status step_speculative();
  void begin_next_steps();
  // Hands the request its result and frees its KV blocks.
  void complete(std::unique_ptr<Request> r, Status status);
  // Completes and removes every request of `requests` for which `ending(request)` gives a status.
  template <typename Requests, typename Ending>
  void complete_if(Requests& requests, Ending ending);
  // The batched step of the running requests failed with `s`: ends the newest when the failure is
  // an out-of-memory before any token was committed (the others repeat the step), else every one.
  void fail_step(const Status& s, const std::vector<int64_t>& committed_before);
  // Preemption: frees the request's sequence (its KV blocks) and queues it again before every
  // later arrival, to re-prefill its prompt and the tokens it committed.
  void preempt(std::unique_ptr<Request> r);
  // Preempts the most recently admitted request other than `keep` (prefilling first, then
  // running after index `after`); false when there is none.
  bool preempt_newest(const Request* keep, size_t after);
  BlockAllocator& kv_allocator() { return spec ? spec->allocator : *allocator; }

  // ---- Overlap (SchedulerOptions::overlap) ----
  // A plain step queued on the device whose token ids are being read back (Backend::begin_read):
  // rows[i] is the request whose token is row i of `ids`; nullptr: the request ended after the
  // step was queued, its token is dropped (its KV row lay in blocks it had reserved).
  struct InFlight {
    std::vector<Request*> rows;
    Tensor ids;
    int64_t ticket = 0;
  };
  // The steady state that overlaps: plain decoding, no preemption, nothing prefilling, cancelled
  // or admissible, no request wanting logprobs, and every running request in the queued step.
  bool steady() const;
  // Queues a step of `rows` (their forwards, token choice into `ids`, the ids' read-back begun)
  // as `inflight`: from the requests' host tokens (from == nullptr), or ahead, each row's input
  // the token `from` chose for the request on the device (rows: a subsequence of from->rows).
  Status launch(std::span<Request* const> rows, const InFlight* from);
  // Waits for f's ids and commits them (a cancelled request's token is dropped), marking the rows
  // `taken`, then end_read_step(). A failed read-back (backend fault) ends every running request.
  Status read_inflight(InFlight& f);
  // Ends the requests that ended, drops their rows from `inflight`, and begins the next step of
  // the taken ones not queued ahead.
  void end_read_step();
  // One overlapped step: queues the step after the in-flight one (launching the in-flight one
  // first when there is none), then reads back and commits the in-flight one. nullopt: the
  // first launch failed, nothing changed (the caller runs the step synchronously).
  std::optional<Status> step_overlapped();
  // Reads back and ends the in-flight step, as a synchronous step would have ended it.
  Status drain();
  // Waits for the in-flight step's read-back and forgets it (its requests are ending anyway).
  void abandon();
  // Every running request ends with `s` (after a failed read-back).
  void fail_all(const Status& s);
  std::optional<InFlight> inflight;
  Tensor ids_next;  // the other ids buffer: the in-flight step's ids stay while the next is chosen
  std::vector<int32_t> host_ids;
  std::vector<Request*> ahead;  // scratch
  bool overlap = true;
  bool overlap_paused = false;  // a queued-ahead launch failed: the next step runs synchronously

  CausalLM& target;
  Drafter* drafter;
  int64_t max_num_seqs = 0;
  int64_t max_prefill_tokens = 0;  // per step; 0: every admitted prompt whole
  bool preemption = false;
  int64_t num_blocks = 0;
  std::optional<detail::SpeculativeRun> spec;  // with a drafter: both pools, the allocator
  KvPool pool;                                 // without: the target's pool
  std::optional<BlockAllocator> allocator;     // and its allocator
  Tensor ids;  // I32 [max_num_seqs]: a plain step's tokens, chosen on the device
  std::deque<std::unique_ptr<Request>> waiting;
  std::deque<std::unique_ptr<Request>> prefilling;  // admitted, prompt partly cached, FIFO
  Requests running;                                 // each with its next step begun
  int64_t reserved = 0;  // blocks of the admitted requests' worst cases (without preemption)
  int64_t num_preemptions = 0;
  SchedulerTimes times;
  std::vector<int64_t> committed_before;  // step(): each running request's commits so far
  // Plain step scratch.
  std::vector<ForwardRequest> reqs;
  BatchForwardResult res;
  std::vector<detail::PlainSequence*> plain_seqs;  // plain step: the running sequences
  std::vector<Request*> group;                     // prefill_together's requests
  std::vector<detail::SpeculativeSequence*> seqs;  // speculative step / prefill_together
  // A mixed step's prompt rows: `n` tokens of the request's prompt, the rest of it when `last`.
  struct PromptPart {
    Request* r = nullptr;
    int64_t n = 0;
    bool last = false;
  };
  std::vector<PromptPart> parts;                          // the front prefilling requests, in order
  std::vector<detail::SpeculativeSequence*> prompt_seqs;  // a speculative mixed step's parts
  std::vector<int64_t> prompt_tokens;
  Status mixed_error;  // Mixed::kFailed's
  bool mixed_steps = true;

  ~Impl() {
    if (inflight) abandon();
  }
};

Scheduler::Impl::Impl(CausalLM& target, Drafter* drafter, SchedulerOptions options)
    : target(target),
      drafter(drafter),
      max_num_seqs(options.max_num_seqs),
      max_prefill_tokens(options.max_prefill_tokens),
      preemption(options.preemption),
      mixed_steps(options.mixed_steps) {
  overlap = options.overlap;
  BS_CHECK(max_num_seqs >= 1);
  BS_CHECK(max_prefill_tokens >= 0);
  num_blocks = options.kv_blocks > 0
                   ? options.kv_blocks
                   : default_kv_blocks(target, drafter, max_num_seqs, options.max_context);
  if (drafter) {
    spec.emplace(target, *drafter, num_blocks, max_num_seqs, options.prefix_caching);
    spec->step_time = options.step_time;
    spec->step_time_given = !options.step_time.empty();
  } else {
    ids = target.backend().empty({max_num_seqs}, DType::kI32);
    if (overlap) ids_next = target.backend().empty({max_num_seqs}, DType::kI32);
    pool = target.make_kv_pool(num_blocks);
    allocator.emplace(num_blocks, options.prefix_caching);
  }
}

void Scheduler::Impl::complete(std::unique_ptr<Request> r, Status status) {
  Completion c{.id = r->id, .status = std::move(status), .queue_seconds = r->queue_seconds};
  c.tokens = std::move(r->resumed);
  if (r->plain || r->spec) {
    if (r->prompt_left() == 0) r->stats.decode_seconds = seconds_since(r->decode_start);
    const std::vector<int32_t> last = r->plain ? r->plain->finish() : r->spec->finish();
    c.tokens.insert(c.tokens.end(), last.begin(), last.end());
  }
  r->plain.reset();  // returns the KV blocks
  r->spec.reset();
  if (r->admitted) reserved -= r->held;
  c.stats = std::move(r->stats);
  c.stats.generated_tokens = static_cast<int64_t>(c.tokens.size());
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

bool Scheduler::Impl::prefill_together(int64_t& budget) {
  if (budget <= 0) return false;
  group.clear();
  int64_t tokens = 0;
  for (const auto& r : prefilling) {
    if (static_cast<int64_t>(group.size()) == max_num_seqs || tokens + r->prompt_left() > budget) {
      break;
    }
    tokens += r->prompt_left();
    group.push_back(r.get());
  }
  if (group.size() < 2) return false;
  const auto t = Clock::now();
  Status batch;
  if (drafter) {
    seqs.clear();
    for (Request* r : group) seqs.push_back(r->spec.get());
    batch = catch_allocation_failure([&] { return detail::prefill_batch(*spec, seqs); });
    if (is_kv_full(batch)) return false;  // each prefills (or waits again) on its own
  } else {
    reqs.clear();
    plain_seqs.clear();
    for (Request* r : group) {
      const Result<bool> stepping = r->begin_step();  // reserves its prompt's KV blocks
      if (!stepping.ok() || !*stepping) return false;
      reqs.push_back(r->plain->request());
      plain_seqs.push_back(r->plain.get());
    }
    batch = catch_allocation_failure([&] { return target.forward_batch(reqs, pool, &res); });
  }
  if (batch.code() == StatusCode::kOutOfMemory) {
    // As a batched step's: the newest of them ends with it, the others try again, fewer at once.
    const auto newest = prefilling.begin() + static_cast<std::ptrdiff_t>(group.size() - 1);
    std::unique_ptr<Request> r = std::move(*newest);
    prefilling.erase(newest);
    complete(std::move(r),
             batch.with_context(fmt::format("the batched prefill of {} prompts ran out of memory "
                                            "and ended the newest of them",
                                            group.size())));
    return true;
  }
  if (!batch.ok()) return false;  // each prefills alone and fails, if it does, on its own
  if (!drafter) detail::take_step(target.backend(), plain_seqs, res.logits, ids);
  budget -= tokens;
  ++times.prefill_batches;
  const double seconds = seconds_since(t);
  for (size_t i = 0; i < group.size(); ++i) {  // the front ones, in order
    std::unique_ptr<Request> r = std::move(prefilling.front());
    prefilling.pop_front();
    r->prefill_seconds += seconds;
    r->stats.prefill_seconds = r->prefill_seconds;
    r->decode_start = Clock::now();
    const Status s = r->done() ? Status::Ok() : r->begin_step().status();
    if (preemption && is_kv_full(s)) {
      preempt(std::move(r));
    } else if (!s.ok() || r->done()) {
      complete(std::move(r), s);
    } else {
      running.push_back(std::move(r));
    }
  }
  return true;
}

void Scheduler::Impl::admit_waiting() {
  // With preemption a request is admitted when its prompt (+ the first step's block) fits the
  // free blocks beside a watermark of one block per running request; else its worst case must
  // fit beside the others' worst cases.
  const auto fits = [&](const Request& r) {
    if (!preemption) return reserved + r.blocks <= num_blocks;
    const int64_t first_step = drafter ? drafter->block_size() : 1;
    const int64_t need =
        (static_cast<int64_t>(r.seq_prompt.size()) + first_step + kKvBlockSize - 1) / kKvBlockSize;
    const auto admitted = static_cast<int64_t>(running.size() + prefilling.size());
    return need + admitted <= kv_allocator().free_blocks();
  };
  while (!waiting.empty() &&
         static_cast<int64_t>(running.size() + prefilling.size()) < max_num_seqs &&
         fits(*waiting.front())) {
    std::unique_ptr<Request> r = std::move(waiting.front());
    waiting.pop_front();
    if (r->resumed.empty()) r->queue_seconds = seconds_since(r->added);
    if (r->seq_options.max_tokens <= 0) {  // generate_* run nothing either
      complete(std::move(r), Status::Ok());
      continue;
    }
    if (static_cast<int64_t>(r->seq_prompt.size()) > detail::context_window(target, r->options)) {
      r->stats.finish = FinishReason::kContext;  // preempted at the window's end, as its run ends
      complete(std::move(r), Status::Ok());
      continue;
    }
    r->admitted = true;
    r->held = preemption ? 0 : r->blocks;
    reserved += r->held;
    if (drafter) {
      r->spec = std::make_unique<detail::SpeculativeSequence>(
          *spec, r->seq_options, r->seq_prompt, r->on_token, r->on_logprobs, r->stats);
    } else {
      r->plain = std::make_unique<detail::PlainSequence>(
          *allocator, r->seq_options, detail::context_window(target, r->options), r->seq_prompt,
          r->on_token, r->on_logprobs, r->stats);
      if (r->sampler) r->plain->sampler() = *r->sampler;  // the stream goes on
    }
    prefilling.push_back(std::move(r));
  }
}

void Scheduler::Impl::preempt(std::unique_ptr<Request> r) {
  const std::span<const int32_t> done = r->plain ? r->plain->committed() : r->spec->committed();
  r->resumed.insert(r->resumed.end(), done.begin(), done.end());
  if (r->plain) r->sampler = r->plain->sampler();
  r->plain.reset();  // returns the KV blocks
  r->spec.reset();
  if (r->admitted) reserved -= r->held;
  r->admitted = false;
  r->held = 0;
  r->seq_prompt = r->prompt;
  r->seq_prompt.insert(r->seq_prompt.end(), r->resumed.begin(), r->resumed.end());
  r->seq_options.max_tokens = r->options.max_tokens - static_cast<int64_t>(r->resumed.size());
  r->seq_options.generated_prefix = static_cast<int64_t>(r->resumed.size());  // still output
  ++num_preemptions;
  // Before every request that arrived after it (the queue is in arrival order).
  auto at = std::find_if(waiting.begin(), waiting.end(),
                         [&](const auto& w) { return w->added > r->added; });
  waiting.insert(at, std::move(r));
}

bool Scheduler::Impl::preempt_newest(const Request* keep, size_t after) {
  std::unique_ptr<Request> r;
  if (!prefilling.empty() && prefilling.back().get() != keep) {
    r = std::move(prefilling.back());
    prefilling.pop_back();
  } else if (running.size() > after + 1 && running.back().get() != keep) {
    r = std::move(running.back());
    running.pop_back();
  } else {
    return false;
  }
  if (r->done()) {  // it ended in this step (stop token, max_tokens): it just ends now
    complete(std::move(r), Status::Ok());
  } else {
    preempt(std::move(r));
  }
  return true;
}

void Scheduler::Impl::admit_and_prefill() {
  int64_t budget = max_prefill_tokens > 0 ? max_prefill_tokens : -1;  // -1: unlimited
  for (;;) {
    admit_waiting();  // again after a request ended in its prefill and freed its room
    if (prefilling.empty() || budget == 0) return;
    if (prefill_together(budget)) continue;
    Request& r = *prefilling.front();
    const int64_t n = budget < 0 ? 0 : std::min(budget, r.prompt_left());
    if (budget > 0) budget -= n;
    const Status s =
        catch_allocation_failure([&] { return prefill(r, n); })
            .with_context(fmt::format("prefill of {} prompt tokens at position {}", r.prompt_left(),
                                      r.seq_prompt.size() - r.prompt_left()));
    if (s.ok() && !r.done() && r.prompt_left() > 0) continue;  // the budget is spent
    std::unique_ptr<Request> front = std::move(prefilling.front());
    prefilling.pop_front();
    if (preemption && is_kv_full(s)) {  // the running requests grew into its room: wait again
      preempt(std::move(front));
      return;
    }
    if (!s.ok() || front->done()) {
      complete(std::move(front), s);
    } else {
      running.push_back(std::move(front));
    }
  }
}

bool Scheduler::Impl::plan_mixed_step() {
  parts.clear();
  if (!mixed_steps || running.empty()) return false;
  int64_t budget = max_prefill_tokens > 0 ? max_prefill_tokens : -1;  // -1: unlimited
  for (const auto& r : prefilling) {
    if (budget == 0) break;
    const int64_t left = r->prompt_left();
    const int64_t n = budget < 0 ? left : std::min(budget, left);
    if (budget > 0) budget -= n;
    parts.push_back({.r = r.get(), .n = n, .last = n == left});
  }
  for (const PromptPart& p : parts) {  // reservations stay for the unmixed path to reuse
    if (drafter) {
      if (!p.r->spec->prefill_request(p.n).ok()) return false;
    } else if (p.last) {
      const Result<bool> stepping = p.r->begin_step();
      if (!stepping.ok() || !*stepping) return false;
    } else if (!p.r->plain->begin_chunk(p.n).ok()) {
      return false;
    }
  }
  return !parts.empty();
}

Status Scheduler::Impl::forward_mixed() {
  // Decode rows first, in running order, then the prompt rows: the running sequences' rows form
  // one run of equal rows (one attention call for them), and a step's shape repeats while the
  // same prompt lengths arrive (a captured graph replays).
  reqs.clear();
  plain_seqs.clear();
  for (const auto& r : running) {
    reqs.push_back(r->plain->request());
    plain_seqs.push_back(r->plain.get());
  }
  for (const PromptPart& p : parts) {
    if (p.last) {
      reqs.push_back(p.r->plain->request());  // its logits row: the first token
      plain_seqs.push_back(p.r->plain.get());
    } else {
      reqs.push_back(*p.r->plain->begin_chunk(p.n));  // reserved by plan_mixed_step
    }
  }
  BS_RETURN_IF_ERROR(target.forward_batch(reqs, pool, &res));
  detail::take_step(target.backend(), plain_seqs, res.logits, ids);
  return Status::Ok();
}

Scheduler::Impl::Mixed Scheduler::Impl::step_mixed() {
  int64_t commits = 0;  // before the step, of every request in it
  for (const auto& r : running) commits += r->committed;
  for (const PromptPart& p : parts) commits += p.r->committed;
  const auto t = Clock::now();
  bool returned = false;  // the forward returned its error (thrown ones come as kOutOfMemory /
                          // kInternal from catch_allocation_failure)
  Status s;
  if (drafter) {
    // Speculative: the verify blocks (ordered as step_speculative orders them), then the prompt
    // rows, tapped; their observe goes with the accepted positions' (detail::SpeculativeStep).
    seqs.clear();
    for (const auto& r : running) seqs.push_back(r->spec.get());
    std::stable_sort(seqs.begin(), seqs.end(), [](const auto* a, const auto* b) {
      return a->verify_rows() > b->verify_rows();
    });
    prompt_seqs.clear();
    prompt_tokens.clear();
    for (const PromptPart& p : parts) {
      prompt_seqs.push_back(p.r->spec.get());
      prompt_tokens.push_back(p.n);
    }
    s = catch_allocation_failure(
        [&] { return detail::SpeculativeStep(*spec, seqs, prompt_seqs, prompt_tokens).run(); });
  } else {
    s = catch_allocation_failure([&] {
      const Status forward = forward_mixed();
      returned = !forward.ok();
      return forward;
    });
  }
  if (!s.ok()) {
    for (const auto& r : running) commits -= r->committed;
    for (const PromptPart& p : parts) commits -= p.r->committed;
    if (returned && s.code() != StatusCode::kOutOfMemory) return Mixed::kFallback;
    if (s.code() == StatusCode::kOutOfMemory && commits == 0) {
      // As a batched step's: the newest request ends (the last prompt's), the others repeat.
      const auto newest = prefilling.begin() + static_cast<std::ptrdiff_t>(parts.size() - 1);
      std::unique_ptr<Request> r = std::move(*newest);
      prefilling.erase(newest);
      complete(std::move(r), s.with_context(fmt::format(
                                 "the mixed step of {} requests and {} prompts ran out of memory "
                                 "and ended the newest of them",
                                 running.size(), parts.size())));
      return Mixed::kRetry;
    }
    // A backend fault (its rows' KV may not be written), a failure of a speculative step or one
    // after commits: every request of the step ends with it, as in a failed batched step.
    Requests failed = std::move(running);
    running.clear();
    for (size_t i = 0; i < parts.size(); ++i) {
      failed.push_back(std::move(prefilling.front()));
      prefilling.pop_front();
    }
    for (auto& r : failed) complete(std::move(r), s);
    mixed_error = s;
    return Mixed::kFailed;
  }
  ++times.mixed_steps;
  const double seconds = seconds_since(t);
  for (const PromptPart& p : parts) {  // the front prefilling requests, in order
    Request& r = *prefilling.front();
    r.prefill_seconds += seconds;
    if (!p.last) {                            // a chunk: the step's budget is spent
      if (!drafter) r.plain->end_chunk(p.n);  // (a speculative one is prefilled())
      break;
    }
    r.stats.prefill_seconds = r.prefill_seconds;
    r.decode_start = Clock::now();
    running.push_back(std::move(prefilling.front()));  // begin_next_steps begins its next step
    prefilling.pop_front();
  }
  return Mixed::kRan;
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
  // Longest verify blocks first, else in arrival order: the few blocks that max_tokens or the
  // context window shortened come last, so that the verify forward has one run of full blocks
  // (one attention call for them) and a shape that repeats from step to step (a captured graph
  // replays) instead of short blocks at changing places. Each sequence's tokens do not depend on
  // where its block lies in the step.
  std::stable_sort(seqs.begin(), seqs.end(), [](const auto* a, const auto* b) {
    return a->verify_rows() > b->verify_rows();
  });
  return detail::speculative_step(*spec, seqs);
}

void Scheduler::Impl::fail_step(const Status& s, const std::vector<int64_t>& committed_before) {
  bool committed = false;
  for (size_t i = 0; i < running.size(); ++i)
    committed |= running[i]->committed != committed_before[i];
  if (s.code() == StatusCode::kOutOfMemory && !committed && running.size() > 1) {
    // Nothing changed in the others' sequences: their step runs again next time, smaller.
    std::unique_ptr<Request> newest = std::move(running.back());
    running.pop_back();
    complete(std::move(newest),
             s.with_context(fmt::format("the batched step of {} requests ran out of memory and "
                                        "ended the newest of them",
                                        running.size() + 1)));
    return;
  }
  Requests failed = std::move(running);
  running.clear();
  for (auto& r : failed) complete(std::move(r), s);
}

void Scheduler::Impl::begin_next_steps() {
  if (!preemption) {
    complete_if(running, [](Request& r) -> std::optional<Status> {
      const Result<bool> stepping = r.begin_step();
      if (stepping.ok() && *stepping) return std::nullopt;
      return stepping.status();
    });
    return;
  }
  // Oldest first; a step that finds the pool full preempts the newest other request and tries
  // again, or, being the newest itself, waits to be prefilled again.
  for (size_t i = 0; i < running.size();) {
    Request& r = *running[i];
    Result<bool> stepping = r.begin_step();
    while (!stepping.ok() && is_kv_full(stepping.status()) && preempt_newest(&r, i)) {
      stepping = r.begin_step();
    }
    if (stepping.ok() && *stepping) {
      ++i;
      continue;
    }
    std::unique_ptr<Request> ended = std::move(running[i]);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    if (!stepping.ok() && is_kv_full(stepping.status()) && !running.empty()) {
      preempt(std::move(ended));
    } else {
      complete(std::move(ended), stepping.status());
    }
  }
}

bool Scheduler::Impl::steady() const {
  if (!overlap || overlap_paused || drafter || preemption || running.empty() ||
      !prefilling.empty()) {
    return false;
  }
  if (!waiting.empty() && static_cast<int64_t>(running.size()) < max_num_seqs &&
      reserved + waiting.front()->blocks <= num_blocks) {
    return false;  // an arrival joins (admit_waiting's test without preemption)
  }
  return std::all_of(running.begin(), running.end(), [&](const auto& r) {
    return !r->cancelled && !r->plain->wants_logits() && (!inflight || r->in_flight);
  });
}

Status Scheduler::Impl::launch(std::span<Request* const> rows, const InFlight* from) {
  reqs.clear();
  plain_seqs.clear();
  size_t at = 0;  // rows are a subsequence of from->rows (step_overlapped keeps their order)
  for (Request* r : rows) {
    if (from) {
      while (at < from->rows.size() && from->rows[at] != r) ++at;
      BS_CHECK(at < from->rows.size());
      BS_RETURN_IF_ERROR(r->plain->reserve_ahead());
      reqs.push_back(r->plain->ahead_request(from->ids.rows(static_cast<int64_t>(at), 1)));
    } else {
      reqs.push_back(r->plain->request());
    }
    plain_seqs.push_back(r->plain.get());
  }
  BS_RETURN_IF_ERROR(target.forward_batch(reqs, pool, &res));
  detail::choose_tokens(target.backend(), plain_seqs, res.logits, ids);
  InFlight f{.rows = {rows.begin(), rows.end()}, .ids = ids.rows(0, std::ssize(rows))};
  f.ticket = target.backend().begin_read(f.ids);
  for (Request* r : rows) r->in_flight = true;
  inflight = std::move(f);
  std::swap(ids, ids_next);  // the next step chooses into the other buffer
  return Status::Ok();
}

Status Scheduler::Impl::read_inflight(InFlight& f) {
  host_ids.resize(f.rows.size());
  const Status read = catch_allocation_failure([&] {
    target.backend().end_read(f.ticket, host_ids.data());
    return Status::Ok();
  });
  if (!read.ok()) {  // a backend fault: every request of the step ends with it
    fail_all(read);
    return read;
  }
  for (size_t i = 0; i < f.rows.size(); ++i) {
    Request* const r = f.rows[i];
    if (!r) continue;
    r->taken = true;
    if (!r->cancelled) r->plain->take(host_ids[i], {});  // a cancelled one ends before it
  }
  end_read_step();
  return Status::Ok();
}

void Scheduler::Impl::end_read_step() {
  if (inflight) {
    for (Request*& r : inflight->rows) {
      if (r && r->done()) {  // its queued row's token is dropped
        r->in_flight = false;
        r = nullptr;
      }
    }
  }
  complete_if(running, [](Request& r) -> std::optional<Status> {
    if (!std::exchange(r.taken, false) || r.in_flight) return std::nullopt;
    const Result<bool> stepping = r.begin_step();
    if (stepping.ok() && *stepping) return std::nullopt;
    return stepping.status();
  });
  if (inflight && std::all_of(inflight->rows.begin(), inflight->rows.end(),
                              [](const Request* r) { return r == nullptr; })) {
    abandon();  // every request of the queued step ended
  }
}

std::optional<Status> Scheduler::Impl::step_overlapped() {
  if (!inflight) {
    ahead.clear();
    for (const auto& r : running) ahead.push_back(r.get());
    if (!catch_allocation_failure([&] { return launch(ahead, nullptr); }).ok()) {
      for (Request* r : ahead) r->in_flight = false;
      return std::nullopt;  // the synchronous step runs it and meets the error
    }
  }
  InFlight current = std::move(*inflight);
  inflight.reset();
  ahead.clear();
  for (Request* r : current.rows) {
    if (!r) continue;
    r->in_flight = false;
    if (r->plain->can_run_ahead()) ahead.push_back(r);
  }
  if (!ahead.empty()) {
    const Status queued = catch_allocation_failure([&] { return launch(ahead, &current); });
    if (queued.ok()) {
      ++times.overlapped_steps;
    } else {
      // The step after this one runs synchronously and meets the error, if it is still there.
      for (Request* r : ahead) r->in_flight = false;
      inflight.reset();
      overlap_paused = true;
    }
  }
  return read_inflight(current);
}

Status Scheduler::Impl::drain() {
  InFlight f = std::move(*inflight);
  inflight.reset();
  for (Request* r : f.rows) {
    if (r) r->in_flight = false;
  }
  return read_inflight(f);
}

void Scheduler::Impl::abandon() {
  host_ids.resize(inflight->rows.size());
  try {
    target.backend().end_read(inflight->ticket, host_ids.data());
  } catch (const BackendFault&) {
    // its requests have ended; the fault was theirs
  }
  for (Request* r : inflight->rows) {
    if (r) r->in_flight = false;
  }
  inflight.reset();
}

void Scheduler::Impl::fail_all(const Status& s) {
  if (inflight) abandon();
  Requests failed = std::move(running);
  running.clear();
  for (auto& r : failed) {
    r->taken = false;
    complete(std::move(r), s);
  }
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
  Request* const raw = r.get();
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
  r->seq_prompt = r->prompt;
  r->seq_options = r->options;
  // Counts the commits (a failed batched step tells from them whether it may run again).
  r->on_token = [raw, inner = std::move(on_token)](int32_t token) {
    ++raw->committed;
    return !inner || inner(token);
  };
  r->on_done = std::move(on_done);
  r->on_logprobs = std::move(on_logprobs);
  m.waiting.push_back(std::move(r));
  return Status::Ok();
}

Status Scheduler::step() {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  if (m.steady()) {
    const std::optional<Status> s = m.step_overlapped();
    if (s) {
      m.times.batch += seconds_since(t0);
      ++m.times.steps;
      return *s;
    }
  }
  m.overlap_paused = false;
  if (m.inflight) BS_RETURN_IF_ERROR(m.drain());  // arrivals, cancellations, logprobs: synchronous
  m.retire_cancelled();
  if (!m.running.empty()) m.admit_waiting();
  const bool mixed = m.plan_mixed_step();
  if (!mixed) m.admit_and_prefill();
  const auto t1 = Clock::now();
  m.times.admit_prefill += std::chrono::duration<double>(t1 - t0).count();
  if (mixed) {
    const Impl::Mixed ran = m.step_mixed();
    const auto t2 = Clock::now();
    m.times.batch += std::chrono::duration<double>(t2 - t1).count();
    if (ran == Impl::Mixed::kFailed) return m.mixed_error;
    if (ran != Impl::Mixed::kFallback) {
      ++m.times.steps;
      if (ran == Impl::Mixed::kRan) m.begin_next_steps();
      m.times.next += seconds_since(t2);
      return Status::Ok();
    }
    // Each prompt's prefill alone and the running requests' step: an error ends only the
    // request it belongs to, as in an unmixed step.
    m.admit_and_prefill();
  }
  if (m.running.empty()) return Status::Ok();
  m.committed_before.clear();
  for (const auto& r : m.running) m.committed_before.push_back(r->committed);
  const Status s =
      catch_allocation_failure([&m] { return m.drafter ? m.step_speculative() : m.step_plain(); });
  const auto t2 = Clock::now();
  m.times.batch += std::chrono::duration<double>(t2 - t1).count();
  ++m.times.steps;
  if (!s.ok()) {
    const bool one = s.code() == StatusCode::kOutOfMemory && m.running.size() > 1;
    m.fail_step(s, m.committed_before);
    if (one && !m.running.empty()) return Status::Ok();  // the others go on
    return s;
  }
  m.begin_next_steps();
  m.times.next += seconds_since(t2);
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
int64_t Scheduler::num_preemptions() const { return impl_->num_preemptions; }
const SchedulerTimes& Scheduler::times() const { return impl_->times; }

}  // namespace bs
