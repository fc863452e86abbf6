#include "engine/kv_budget.h"

#include <algorithm>
#include <string>

#include "engine/speculative_sequence.h"

namespace bs {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

int64_t window_of(const CausalLM& target, int64_t max_context) {
  return max_context > 0 ? max_context : target.config().max_position_embeddings;
}

}  // namespace

int64_t default_kv_blocks(const CausalLM& target, const Drafter* drafter, int64_t max_num_seqs,
                          int64_t max_context) {
  const int64_t window = window_of(target, max_context);
  const int64_t per_window =
      drafter ? detail::speculative_blocks(*drafter, 0, {.max_tokens = window}, window)
              : (window + kKvBlockSize - 1) / kKvBlockSize;
  return max_num_seqs * per_window;
}

Result<KvCachePlan> plan_kv_cache(CausalLM& target, Drafter* drafter,
                                  const KvCacheRequest& request) {
  const double util = request.memory_utilization;
  if (!(util > 0.0 && util <= 1.0)) {
    return InvalidArgument("memory utilization {} is not in (0, 1]", util);
  }
  if (request.max_num_seqs < 1 || request.tokens < 0) {
    return InvalidArgument("KV cache: max_num_seqs {} and tokens {} must be >= 1 and >= 0",
                           request.max_num_seqs, request.tokens);
  }
  KvCachePlan plan;
  // One block of each pool tells the bytes per block whatever the model's KV layout.
  plan.block_bytes = kv_pool_bytes(target.make_kv_pool(1));
  if (drafter) plan.block_bytes += kv_pool_bytes(drafter->make_kv_pool(1));
  plan.window_blocks = default_kv_blocks(target, drafter, 1, request.max_context);
  plan.wanted_blocks = request.tokens > 0 ? (request.tokens + kKvBlockSize - 1) / kKvBlockSize
                                          : request.max_num_seqs * plan.window_blocks;

  const MemoryInfo mem = target.backend().memory_info();
  const auto reserved = static_cast<int64_t>((1.0 - util) * static_cast<double>(mem.total));
  plan.available_bytes = std::max<int64_t>(0, mem.free - reserved);
  const std::string device = target.backend().name() == "cpu" ? "host RAM" : "device memory";
  if (plan.available_bytes < plan.block_bytes) {
    return InvalidArgument(
        "no memory left for a KV cache: {:.2f} GiB of {:.2f} GiB {} are in use after loading the "
        "model, and memory utilization {} allows {:.2f} GiB (raise --memory-utilization or free "
        "the device)",
        gib(mem.total - mem.free), gib(mem.total), device, util,
        gib(static_cast<int64_t>(util * static_cast<double>(mem.total))));
  }
  const int64_t fitting = plan.available_bytes / plan.block_bytes;
  if (plan.wanted_blocks <= fitting) {
    plan.blocks = plan.wanted_blocks;
  } else if (request.tokens > 0) {
    return InvalidArgument(
        "a KV cache of {} tokens needs {:.2f} GiB, but {:.2f} GiB of {} are left for it at memory "
        "utilization {} (at most {} tokens; lower --kv-cache-tokens or raise --memory-utilization)",
        request.tokens, gib(plan.wanted_blocks * plan.block_bytes), gib(plan.available_bytes),
        device, util, fitting * kKvBlockSize);
  } else if (fitting < plan.window_blocks) {
    return InvalidArgument(
        "the KV cache cannot hold one full context window of {} tokens: that needs {:.2f} GiB, but "
        "{:.2f} GiB of {} are left for it at memory utilization {} (lower --max-model-len to at "
        "most about {} or raise --memory-utilization)",
        window_of(target, request.max_context), gib(plan.window_blocks * plan.block_bytes),
        gib(plan.available_bytes), device, util, fitting * kKvBlockSize);
  } else {
    plan.blocks = fitting;
    plan.shrunk = true;
  }
  plan.bytes = plan.blocks * plan.block_bytes;
  return plan;
}

}  // namespace bs
