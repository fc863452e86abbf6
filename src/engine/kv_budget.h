// How large a server's KV cache is: the size asked for, or room for max_num_seqs requests that
// each fill a context window, within the memory the device has left once the weights are loaded
// (the part of its total that `memory_utilization` allows, as vLLM's gpu_memory_utilization).
//
//   BS_ASSIGN_OR_RETURN(KvCachePlan plan, plan_kv_cache(target, drafter, {.max_num_seqs = 8}));
//   Scheduler s(target, drafter, {.max_num_seqs = 8, .kv_blocks = plan.blocks});
#pragma once

#include <cstdint>

#include "core/status.h"
#include "models/causal_lm.h"
#include "models/drafter.h"
#include "models/kv_pool.h"

namespace bs {

struct KvCacheRequest {
  int64_t tokens = 0;        // asked for; 0: max_num_seqs full context windows, shrunk to fit
  int64_t max_num_seqs = 8;  // >= 1
  int64_t max_context = 0;   // the context window; 0: the target's max_position_embeddings
  double memory_utilization = 0.9;  // fraction of the device's total memory the process may hold
};

struct KvCachePlan {
  int64_t blocks = 0;           // per model pool (the drafter's has as many)
  int64_t bytes = 0;            // of the target's and the drafter's pools together
  int64_t block_bytes = 0;      // of one block in both pools
  int64_t wanted_blocks = 0;    // the size asked for, or max_num_seqs full windows
  int64_t window_blocks = 0;    // what one request filling its context window holds
  int64_t available_bytes = 0;  // the memory left for the KV cache
  bool shrunk = false;          // blocks < wanted_blocks: the default did not fit
  int64_t tokens() const { return blocks * kKvBlockSize; }
};

// The default pool when memory is no concern: max_num_seqs requests each filling a context
// window of max_context (0: the target's max_position_embeddings) positions.
int64_t default_kv_blocks(const CausalLM& target, const Drafter* drafter, int64_t max_num_seqs,
                          int64_t max_context);

// Sizes the KV cache against target.backend().memory_info(). Errors (kInvalidArgument, naming
// the numbers and the option to change): memory_utilization outside (0, 1]; the loaded weights
// already above the allowed memory; an explicit size that does not fit; a default that cannot
// hold even one full context window.
Result<KvCachePlan> plan_kv_cache(CausalLM& target, Drafter* drafter,
                                  const KvCacheRequest& request);

}  // namespace bs
