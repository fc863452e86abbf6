#include "engine/kv_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/speculative_sequence.h"

namespace bs {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

int64_t window_of(const CausalLM& target, int64_t max_context) {
  return max_context > 0 ? max_context : target.config().max_position_embeddings;
}

// Runs the worst-case step shapes once (see plan_kv_cache) and returns how far the backend's
// allocations rose above what they held before it, plus the sampling buffers.
Result<int64_t> measure_step_scratch(CausalLM& target, Drafter* drafter, int64_t window,
                                     int64_t window_blocks, int64_t max_num_seqs, int64_t chunk) {
  Backend& backend = target.backend();
  KvPool target_kv, draft_kv;
  if (Status s = catch_allocation_failure([&] {
        target_kv = target.make_kv_pool(window_blocks);
        if (drafter) draft_kv = drafter->make_kv_pool(window_blocks);
        return Status::Ok();
      });
      !s.ok()) {
    return s.with_context(
        fmt::format("the KV cache of one context window of {} tokens does not fit in the memory "
                    "left after loading the model (lower --max-model-len)",
                    window));
  }
  std::vector<int32_t> table(static_cast<size_t>(window_blocks));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  const std::vector<int> no_taps;
  const std::vector<int>& taps = drafter ? drafter->target_layers() : no_taps;
  const int64_t base = backend.allocation_stats().held;
  backend.reset_peak_allocated();

  // The longest prefill chunk at the end of the window.
  const int64_t n = chunk > 0 ? std::min(chunk, window - 1) : window - 1;
  const int64_t start = window - 1 - n;
  const std::vector<int32_t> tokens(static_cast<size_t>(n), 0);
  ForwardResult res;
  Status s = catch_allocation_failure([&] {
    BS_RETURN_IF_ERROR(target.forward(
        {.tokens = tokens, .start_pos = start, .block_table = table, .tap_layers = taps}, target_kv,
        &res));
    if (drafter) BS_RETURN_IF_ERROR(drafter->observe(draft_kv, table, res.taps, start));
    backend.synchronize();
    return Status::Ok();
  });
  if (!s.ok()) {
    return Status(s.code(),
                  fmt::format("the worst-case prefill step ({} prompt tokens at position {}) does "
                              "not fit in the memory left after loading the model (lower "
                              "--max-num-batched-tokens or --max-model-len): {}",
                              n, start, s.message()));
  }
  res = {};

  // One batched step of every sequence at the window's end: decode rows, or verify blocks and
  // a propose with a drafter.
  const int64_t rows =
      drafter ? std::max(drafter->block_size(), drafter->max_drafts()) + 1 : int64_t{1};
  if (window > rows + 1) {
    const std::vector<int32_t> step_tokens(static_cast<size_t>(rows), 0);
    const int64_t at = window - 1 - rows;
    std::vector<ForwardRequest> reqs(static_cast<size_t>(max_num_seqs), {.tokens = step_tokens,
                                                                         .start_pos = at,
                                                                         .block_table = table,
                                                                         .num_logits = rows,
                                                                         .tap_layers = taps});
    std::vector<ProposeRequest> proposes(static_cast<size_t>(max_num_seqs),
                                         {.anchor = 0,
                                          .anchor_pos = at,
                                          .block_table = table,
                                          .num_drafts = drafter ? drafter->max_drafts() : 0});
    BatchForwardResult batch;
    s = catch_allocation_failure([&] {
      BS_RETURN_IF_ERROR(target.forward_batch(reqs, target_kv, &batch));
      if (drafter) {
        Tensor logits;
        Status p = drafter->propose_batch(draft_kv, proposes, &logits);
        if (p.code() == StatusCode::kUnimplemented)
          p = drafter->propose(draft_kv, proposes[0], &logits);
        BS_RETURN_IF_ERROR(p);
      }
      backend.synchronize();
      return Status::Ok();
    });
    if (!s.ok()) {
      return Status(s.code(),
                    fmt::format("the worst-case batched step ({} sequences of {} rows at position "
                                "{}) does not fit in the memory left after loading the model "
                                "(lower --max-num-seqs or --max-model-len): {}",
                                max_num_seqs, rows, at, s.message()));
    }
  }
  // The scheduler's mixed step (SchedulerOptions::mixed_steps): the other sequences' step rows and
  // the prefill chunk in one forward (more rows than either alone), with a drafter one observe of
  // both.
  if (max_num_seqs > 1 && window > rows + 1) {
    const std::vector<int32_t> step_tokens(static_cast<size_t>(rows), 0);
    const int64_t at = window - 1 - rows;
    std::vector<ForwardRequest> reqs(static_cast<size_t>(max_num_seqs - 1), {.tokens = step_tokens,
                                                                             .start_pos = at,
                                                                             .block_table = table,
                                                                             .num_logits = rows,
                                                                             .tap_layers = taps});
    reqs.push_back({.tokens = tokens,
                    .start_pos = start,
                    .block_table = table,
                    .num_logits = 1,
                    .tap_layers = taps});
    BatchForwardResult batch;
    s = catch_allocation_failure([&] {
      BS_RETURN_IF_ERROR(target.forward_batch(reqs, target_kv, &batch));
      if (drafter) {
        std::vector<ObserveRequest> observes;
        for (size_t i = 0; i < reqs.size(); ++i) {
          observes.push_back(
              {.block_table = table, .taps = batch.seqs[i].taps, .start_pos = reqs[i].start_pos});
        }
        BS_RETURN_IF_ERROR(drafter->observe_batch(draft_kv, observes));
      }
      backend.synchronize();
      return Status::Ok();
    });
    if (!s.ok()) {
      return Status(s.code(),
                    fmt::format("the worst-case mixed step ({} sequences of {} rows and {} prompt "
                                "tokens) does not fit in the memory left after loading the model "
                                "(lower --max-num-batched-tokens, --max-num-seqs or "
                                "--max-model-len): {}",
                                max_num_seqs - 1, rows, n, s.message()));
    }
  }
  const int64_t measured = std::max<int64_t>(0, backend.allocation_stats().peak - base);
  // Sampled requests' device sampling: F32 distributions of their step's rows over the vocab,
  // their filtered copy and a draw workspace of about as much.
  const int64_t sampling = max_num_seqs * rows * target.config().vocab_size * 4 * 3;
  return measured + sampling;
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

namespace {

// plan_kv_cache without the conversion of an allocation failure.
Result<KvCachePlan> plan_within_memory(CausalLM& target, Drafter* drafter,
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

  if (request.max_prefill_tokens < 0) {
    return InvalidArgument("max_num_batched_tokens {} must be >= 0 (0: whole prompts)",
                           request.max_prefill_tokens);
  }
  const MemoryInfo mem = target.backend().memory_info();
  const bool warm_up =
      request.warm_up == StepWarmUp::kAlways ||
      (request.warm_up == StepWarmUp::kAuto && target.backend().device() != Device::kCpu);
  if (warm_up) {
    BS_ASSIGN_OR_RETURN(
        plan.scratch_bytes,
        measure_step_scratch(target, drafter, window_of(target, request.max_context),
                             plan.window_blocks, request.max_num_seqs, request.max_prefill_tokens));
  }
  const auto reserved = static_cast<int64_t>((1.0 - util) * static_cast<double>(mem.total));
  plan.available_bytes = std::max<int64_t>(0, mem.free - reserved - plan.scratch_bytes);
  const std::string device = target.backend().name() == "cpu" ? "host RAM" : "device memory";
  if (plan.available_bytes < plan.block_bytes) {
    return InvalidArgument(
        "no memory left for a KV cache: {:.2f} GiB of {:.2f} GiB {} are in use after loading the "
        "model, the worst-case step needs {:.2f} GiB of scratch, and memory utilization {} allows "
        "{:.2f} GiB (raise --memory-utilization or free the device)",
        gib(mem.total - mem.free), gib(mem.total), device, gib(plan.scratch_bytes), util,
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

}  // namespace

Result<KvCachePlan> plan_kv_cache(CausalLM& target, Drafter* drafter,
                                  const KvCacheRequest& request) {
  Result<KvCachePlan> plan = catch_allocation_failure(
      [&]() -> Result<KvCachePlan> { return plan_within_memory(target, drafter, request); });
  if (plan.ok() || plan.status().code() != StatusCode::kOutOfMemory ||
      plan.status().message().find("(lower --") != std::string::npos) {
    return plan;
  }
  return plan.status().with_context(
      "sizing the KV cache: not even one block fits after loading the model (lower "
      "--max-model-len, raise --memory-utilization or free the device)");
}

}  // namespace bs
