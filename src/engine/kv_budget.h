// How large a server's KV cache is: the size asked for, or room for max_num_seqs requests that
// each fill a context window, within the memory the device has left once the weights are loaded
// (the part of its total that `memory_utilization` allows, as vLLM's gpu_memory_utilization).
//
//   BS_ASSIGN_OR_RETURN(KvCachePlan plan, plan_kv_cache(target, drafter, {.max_num_seqs = 8}));
//   Scheduler s(target, drafter, {.max_num_seqs = 8, .kv_blocks = plan.blocks});
#pragma once

#include <cstdint>

#include "core/status.h"
#include "engine/generate.h"
#include "models/causal_lm.h"
#include "models/drafter.h"
#include "models/kv_pool.h"

namespace bs {

// Whether plan_kv_cache runs the worst-case step once to measure its scratch (see below).
enum class StepWarmUp { kAuto, kAlways, kNever };  // kAuto: on every device but the CPU

struct KvCacheRequest {
  int64_t tokens = 0;        // asked for; 0: max_num_seqs full context windows, shrunk to fit
  int64_t max_num_seqs = 8;  // >= 1
  int64_t max_context = 0;   // the context window; 0: the target's max_position_embeddings
  double memory_utilization = 0.9;  // fraction of the device's total memory the process may hold
  // Prompt tokens per prefill step (SchedulerOptions::max_prefill_tokens; 0: whole prompts, whose
  // worst case is a prompt filling the window).
  int64_t max_prefill_tokens = kDefaultPrefillChunk;
  StepWarmUp warm_up = StepWarmUp::kAuto;
};

struct KvCachePlan {
  int64_t blocks = 0;           // per model pool (the drafter's has as many)
  int64_t bytes = 0;            // of the target's and the drafter's pools together
  int64_t block_bytes = 0;      // of one block in both pools
  int64_t wanted_blocks = 0;    // the size asked for, or max_num_seqs full windows
  int64_t window_blocks = 0;    // what one request filling its context window holds
  int64_t available_bytes = 0;  // the memory left for the KV cache
  // Reserved for the worst-case step's activations and workspaces (measured by the warm-up, plus
  // the sampling buffers of max_num_seqs sampled requests); 0 without a warm-up.
  int64_t scratch_bytes = 0;
  bool shrunk = false;  // blocks < wanted_blocks: the default did not fit
  int64_t tokens() const { return blocks * kKvBlockSize; }
};

// The default pool when memory is no concern: max_num_seqs requests each filling a context
// window of max_context (0: the target's max_position_embeddings) positions.
int64_t default_kv_blocks(const CausalLM& target, const Drafter* drafter, int64_t max_num_seqs,
                          int64_t max_context);

// Sizes the KV cache against target.backend().memory_info(), after reserving the scratch of the
// worst-case step: the warm-up runs, on temporary pools of one context window, a prefill chunk of
// max_prefill_tokens rows ending at the window's end (the longest attention; with a drafter its
// taps and the drafter's observe), then one batched step of max_num_seqs sequences there (verify
// blocks and a propose with a drafter), and takes the rise of the backend's allocations
// (Backend::allocation_stats) as the scratch. The buffers it grows stay with the backend, so later
// steps of those sizes allocate nothing new. Errors (kInvalidArgument, naming the numbers and the
// option to change): memory_utilization outside (0, 1]; the loaded weights already above the
// allowed memory; an explicit size that does not fit; a default that cannot hold even one full
// context window; kOutOfMemory when the warm-up step itself does not fit.
Result<KvCachePlan> plan_kv_cache(CausalLM& target, Drafter* drafter,
                                  const KvCacheRequest& request);

}  // namespace bs
