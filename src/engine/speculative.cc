// Lossless speculative decoding of one sequence with a block drafter (specs/dflash.md §2):
//
//   prefill   target forward over the prompt with taps; the drafter observes every prompt
//             position; the first token is sampled from the last prompt row.
//   each step anchor = last committed token at position s (its K/V not yet in the target cache)
//             propose  drafts d_1..d_k for positions s+1..s+k
//             verify   target forward over [anchor, d_1..d_k] at s..s+k with taps, k+1 logit rows
//             accept   the longest accepted prefix d_1..d_a plus one target token (bonus or
//                      correction); roll the target KV back to s+a+1 (anchor + accepted drafts)
//             commit   the accepted tokens to the output, one by one (stops, callbacks)
//             observe  the drafter turns taps rows 0..a (positions s..s+a) into context K/V
// Drafts, verify input and acceptance stay on the device, greedy (argmax, Backend::greedy_accept)
// or sampled (draws and rejection sampling, DeviceSampling); the host reads back one small result
// per step ([a, next, drafts]; with logprobs also the committed rows' logits) and launches the
// observe after it (detail::SpeculativeStep, one object with these phases).
//
// k = min(draft budget, max_tokens left - 1, context room) so that the output stops exactly where
// generate_plain stops: stop tokens (included, nothing after them), max_tokens, the context window
// and callback cancellation are checked token by token, in order.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"
#include "engine/speculative_sequence.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

namespace {

// generate_speculative without the conversion of an allocation failure.
Result<std::vector<int32_t>> run_speculative(CausalLM& target, Drafter& drafter,
                                             std::span<const int32_t> prompt,
                                             const GenerateOptions& options,
                                             const TokenCallback& on_token, GenerateStats* stats,
                                             const LogprobsCallback& on_logprobs) {
  const int64_t max_context = detail::context_window(target, options);
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  BS_RETURN_IF_ERROR(
      detail::begin_speculative(target, drafter, prompt, options, max_context, st).status());

  std::ofstream trace;
  if (!options.trace_path.empty()) {
    trace.open(options.trace_path, std::ios::out | std::ios::trunc);
    if (!trace) return InvalidArgument("cannot open trace file '{}'", options.trace_path);
  }

  auto t0 = Clock::now();
  if (options.max_tokens <= 0) {  // generate_plain runs nothing either
    st.decode_seconds = seconds_since(t0);
    return detail::CommittedTokens(options, on_token, on_logprobs, st).finish();
  }

  detail::SpeculativeRun run(
      target, drafter,
      detail::speculative_blocks(drafter, static_cast<int64_t>(prompt.size()), options,
                                 max_context));
  detail::SpeculativeSequence seq(run, options, prompt, on_token, on_logprobs, st);

  // ---- Prefill: the prompt (in chunks of options.prefill_chunk), its taps observed by the
  // drafter, the first token. ----
  do {
    BS_RETURN_IF_ERROR(seq.prefill(options.prefill_chunk));
  } while (seq.prompt_left() > 0);
  st.prefill_seconds = seconds_since(t0);
  t0 = Clock::now();

  // ---- Decode steps: propose, verify, accept, commit, observe (detail::SpeculativeStep). ----
  detail::SpeculativeSequence* const seqs[] = {&seq};
  while (true) {
    BS_ASSIGN_OR_RETURN(const bool stepping, seq.begin_step());
    if (!stepping) break;
    BS_RETURN_IF_ERROR(detail::speculative_step(run, seqs));

    if (trace.is_open()) {
      const detail::StepRecord& step = seq.last_step();
      nlohmann::ordered_json line = {
          {"step", st.steps - 1},
          {"anchor_pos", step.anchor_pos},
          {"anchor", step.anchor},
          {"drafts", std::vector<int32_t>(step.drafts.begin(), step.drafts.end())},
          {"accepted", step.accepted},
          {"bonus", step.next},
          {"draft_ms", step.times.propose * 1e3},
          {"verify_ms", step.times.verify * 1e3},
          {"accept_ms", step.times.accept * 1e3},
          {"commit_ms", step.times.commit * 1e3},
          {"observe_ms", step.times.observe * 1e3}};
      trace << line.dump() << '\n';
    }
  }
  st.decode_seconds = seconds_since(t0);
  if (trace.is_open()) {
    trace.flush();
    if (!trace) return InvalidArgument("writing trace file '{}' failed", options.trace_path);
  }
  return seq.finish();
}

}  // namespace

Result<std::vector<int32_t>> generate_speculative(CausalLM& target, Drafter& drafter,
                                                  std::span<const int32_t> prompt,
                                                  const GenerateOptions& options,
                                                  const TokenCallback& on_token,
                                                  GenerateStats* stats,
                                                  const LogprobsCallback& on_logprobs) {
  return catch_allocation_failure([&]() -> Result<std::vector<int32_t>> {
    return run_speculative(target, drafter, prompt, options, on_token, stats, on_logprobs);
  });
}

}  // namespace bs
