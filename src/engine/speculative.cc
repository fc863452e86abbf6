// Lossless speculative decoding of one sequence with a block drafter (specs/dflash.md §2):
//
//   prefill   target forward over the prompt with taps; the drafter observes every prompt
//             position; the first token is sampled from the last prompt row.
//   each step anchor = last committed token at position s (its K/V not yet in the target cache)
//             propose  drafts d_1..d_k for positions s+1..s+k
//             verify   target forward over [anchor, d_1..d_k] at s..s+k with taps, k+1 logit rows
//             accept   the longest accepted prefix d_1..d_a plus one target token (bonus or
//                      correction); roll the target KV back to s+a+1 (anchor + accepted drafts)
//             observe  the drafter turns taps rows 0..a (positions s..s+a) into context K/V
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
#include "engine/speculative_accept.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

Result<std::vector<int32_t>> generate_speculative(CausalLM& target, Drafter& drafter,
                                                  std::span<const int32_t> prompt,
                                                  const GenerateOptions& options,
                                                  const TokenCallback& on_token,
                                                  GenerateStats* stats) {
  const int64_t max_context = detail::context_window(target, options);
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  BS_RETURN_IF_ERROR(detail::begin_generation(target, prompt, options, max_context, st));
  if (options.draft_tokens < 0 || options.draft_tokens > drafter.max_drafts()) {
    return InvalidArgument("draft_tokens {} out of range [0, {}] (0: the drafter's maximum, {})",
                           options.draft_tokens, drafter.max_drafts(), drafter.max_drafts());
  }
  const int64_t draft_budget =
      options.draft_tokens > 0 ? options.draft_tokens : drafter.max_drafts();
  st.position_offered.assign(static_cast<size_t>(draft_budget), 0);
  st.position_accepted.assign(static_cast<size_t>(draft_budget), 0);

  std::ofstream trace;
  if (!options.trace_path.empty()) {
    trace.open(options.trace_path, std::ios::out | std::ios::trunc);
    if (!trace) return InvalidArgument("cannot open trace file '{}'", options.trace_path);
  }

  detail::CommittedTokens out(options, on_token, st);
  auto t0 = Clock::now();
  if (options.max_tokens <= 0) {  // generate_plain runs nothing either
    st.decode_seconds = seconds_since(t0);
    return out.finish();
  }

  // One block table per sequence serves both caches. propose writes block K/V up to s + B - 1
  // with s <= max_context - 1, hence B positions of headroom.
  const int64_t B = drafter.block_size();
  const int64_t num_blocks = (max_context + B + kKvBlockSize - 1) / kKvBlockSize;
  KvPool target_kv = target.make_kv_pool(num_blocks);
  KvPool draft_kv = drafter.make_kv_pool(num_blocks);
  BlockAllocator allocator(num_blocks);
  SequenceKv seq(allocator, kKvBlockSize);
  Sampler sampler(options.sampling);
  Backend& backend = target.backend();
  const std::vector<int>& taps_layers = drafter.target_layers();
  const int64_t vocab = target.config().vocab_size;
  const bool greedy = options.sampling.greedy();

  auto observe = [&](const Tensor& taps, int64_t start) -> Status {
    const auto t = Clock::now();
    BS_RETURN_IF_ERROR(drafter.observe(draft_kv, seq.block_table(), taps, start));
    backend.synchronize();
    const double dt = seconds_since(t);
    st.observe_seconds += dt;
    return Status::Ok();
  };

  // ---- Prefill: the prompt, its taps observed by the drafter, the first token. ----
  const int64_t P = static_cast<int64_t>(prompt.size());
  BS_RETURN_IF_ERROR(seq.reserve(P));
  ForwardResult res;
  BS_RETURN_IF_ERROR(target.forward({.tokens = prompt,
                                     .start_pos = 0,
                                     .block_table = seq.block_table(),
                                     .num_logits = 1,
                                     .tap_layers = taps_layers},
                                    target_kv, &res));
  seq.set_length(P);
  std::vector<float> logits = backend.to_host_f32(res.logits);
  BS_RETURN_IF_ERROR(observe(res.taps, 0));
  st.prefill_seconds = seconds_since(t0);
  t0 = Clock::now();
  bool done = out.commit(sampler.sample(logits));

  // ---- Decode steps. ----
  std::vector<int32_t> drafts, verify_tokens, target_argmax;
  std::vector<float> draft_logits, q, p;
  // Greedy steps take the argmax on the device and read back only token ids.
  const Tensor argmax_ids = backend.empty({std::max<int64_t>(B, draft_budget) + 1}, DType::kI32);
  const auto device_argmax = [&](const Tensor& rows, std::vector<int32_t>* ids) {
    const Tensor out = argmax_ids.rows(0, rows.dim(0));
    backend.argmax(out, rows);
    ids->resize(static_cast<size_t>(rows.dim(0)));
    backend.copy_to_host(ids->data(), out);
  };
  while (!done) {
    if (out.size() >= options.max_tokens) {
      st.finish = FinishReason::kLength;
      break;
    }
    const int64_t s = seq.length();  // position of the anchor = tokens already cached
    if (s + 1 > max_context) {
      st.finish = FinishReason::kContext;
      break;
    }
    const int64_t k =
        std::min({draft_budget, options.max_tokens - out.size() - 1, max_context - s - 1});
    const int32_t anchor = out.back();
    BS_RETURN_IF_ERROR(seq.reserve(s + std::max(B, k + 1)));

    // Propose.
    auto t = Clock::now();
    drafts.clear();
    q.clear();
    if (k > 0) {
      Tensor dl;
      BS_RETURN_IF_ERROR(drafter.propose(draft_kv,
                                         {.anchor = anchor,
                                          .anchor_pos = s,
                                          .block_table = seq.block_table(),
                                          .num_drafts = k,
                                          .noise_seed = options.sampling.seed.value_or(0)},
                                         &dl));
      if (greedy) {
        device_argmax(dl.rows(0, k), &drafts);
      } else {
        draft_logits = backend.to_host_f32(dl);
        std::vector<float> row_q;
        for (int64_t i = 0; i < k; ++i) {
          const std::span<const float> row(draft_logits.data() + i * vocab,
                                           static_cast<size_t>(vocab));
          sampler.probs(row, &row_q);
          drafts.push_back(sampler.sample_from(row_q));
          q.insert(q.end(), row_q.begin(), row_q.end());
        }
      }
    }
    const double draft_s = seconds_since(t);

    // Verify.
    t = Clock::now();
    verify_tokens.assign(1, anchor);
    verify_tokens.insert(verify_tokens.end(), drafts.begin(), drafts.end());
    BS_RETURN_IF_ERROR(target.forward({.tokens = verify_tokens,
                                       .start_pos = s,
                                       .block_table = seq.block_table(),
                                       .num_logits = k + 1,
                                       .tap_layers = taps_layers},
                                      target_kv, &res));
    seq.set_length(s + k + 1);
    if (greedy) {
      device_argmax(res.logits, &target_argmax);
    } else {
      logits = backend.to_host_f32(res.logits);
    }
    const double verify_s = seconds_since(t);

    // Accept.
    AcceptResult acc;
    if (greedy) {
      acc = accept_greedy(drafts, target_argmax);
    } else {
      p.resize(static_cast<size_t>((k + 1) * vocab));
      std::vector<float> row_p;
      for (int64_t i = 0; i <= k; ++i) {
        sampler.probs(std::span<const float>(logits.data() + i * vocab, static_cast<size_t>(vocab)),
                      &row_p);
        std::copy(row_p.begin(), row_p.end(), p.begin() + i * vocab);
      }
      acc = accept_sampled(drafts, q, p, vocab, sampler);
    }
    const int64_t a = acc.accepted;
    ++st.steps;
    st.drafted += k;
    st.accepted += a;
    for (int64_t i = 0; i < k; ++i) ++st.position_offered[i];
    for (int64_t i = 0; i < a; ++i) ++st.position_accepted[i];

    // Commit d_1..d_a and the target's token; the cache keeps the anchor and accepted drafts.
    seq.truncate(s + a + 1);
    for (int64_t i = 0; i < a && !done; ++i) done = out.commit(drafts[i]);
    if (!done) done = out.commit(acc.next);

    // The drafter's context grows by positions s..s+a (taps rows 0..a of the verify pass).
    const double observe_before = st.observe_seconds;
    if (!done) BS_RETURN_IF_ERROR(observe(res.taps.rows(0, a + 1), s));
    const double observe_s = st.observe_seconds - observe_before;
    st.draft_seconds += draft_s;
    st.verify_seconds += verify_s;

    if (trace.is_open()) {
      nlohmann::ordered_json line = {{"step", st.steps - 1},
                                     {"anchor_pos", s},
                                     {"anchor", anchor},
                                     {"drafts", drafts},
                                     {"accepted", a},
                                     {"bonus", acc.next},
                                     {"draft_ms", draft_s * 1e3},
                                     {"verify_ms", verify_s * 1e3},
                                     {"observe_ms", observe_s * 1e3}};
      trace << line.dump() << '\n';
    }
  }
  st.decode_seconds = seconds_since(t0);
  if (trace.is_open()) {
    trace.flush();
    if (!trace) return InvalidArgument("writing trace file '{}' failed", options.trace_path);
  }
  return out.finish();
}

}  // namespace bs
