// Continuous batching: a step-level scheduler that decodes every running request together and
// admits new requests between steps, over one target model (and optionally a drafter, which then
// serves every request speculatively).
//
//   Scheduler s(target, drafter /*or nullptr*/, {.max_num_seqs = 8});
//   BS_RETURN_IF_ERROR(s.add(id, prompt, options, on_token, on_done));  // any time between steps
//   while (!s.idle()) BS_RETURN_IF_ERROR(s.step());
//
// One step: retire cancelled requests; admit waiting ones first come first served while fewer
// than max_num_seqs run and the KV pool holds their worst case; prefill admitted requests, each
// alone, first come first served: without max_prefill_tokens each whole prompt in one forward (as
// generate_plain / generate_speculative prefill), with it at most that many prompt tokens in all
// this step (chunked prefill: consecutive forwards at their start positions, the drafter observing
// each chunk's taps; a prompt may take several steps; the front requests whose whole remaining
// prompt fits the step's budget prefill together in one forward_batch, with a drafter its layers
// tapped and one Drafter::observe_batch of all their taps), and a
// request whose prompt is done samples its first token and joins the batch; then one batched step
// of every running request (plain: one CausalLM::forward_batch row each, and while requests run
// the step's prompt rows go into that same forward instead of forwards of their own: mixed steps,
// SchedulerOptions::mixed_steps, the verify forward's with a drafter; speculative: drafts for
// all in one Drafter::propose_batch when the drafter has it, one forward_batch verifying every
// block, each sequence accepting on its own, one Drafter::observe_batch); committed tokens go to
// each request's on_token as they become final; finished requests get on_done and free their KV.
// Plain steady-state steps overlap: step n + 1 is queued on the device before step n is read
// back (SchedulerOptions::overlap).
//
// Lossless: every request's tokens, finish reason and counts equal what generate_plain /
// generate_speculative give for its prompt and options alone, chunked or not (greedy bit for bit
// on the CPU, whose rows do not depend on how many share a forward;
// sampled requests draw from their own sampler seeded as generate_* seeds it), whatever runs
// beside it and whenever it arrives. The per-sequence code is the same
// (detail::PlainSequence, detail::SpeculativeSequence).
//
// Not thread-safe: one thread owns the scheduler (and the models); callbacks run on it, inside
// step(), and must not call add / step / cancel (the const queries are fine: a finished request
// no longer counts as running or waiting when its on_done runs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/generate.h"

namespace bs {

using RequestId = uint64_t;

struct SchedulerOptions {
  int64_t max_num_seqs = 8;  // requests decoded together; more wait (>= 1)
  // Size of the KV pool(s) in blocks of kKvBlockSize positions (the drafter's pool has as many).
  // 0: room for max_num_seqs requests that each fill a context window of max_context.
  int64_t kv_blocks = 0;
  int64_t max_context = 0;  // for the default pool size; 0: the target's max_position_embeddings
  // Chunked prefill: prompt tokens prefilled per step, over all admitted requests (>= 0), so a
  // long prompt delays the running requests' steps by at most this many tokens' forward at a
  // time and a step's activations are bounded by the chunk, not by the prompt. 0: each admitted
  // request's whole prompt in its admission step.
  int64_t max_prefill_tokens = kDefaultPrefillChunk;
  // false: admission reserves a request's worst case (prompt + max_tokens), so an admitted request
  // never runs out of KV and others wait. true (vLLM's recompute preemption): a request is
  // admitted when its prompt fits the free blocks, blocks are taken as sequences grow, and when
  // a step finds the pool full the newest admitted request is preempted: its blocks are freed and
  // it is queued again ahead of later arrivals, to re-prefill its prompt and the tokens it had
  // committed (none is streamed twice). A preempted request's output is its single run's for
  // greedy requests (on the CPU bit for bit; speculative statistics differ) and for sampled plain
  // ones (the sampler goes on); a sampled speculative request draws from its continued stream.
  bool preemption = false;
  // Mixed steps: while requests run, the step's prefill rows (what max_prefill_tokens allows of
  // the admitted prompts) go into the running requests' batched forward (plain: the decode
  // forward; speculative: the verify forward, the prompt rows tapped and observed with the
  // accepted positions), one weight stream for both, the completed prompts' first tokens chosen
  // from it (vLLM's chunked prefill in decode steps). false: prompts prefill in forwards of their
  // own before the batched step (the behaviour before mixed steps; BLOCKSPEC_MIXED_STEPS=0 serve).
  bool mixed_steps = true;
  // Overlapped steps (SGLang's overlap scheduler): while every running request decodes plainly
  // (no drafter, no preemption, no logprobs) and no prompt waits to join, step n + 1 is queued
  // on the device before step n's tokens are read back, its input ids taken from step n's
  // device-side token choice (ForwardRequest::device_tokens), so that the device has the next
  // step while the host reads back, runs the token callbacks and stages the step after. A
  // request that ends at step n (stop token, on_token's false) had a row in step n + 1: that
  // row's token is dropped, its KV position lay in blocks the request had reserved and frees.
  // Arrivals, cancellations, logprobs, speculative or mixed steps and failures run today's
  // synchronous step (the queued step is read back first). Outputs are the same either way.
  // false: every step synchronous (BLOCKSPEC_OVERLAP=0 serve).
  bool overlap = true;
  // Prefix caching (vLLM's automatic prefix caching; engine/kv_cache.h): a prompt's full blocks,
  // once prefilled (and observed by the drafter), stay in the pool until their blocks are needed,
  // and a later prompt that starts with the same blocks takes them instead of computing them
  // (GenerateStats::cached_tokens). Outputs are unchanged on the CPU (bit for bit: its rows do not
  // depend on how a prompt was split); on the GPU as with chunked prefill.
  bool prefix_caching = false;
  // Verify-length scheduling (GenerateOptions::verify_budget): the step-time model t(B_v). Empty
  // (the default): measured at the first step that needs it (engine/verify_budget.h).
  StepTimeModel step_time;
};

// Host-clock seconds spent in each phase of Scheduler::step() since construction (a batched
// step's time includes the device's and the callbacks'); for profiling the serving loop.
struct SchedulerTimes {
  int64_t steps = 0;             // step() calls that ran a batched step
  double admit_prefill = 0;      // retiring cancelled requests, admission, prefill chunks
  double batch = 0;              // the batched decode / speculative step
  double next = 0;               // ending finished requests, beginning the next steps
  int64_t prefill_batches = 0;   // forwards that prefilled several prompts together
  int64_t mixed_steps = 0;       // batched steps whose forward also fed prompt rows
  int64_t overlapped_steps = 0;  // steps queued before the previous one's tokens were read back
};

// How a request ended. status not ok: it failed (tokens: what was committed before).
struct Completion {
  RequestId id = 0;
  Status status;
  std::vector<int32_t> tokens;  // the output, as generate_* returns it
  GenerateStats stats;          // as generate_*; prefill / decode seconds are the request's own
  double queue_seconds = 0;     // add() -> admission
};
using CompletionCallback = std::function<void(Completion)>;

// Validates a request as generate_plain (drafter null) / generate_speculative do and returns the
// KV blocks it may hold at once: its prompt plus max_tokens within its context window, plus the
// drafter's block past the anchor.
Result<int64_t> kv_blocks_needed(const CausalLM& target, const Drafter* drafter,
                                 std::span<const int32_t> prompt, const GenerateOptions& options);

class Scheduler {
 public:
  // Allocates the KV pool(s) now. `target` and `drafter` must outlive the scheduler.
  Scheduler(CausalLM& target, Drafter* drafter, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (it waits until a step admits it). Errors (nothing queued, no callback):
  // InvalidArgument for what generate_* rejects, options.trace_path, an id already queued or
  // running, and a request that can never fit the KV pool (the message names both sizes).
  // on_token may be empty; returning false from it ends the request (kCancelled), as in
  // generate_*. on_done (may be empty) is called once, from a later step(). on_logprobs (may be
  // empty) gets each committed token's logprobs when options.logprobs >= 0, before on_token.
  Status add(RequestId id, std::vector<int32_t> prompt, GenerateOptions options,
             TokenCallback on_token, CompletionCallback on_done,
             LogprobsCallback on_logprobs = nullptr);

  // Admits what fits, prefills (within max_prefill_tokens) and runs one batched step (see the top
  // of this file); does nothing when idle. A request's own failure (its prefill, an allocation
  // failure included) goes to its on_done only (a mixed step whose forward returns an error runs
  // again unmixed, so that the error finds its request; one that runs out of memory ends the
  // newest prompt's request of the step; a backend fault in it ends every request of the step and
  // is returned). When the batched step fails, every request in the
  // batch ends with that error, which step() also returns (waiting and still prefilling requests
  // stay) -- except for an out-of-memory (kOutOfMemory, Backend's AllocationError) thrown before
  // any request of the step committed a token: then only the newest running request ends with it,
  // its KV blocks and scratch freed, and the others repeat the step at the next call (which
  // returns Ok). A greedy request's output is unchanged by that; a sampled one's draws of the
  // failed step are not replayed (its stream goes on from where the failed step left it).
  Status step();

  // Ends the request at the next step (kCancelled, with the tokens committed so far); unknown or
  // finished ids are ignored.
  void cancel(RequestId id);

  bool idle() const;                   // nothing running or waiting
  int64_t num_running() const;         // admitted, not finished (prefilling ones included)
  int64_t num_prefilling() const;      // admitted, prompt not all prefilled yet
  int64_t num_waiting() const;         // queued
  int64_t num_kv_blocks() const;       // the pool size
  int64_t num_kv_blocks_used() const;  // blocks the running requests hold now (KV usage metric)
  int64_t num_preemptions() const;     // requests preempted so far (SchedulerOptions::preemption)
  const SchedulerTimes& times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bs
