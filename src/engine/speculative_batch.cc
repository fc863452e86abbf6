// Batched lossless speculative decoding: the sequences prefill one by one, then step together.
// Each step the sequences still generating propose their drafts (in one Drafter::propose_batch
// when the drafter has one), one CausalLM::forward_batch verifies all their blocks, each
// sequence accepts and rolls back on its own, and one Drafter::observe_batch updates the
// drafter's context of them all. The per-sequence work is
// SpeculativeSequence, the same code generate_speculative runs, so every sequence gets exactly its
// single-sequence output.
#include <fmt/format.h>

#include <memory>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"
#include "engine/speculative_sequence.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

namespace {

const TokenCallback kNoCallback;  // batched generation reports tokens at the end

// The drafts of every active sequence that wants some: one Drafter::propose_batch when the
// drafter has a batched pass (rows [i * nd, i * nd + k_i) are sequence i's), else one propose
// per sequence. Either way each sequence gets its own propose's drafts.
Status propose_all(Drafter& drafter, KvPool& draft_kv,
                   std::vector<std::unique_ptr<detail::SpeculativeSequence>>& seqs,
                   std::span<const size_t> active, bool* batched) {
  std::vector<detail::SpeculativeSequence*> wanting;
  std::vector<ProposeRequest> reqs;
  for (const size_t i : active) {
    if (seqs[i]->drafts_wanted() == 0) continue;
    wanting.push_back(seqs[i].get());
    reqs.push_back(seqs[i]->propose_request());
  }
  if (wanting.empty()) return Status::Ok();
  const auto t = Clock::now();
  if (*batched && wanting.size() > 1) {
    Tensor logits;
    const Status st = drafter.propose_batch(draft_kv, reqs, &logits);
    if (st.ok()) {
      const int64_t nd = logits.dim(0) / static_cast<int64_t>(wanting.size());
      const double seconds = seconds_since(t);
      for (size_t r = 0; r < wanting.size(); ++r) {
        wanting[r]->take_drafts(logits.rows(static_cast<int64_t>(r) * nd, nd), seconds);
      }
      return Status::Ok();
    }
    if (st.code() != StatusCode::kUnimplemented) return st;
    *batched = false;
  }
  for (size_t r = 0; r < wanting.size(); ++r) {
    const auto tr = Clock::now();
    Tensor logits;
    BS_RETURN_IF_ERROR(drafter.propose(draft_kv, reqs[r], &logits));
    wanting[r]->take_drafts(logits, seconds_since(tr));
  }
  return Status::Ok();
}

// The drafter's context updates of the step's sequences (each left pending by its accept), in one
// Drafter::observe_batch.
Status observe_all(Drafter& drafter, KvPool& draft_kv, Backend& backend,
                   std::vector<std::unique_ptr<detail::SpeculativeSequence>>& seqs,
                   std::span<const size_t> active) {
  std::vector<detail::SpeculativeSequence*> pending;
  std::vector<ObserveRequest> reqs;
  for (const size_t i : active) {
    if (!seqs[i]->pending_observe()) continue;
    pending.push_back(seqs[i].get());
    reqs.push_back(*seqs[i]->pending_observe());
  }
  if (pending.empty()) return Status::Ok();
  const auto t = Clock::now();
  BS_RETURN_IF_ERROR(drafter.observe_batch(draft_kv, reqs));
  backend.synchronize();
  const double seconds = seconds_since(t);
  for (detail::SpeculativeSequence* seq : pending) seq->observed(seconds);
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::vector<int32_t>>> generate_speculative_batch(
    CausalLM& target, Drafter& drafter, std::span<const std::vector<int32_t>> prompts,
    const GenerateOptions& options, std::vector<GenerateStats>* stats) {
  if (prompts.empty()) return InvalidArgument("generate_speculative_batch: no prompts");
  if (!options.trace_path.empty()) {
    return InvalidArgument(
        "generate_speculative_batch: trace_path is not supported for a batch (trace one "
        "sequence with generate_speculative)");
  }
  const int64_t max_context = detail::context_window(target, options);
  std::vector<GenerateStats> local;
  std::vector<GenerateStats>& st = stats ? *stats : local;
  st.assign(prompts.size(), GenerateStats{});
  int64_t draft_budget = 0, num_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto budget =
        detail::begin_speculative(target, drafter, prompts[i], options, max_context, st[i]);
    if (!budget.ok()) return budget.status().with_context(fmt::format("prompt {}", i));
    draft_budget = *budget;
    num_blocks += detail::speculative_blocks(drafter, static_cast<int64_t>(prompts[i].size()),
                                             options, max_context);
  }
  std::vector<std::vector<int32_t>> outputs;
  if (options.max_tokens <= 0) {  // generate_speculative runs nothing either
    for (GenerateStats& s : st) {
      outputs.push_back(detail::CommittedTokens(options, kNoCallback, s).finish());
    }
    return outputs;
  }

  detail::SpeculativeRun run(target, drafter, options, max_context, draft_budget, num_blocks);
  Backend& backend = target.backend();
  const int64_t num_seqs = static_cast<int64_t>(prompts.size());
  // The verify rows of all sequences: at most draft_budget + 1 each.
  const Tensor verify_ids = backend.empty({num_seqs * (draft_budget + 1)}, DType::kI32);
  std::vector<std::unique_ptr<detail::SpeculativeSequence>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(
        std::make_unique<detail::SpeculativeSequence>(run, prompts[i], kNoCallback, st[i]));
  }

  // ---- Prefill, one sequence at a time (as generate_speculative runs it). ----
  auto t0 = Clock::now();
  for (size_t i = 0; i < seqs.size(); ++i) {
    BS_RETURN_IF_ERROR(seqs[i]->prefill().with_context(fmt::format("prompt {}", i)));
  }
  const double prefill_seconds = seconds_since(t0);
  t0 = Clock::now();

  // ---- Decode steps: every active sequence proposes, one batched verify, each accepts. ----
  std::vector<size_t> active;   // indices of the sequences in this step
  bool batched_propose = true;  // until the drafter says it has no batched pass
  std::vector<ForwardRequest> reqs;
  std::vector<int32_t> target_argmax;
  std::vector<float> logits;
  BatchForwardResult res;
  const bool greedy = options.sampling.greedy();
  const int64_t vocab = target.config().vocab_size;
  while (true) {
    active.clear();
    reqs.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      BS_ASSIGN_OR_RETURN(const bool stepping, seqs[i]->begin_step(/*propose=*/false));
      if (stepping) active.push_back(i);
    }
    if (active.empty()) break;
    BS_RETURN_IF_ERROR(propose_all(drafter, run.draft_kv, seqs, active, &batched_propose));
    for (const size_t i : active) reqs.push_back(seqs[i]->verify_request());
    const auto t = Clock::now();
    BS_RETURN_IF_ERROR(target.forward_batch(reqs, run.target_kv, &res));
    detail::read_verify_rows(backend, res.logits, greedy, verify_ids, &target_argmax, &logits);
    const double verify_s = seconds_since(t);
    // Sequence r's logit rows follow those of sequences 0..r-1 (BatchForwardResult::logits).
    size_t row = 0;
    for (size_t r = 0; r < active.size(); ++r) {
      detail::SpeculativeSequence& seq = *seqs[active[r]];
      const size_t n = static_cast<size_t>(seq.verify_rows());
      const std::span<const int32_t> ids =
          greedy ? std::span<const int32_t>(target_argmax).subspan(row, n)
                 : std::span<const int32_t>();
      const std::span<const float> rows =
          greedy ? std::span<const float>()
                 : std::span<const float>(logits).subspan(row * static_cast<size_t>(vocab),
                                                          n * static_cast<size_t>(vocab));
      BS_RETURN_IF_ERROR(seq.accept(res.seqs[r].taps, ids, rows, /*observe_now=*/false));
      st[active[r]].verify_seconds += verify_s;  // the whole batch's verify
      row += n;
    }
    BS_RETURN_IF_ERROR(observe_all(drafter, run.draft_kv, backend, seqs, active));
  }
  const double decode_seconds = seconds_since(t0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    outputs.push_back(seqs[i]->finish());
    st[i].prefill_seconds = prefill_seconds;
    st[i].decode_seconds = decode_seconds;
  }
  return outputs;
}

}  // namespace bs
