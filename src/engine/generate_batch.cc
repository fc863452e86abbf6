// generate_plain_batch / generate_speculative_batch: a fixed set of prompts through one Scheduler
// that admits them all at once and steps them together until every one has finished.
#include <fmt/format.h>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/scheduler.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

namespace {

Result<std::vector<std::vector<int32_t>>> run_batch(CausalLM& target, Drafter* drafter,
                                                    std::span<const std::vector<int32_t>> prompts,
                                                    const GenerateOptions& options,
                                                    std::vector<GenerateStats>* stats) {
  std::vector<GenerateStats> local;
  std::vector<GenerateStats>& st = stats ? *stats : local;
  st.assign(prompts.size(), GenerateStats{});
  // A pool holding every prompt's worst case, so that all are admitted in the first step.
  int64_t num_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto blocks = kv_blocks_needed(target, drafter, prompts[i], options);
    if (!blocks.ok()) return blocks.status().with_context(fmt::format("prompt {}", i));
    num_blocks += *blocks;
  }
  Scheduler scheduler(target, drafter,
                      {.max_num_seqs = static_cast<int64_t>(prompts.size()),
                       .kv_blocks = std::max<int64_t>(num_blocks, 1)});
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  Status failed;
  for (size_t i = 0; i < prompts.size(); ++i) {
    BS_RETURN_IF_ERROR(scheduler.add(i, prompts[i], options, nullptr, [&, i](Completion c) {
      outputs[i] = std::move(c.tokens);
      st[i] = std::move(c.stats);
      if (failed.ok()) failed = c.status.with_context(fmt::format("prompt {}", i));
    }));
  }
  const auto t0 = Clock::now();
  while (!scheduler.idle()) BS_RETURN_IF_ERROR(scheduler.step());
  BS_RETURN_IF_ERROR(failed);
  // The batch's times: the scheduler's own admission + prefill time (prompts may prefill
  // together in one forward, so the requests' own prefill times overlap and must not be summed),
  // the rest is decoding.
  const double prefill_seconds = scheduler.times().admit_prefill;
  const double decode_seconds = seconds_since(t0) - prefill_seconds;
  for (GenerateStats& s : st) {
    s.prefill_seconds = prefill_seconds;
    s.decode_seconds = decode_seconds;
  }
  return outputs;
}

}  // namespace

Result<std::vector<std::vector<int32_t>>> generate_plain_batch(
    CausalLM& target, std::span<const std::vector<int32_t>> prompts, const GenerateOptions& options,
    std::vector<GenerateStats>* stats) {
  if (prompts.empty()) return InvalidArgument("generate: no prompts");
  return run_batch(target, nullptr, prompts, options, stats);
}

Result<std::vector<std::vector<int32_t>>> generate_speculative_batch(
    CausalLM& target, Drafter& drafter, std::span<const std::vector<int32_t>> prompts,
    const GenerateOptions& options, std::vector<GenerateStats>* stats) {
  if (prompts.empty()) return InvalidArgument("generate_speculative_batch: no prompts");
  if (!options.trace_path.empty()) {
    return InvalidArgument(
        "generate_speculative_batch: trace_path is not supported for a batch (trace one "
        "sequence with generate_speculative)");
  }
  return run_batch(target, &drafter, prompts, options, stats);
}

}  // namespace bs
