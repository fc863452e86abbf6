#include "engine/speculative_sequence.h"

#include <algorithm>

#include "engine/speculative_accept.h"

namespace bs::detail {

Result<int64_t> begin_speculative(const CausalLM& target, const Drafter& drafter,
                                  std::span<const int32_t> prompt, const GenerateOptions& options,
                                  int64_t max_context, GenerateStats& stats) {
  BS_RETURN_IF_ERROR(begin_generation(target, prompt, options, max_context, stats));
  if (options.draft_tokens < 0 || options.draft_tokens > drafter.max_drafts()) {
    return InvalidArgument("draft_tokens {} out of range [0, {}] (0: the drafter's maximum, {})",
                           options.draft_tokens, drafter.max_drafts(), drafter.max_drafts());
  }
  if (!(options.draft_confidence_min >= 0.0 && options.draft_confidence_min <= 1.0)) {
    return InvalidArgument("draft_confidence_min {} out of range [0, 1]",
                           options.draft_confidence_min);
  }
  if (options.draft_confidence_min > 0.0 && !drafter.has_confidence()) {
    return InvalidArgument(
        "draft_confidence_min needs a drafter with a confidence head (DSpark with "
        "enable_confidence_head); the {} drafter has none",
        drafter.family());
  }
  const int64_t budget = options.draft_tokens > 0 ? options.draft_tokens : drafter.max_drafts();
  stats.position_offered.assign(static_cast<size_t>(budget), 0);
  stats.position_accepted.assign(static_cast<size_t>(budget), 0);
  return budget;
}

int64_t speculative_blocks(const Drafter& drafter, int64_t prompt_tokens,
                           const GenerateOptions& options, int64_t max_context) {
  const int64_t new_tokens = std::clamp<int64_t>(options.max_tokens, 0, max_context);
  const int64_t reach = std::min(prompt_tokens + new_tokens, max_context);
  return (reach + drafter.block_size() + kKvBlockSize - 1) / kKvBlockSize;
}

namespace {

// Verify rows per sequence the step buffers hold.
int64_t rows_per_sequence(const Drafter& drafter) {
  return std::max(drafter.block_size(), drafter.max_drafts()) + 1;
}

}  // namespace

SpeculativeRun::SpeculativeRun(CausalLM& target, Drafter& drafter, int64_t num_blocks,
                               int64_t max_seqs)
    : target(target),
      drafter(drafter),
      target_kv(target.make_kv_pool(num_blocks)),
      draft_kv(drafter.make_kv_pool(num_blocks)),
      allocator(num_blocks),
      max_seqs(max_seqs),
      target_sampling(target.backend()) {
  BS_CHECK(max_seqs >= 1);
  Backend& backend = target.backend();
  const int64_t rows = max_seqs * rows_per_sequence(drafter);
  verify_tokens = backend.empty({rows}, DType::kI32);
  target_ids = backend.empty({rows}, DType::kI32);
  offsets = backend.empty({max_seqs + 1}, DType::kI32);
  accepted = backend.empty({max_seqs, rows_per_sequence(drafter) + 1}, DType::kI32);
  first_token = backend.empty({1}, DType::kI32);
}

SpeculativeSequence::SpeculativeSequence(SpeculativeRun& run, const GenerateOptions& options,
                                         std::span<const int32_t> prompt,
                                         const TokenCallback& on_token,
                                         const LogprobsCallback& on_logprobs, GenerateStats& stats)
    : run_(run),
      options_(options),
      max_context_(context_window(run.target, options)),
      draft_budget_(options.draft_tokens > 0 ? options.draft_tokens : run.drafter.max_drafts()),
      st_(stats),
      prompt_(prompt),
      kv_(run.allocator, kKvBlockSize),
      sampler_(options.sampling),
      draft_sampling_(run.target.backend()),
      out_(options, on_token, on_logprobs, stats) {}

Status SpeculativeSequence::observe(const Tensor& taps, int64_t start) {
  const auto t = Clock::now();
  BS_RETURN_IF_ERROR(run_.drafter.observe(run_.draft_kv, kv_.block_table(), taps, start));
  st_.observe_seconds += seconds_since(t);
  return Status::Ok();
}

Status SpeculativeSequence::prefill(int64_t max_tokens) {
  const int64_t start = kv_.length();
  const int64_t left = prompt_left();
  const int64_t n = max_tokens > 0 ? std::min(max_tokens, left) : left;
  const bool last = n == left;
  BS_RETURN_IF_ERROR(kv_.reserve(start + n));
  ForwardResult res;
  BS_RETURN_IF_ERROR(run_.target.forward(
      {.tokens = prompt_.subspan(static_cast<size_t>(start), static_cast<size_t>(n)),
       .start_pos = start,
       .block_table = kv_.block_table(),
       .num_logits = last ? 1 : 0,
       .tap_layers = run_.drafter.target_layers()},
      run_.target_kv, &res));
  kv_.set_length(start + n);
  BS_RETURN_IF_ERROR(observe(res.taps, start));
  // The read-back of the first token waits for the forward and the observe; a chunk
  // without logits waits for them too, so that the prefill's time is its own.
  Backend& backend = run_.target.backend();
  if (!last) {
    backend.synchronize();
    return Status::Ok();
  }
  run_.target_sampling.choose(sampler_, res.logits, run_.first_token);
  int32_t token = 0;
  backend.copy_to_host(&token, run_.first_token);
  std::vector<float> logits;
  if (wants_logits()) logits = backend.to_host_f32(res.logits);
  done_ = out_.commit(token, logits);
  return Status::Ok();
}

Result<bool> SpeculativeSequence::begin_step() {
  if (done_) return false;
  const GenerateOptions& options = options_;
  if (out_.size() >= options.max_tokens) {
    st_.finish = FinishReason::kLength;
    done_ = true;
    return false;
  }
  s_ = kv_.length();  // position of the anchor = tokens already cached
  if (s_ + 1 > max_context_) {
    st_.finish = FinishReason::kContext;
    done_ = true;
    return false;
  }
  k_ = std::min({draft_budget_, options.max_tokens - out_.size() - 1, max_context_ - s_ - 1});
  anchor_ = out_.back();
  const int64_t B = run_.drafter.block_size();
  BS_RETURN_IF_ERROR(kv_.reserve(s_ + std::max(B, k_ + 1)));

  verify_row_ = 0;
  drafts_.clear();
  step_ = SpeculativeStep{.anchor_pos = s_, .anchor = anchor_};
  return true;
}

ProposeRequest SpeculativeSequence::propose_request() const {
  return {.anchor = anchor_,
          .anchor_pos = s_,
          .block_table = kv_.block_table(),
          .num_drafts = k_,
          .noise_seed = options_.sampling.seed.value_or(0)};
}

void SpeculativeSequence::take_drafts(const Tensor& draft_logits) {
  draft_sampling_.choose(sampler_, draft_logits.rows(0, k_),
                         run_.verify_tokens.rows(verify_row_ + 1, k_));
}

DraftDraw SpeculativeSequence::draft_draw() {
  return draft_sampling_.draw_for_drafter(sampler_, k_, run_.target.config().vocab_size,
                                          run_.verify_tokens.rows(verify_row_ + 1, k_));
}

bool SpeculativeSequence::wants_confidence() const {
  return options_.draft_confidence_min > 0.0 && run_.drafter.has_confidence();
}

void SpeculativeSequence::cut_drafts(std::span<const float> survival) {
  int64_t keep = 0;
  while (keep < k_ && keep < static_cast<int64_t>(survival.size()) &&
         survival[static_cast<size_t>(keep)] >= options_.draft_confidence_min) {
    ++keep;
  }
  k_ = keep;
}

void SpeculativeSequence::move_block(int64_t row) {
  verify_row_ = row;
  if (!greedy() && k_ > 0) draft_sampling_.keep_drafts(k_, run_.verify_tokens.rows(row + 1, k_));
}

ForwardRequest SpeculativeSequence::verify_request() const {
  return {.start_pos = s_,
          .block_table = kv_.block_table(),
          .num_logits = k_ + 1,
          .tap_layers = run_.drafter.target_layers(),
          .device_tokens = run_.verify_tokens.rows(verify_row_, k_ + 1)};
}

void SpeculativeSequence::accept_on_device(const Tensor& verify_logits, const Tensor& result) {
  run_.target_sampling.accept(sampler_, draft_sampling_, verify_logits, result);
}

Status SpeculativeSequence::accept(const Tensor& taps, std::span<const int32_t> result,
                                   const Tensor& verify_logits, double verify_seconds) {
  BS_CHECK(static_cast<int64_t>(result.size()) >= k_ + 2);
  const AcceptResult acc{.accepted = result[0], .next = result[1]};
  BS_CHECK(acc.accepted >= 0 && acc.accepted <= k_);
  // The drafts, for the record (trace, last_step).
  drafts_.assign(result.begin() + 2, result.begin() + 2 + k_);
  step_.drafts = drafts_;
  std::vector<float> logits;  // the committed tokens' rows 0..a, for their logprobs
  if (wants_logits()) {
    logits = run_.target.backend().to_host_f32(verify_logits.rows(0, acc.accepted + 1));
  }
  return commit_step(acc, taps, logits, verify_seconds);
}

Status SpeculativeSequence::commit_step(const AcceptResult& acc, const Tensor& taps,
                                        std::span<const float> target_logits,
                                        double verify_seconds) {
  kv_.set_length(s_ + k_ + 1);
  const std::span<const int32_t> drafts = step_.drafts;
  const int64_t a = acc.accepted;
  ++st_.steps;
  st_.drafted += k_;
  st_.accepted += a;
  for (int64_t i = 0; i < k_; ++i) ++st_.position_offered[i];
  for (int64_t i = 0; i < a; ++i) ++st_.position_accepted[i];

  // Commit d_1..d_a and the target's token, the i-th decided by verify row i; the cache keeps
  // the anchor and accepted drafts.
  kv_.truncate(s_ + a + 1);
  const auto row = [&](int64_t i) {
    if (target_logits.empty()) return std::span<const float>();
    const size_t vocab = static_cast<size_t>(run_.target.config().vocab_size);
    return target_logits.subspan(static_cast<size_t>(i) * vocab, vocab);
  };
  for (int64_t i = 0; i < a && !done_; ++i) done_ = out_.commit(drafts[i], row(i));
  if (!done_) done_ = out_.commit(acc.next, row(a));

  // The drafter's context grows by positions s..s+a (taps rows 0..a of the verify pass).
  pending_observe_.reset();
  if (!done_) {
    pending_observe_ = ObserveRequest{
        .block_table = kv_.block_table(), .taps = taps.rows(0, a + 1), .start_pos = s_};
  }
  step_.accepted = a;
  step_.next = acc.next;
  step_.verify_seconds = verify_seconds;
  st_.draft_seconds += step_.draft_seconds;
  st_.verify_seconds += verify_seconds;
  return Status::Ok();
}

namespace {

// The drafts of every sequence that wants some: one Drafter::propose_batch when the drafter has
// a batched pass (rows [i * nd, i * nd + k_i) are sequence i's), else one propose per sequence.
// Either way each sequence gets its own propose's drafts, taken before the next propose reuses
// the drafter's scratch.
Status propose_all(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs) {
  std::vector<SpeculativeSequence*> wanting;
  std::vector<ProposeRequest> reqs;
  for (SpeculativeSequence* seq : seqs) {
    if (seq->drafts_wanted() == 0) continue;
    wanting.push_back(seq);
    reqs.push_back(seq->propose_request());
  }
  if (wanting.empty()) return Status::Ok();
  const auto t = Clock::now();
  if (run.drafter.draws_drafts()) {
    // The drafter draws (DSpark's Markov chain, DFlash2's selector walk): one call for all, the
    // drafts land in run.verify_tokens; with a confidence cut, each sequence then keeps its
    // confident prefix (the one read-back of the propose).
    std::vector<DraftDraw> draws;
    bool confidence = false;
    for (SpeculativeSequence* seq : wanting) {
      draws.push_back(seq->draft_draw());
      confidence |= seq->wants_confidence();
    }
    std::vector<std::vector<float>> survival;
    BS_RETURN_IF_ERROR(
        run.drafter.propose_draw(run.draft_kv, reqs, draws, confidence ? &survival : nullptr));
    const double seconds = seconds_since(t);
    for (size_t r = 0; r < wanting.size(); ++r) {
      if (confidence && wanting[r]->wants_confidence()) wanting[r]->cut_drafts(survival[r]);
      wanting[r]->take_draft_seconds(seconds);
    }
    return Status::Ok();
  }
  if (run.batched_propose && wanting.size() > 1) {
    Tensor logits;
    const Status st = run.drafter.propose_batch(run.draft_kv, reqs, &logits);
    if (st.ok()) {
      const int64_t nd = logits.dim(0) / static_cast<int64_t>(wanting.size());
      for (size_t r = 0; r < wanting.size(); ++r) {
        wanting[r]->take_drafts(logits.rows(static_cast<int64_t>(r) * nd, nd));
      }
      const double seconds = seconds_since(t);  // the batch's drafts, issued
      for (SpeculativeSequence* seq : wanting) seq->take_draft_seconds(seconds);
      return Status::Ok();
    }
    if (st.code() != StatusCode::kUnimplemented) return st;
    run.batched_propose = false;
  }
  for (size_t r = 0; r < wanting.size(); ++r) {
    const auto tr = Clock::now();
    Tensor logits;
    BS_RETURN_IF_ERROR(run.drafter.propose(run.draft_kv, reqs[r], &logits));
    wanting[r]->take_drafts(logits);
    wanting[r]->take_draft_seconds(seconds_since(tr));
  }
  return Status::Ok();
}

// The drafter's context updates of the step (each left pending by its accept), in one
// Drafter::observe_batch, launched without waiting for it: the next step's read-back does.
Status observe_all(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs) {
  std::vector<SpeculativeSequence*> pending;
  std::vector<ObserveRequest> reqs;
  for (SpeculativeSequence* seq : seqs) {
    if (!seq->pending_observe()) continue;
    pending.push_back(seq);
    reqs.push_back(*seq->pending_observe());
  }
  if (pending.empty()) return Status::Ok();
  const auto t = Clock::now();
  BS_RETURN_IF_ERROR(run.drafter.observe_batch(run.draft_kv, reqs));
  const double seconds = seconds_since(t);
  for (SpeculativeSequence* seq : pending) seq->observed(seconds);
  return Status::Ok();
}

}  // namespace

Status speculative_step(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs) {
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  BS_CHECK(num_seqs >= 1 && num_seqs <= run.max_seqs);
  Backend& backend = run.target.backend();

  // Block i of the step is rows [offsets[i], offsets[i + 1]) of run.verify_tokens and of the
  // verify forward (its logit rows too). The anchors go up with the step's other uploads (the
  // block boundaries too when greedy_accept needs them); the drafts are chosen in next to them on
  // the device (take_drafts).
  std::vector<int32_t>& offsets = run.offsets_host;
  offsets.assign(1, 0);
  bool any_greedy = false;
  for (SpeculativeSequence* seq : seqs) {
    offsets.push_back(offsets.back() + static_cast<int32_t>(seq->verify_rows()));
    any_greedy |= seq->greedy();
  }
  int64_t rows = offsets.back();
  run.tokens_host.assign(static_cast<size_t>(rows), 0);
  for (int64_t i = 0; i < num_seqs; ++i) {
    run.tokens_host[static_cast<size_t>(offsets[i])] = seqs[i]->anchor();
    seqs[i]->set_verify_row(offsets[i]);
  }
  backend.copy_from_host(run.verify_tokens.rows(0, rows), run.tokens_host.data());
  if (any_greedy) backend.copy_from_host(run.offsets.rows(0, num_seqs + 1), offsets.data());
  BS_RETURN_IF_ERROR(propose_all(run, seqs));
  // Confidence cuts shrank some blocks: close the gaps (through run.target_ids, free until the
  // verify) so that the blocks lie back to back again.
  bool moved = false;
  for (int64_t i = 0; i < num_seqs; ++i) {
    moved |= offsets[i] + seqs[i]->verify_rows() != offsets[i + 1];
  }
  if (moved) {
    backend.copy(run.target_ids.rows(0, rows), run.verify_tokens.rows(0, rows));
    int32_t row = 0;
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int64_t n = seqs[i]->verify_rows();
      backend.copy(run.verify_tokens.rows(row, n), run.target_ids.rows(offsets[i], n));
      seqs[i]->move_block(row);
      offsets[i] = row;
      row += static_cast<int32_t>(n);
    }
    offsets[num_seqs] = row;
    rows = row;
    if (any_greedy) backend.copy_from_host(run.offsets.rows(0, num_seqs + 1), offsets.data());
  }

  run.reqs.clear();
  for (SpeculativeSequence* seq : seqs) run.reqs.push_back(seq->verify_request());
  const auto t = Clock::now();
  BS_RETURN_IF_ERROR(run.target.forward_batch(run.reqs, run.target_kv, &run.res));
  const Tensor& logits = run.res.logits;  // [rows, vocab]
  const Tensor result = run.accepted.rows(0, num_seqs);
  const int64_t width = result.dim(1);
  // Every block's [a, next, drafts] into its row of `result`: one greedy_accept for all (rows of
  // sampled blocks are then overwritten), a rejection sampling per sampled block.
  if (any_greedy) {
    const Tensor target_ids = run.target_ids.rows(0, rows);
    backend.argmax(target_ids, logits);
    backend.greedy_accept(result, run.verify_tokens.rows(0, rows), target_ids,
                          run.offsets.rows(0, num_seqs + 1));
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    SpeculativeSequence& seq = *seqs[i];
    if (seq.greedy()) continue;
    seq.accept_on_device(logits.rows(offsets[i], seq.verify_rows()),
                         result.rows(i, 1).view({width}).rows(0, seq.verify_rows() + 1));
  }
  // The step's one read-back.
  run.accepted_host.resize(static_cast<size_t>(result.numel()));
  backend.copy_to_host(run.accepted_host.data(), result);
  const double verify_s = seconds_since(t);

  for (int64_t i = 0; i < num_seqs; ++i) {
    SpeculativeSequence& seq = *seqs[i];
    BS_RETURN_IF_ERROR(
        seq.accept(run.res.seqs[static_cast<size_t>(i)].taps,
                   std::span(run.accepted_host).subspan(static_cast<size_t>(i * width), width),
                   logits.rows(offsets[i], seq.verify_rows()), verify_s));
  }
  return observe_all(run, seqs);
}

}  // namespace bs::detail
