#include "engine/speculative_sequence.h"

#include <algorithm>
#include <memory>

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
                               int64_t max_seqs, bool prefix_caching)
    : target(target),
      drafter(drafter),
      target_kv(target.make_kv_pool(num_blocks)),
      draft_kv(drafter.make_kv_pool(num_blocks)),
      allocator(num_blocks, prefix_caching),
      max_seqs(max_seqs),
      target_sampling(target.backend()) {
  BS_CHECK(max_seqs >= 1);
  Backend& backend = target.backend();
  const int64_t rows = max_seqs * rows_per_sequence(drafter);
  verify_tokens = backend.empty({rows}, DType::kI32);
  target_ids = backend.empty({rows}, DType::kI32);
  offsets = backend.empty({max_seqs + 1}, DType::kI32);
  accepted = backend.empty({max_seqs, rows_per_sequence(drafter) + 1}, DType::kI32);
  first_tokens = backend.empty({max_seqs}, DType::kI32);
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
      out_(options, on_token, on_logprobs, stats),
      rules_(options, prompt) {
  // The prompt's head from the prefix cache: both caches' blocks (one table serves the target's
  // K/V and the drafter's context K/V), so neither computes it again; the drafter has observed
  // those positions when the blocks were cached.
  st_.cached_tokens =
      std::min(take_cached_prefix(kv_, prompt), std::ssize(prompt) - options.generated_prefix);
}

Result<ForwardRequest> SpeculativeSequence::prefill_request(int64_t max_tokens) {
  const int64_t start = kv_.length();
  const int64_t left = prompt_left();
  const int64_t n = max_tokens > 0 ? std::min(max_tokens, left) : left;
  BS_RETURN_IF_ERROR(kv_.reserve(start + n));
  prefill_n_ = n;
  return ForwardRequest{
      .tokens = prompt_.subspan(static_cast<size_t>(start), static_cast<size_t>(n)),
      .start_pos = start,
      .block_table = kv_.block_table(),
      .num_logits = n == left ? 1 : 0,
      .tap_layers = run_.drafter.target_layers()};
}

ObserveRequest SpeculativeSequence::prefill_observe(const Tensor& taps) const {
  return {.block_table = kv_.block_table(), .taps = taps, .start_pos = kv_.length()};
}

bool SpeculativeSequence::prefilled(double observe_seconds) {
  kv_.set_length(kv_.length() + prefill_n_);
  prefill_n_ = 0;
  st_.observe_seconds += observe_seconds;
  return prompt_left() == 0;
}

void SpeculativeSequence::choose_first_token(const Tensor& logits, const Tensor& out) {
  run_.target_sampling.choose(sampler_, logits, out);
}

void SpeculativeSequence::take_first_token(int32_t token, const Tensor& logits) {
  // The prompt is in both caches (its forward and the drafter's observe are queued before any
  // later use of the blocks): offer its full blocks to the prefix cache.
  kv_.allocator().cache_prefix(prompt_, kv_.block_table(), kKvBlockSize);
  std::vector<float> row;
  if (wants_logits()) row = run_.target.backend().to_host_f32(logits);
  done_ = out_.commit(token, row);
}

Status SpeculativeSequence::prefill(int64_t max_tokens) {
  BS_ASSIGN_OR_RETURN(const ForwardRequest req, prefill_request(max_tokens));
  ForwardResult res;
  BS_RETURN_IF_ERROR(run_.target.forward(req, run_.target_kv, &res));
  const auto t = Clock::now();
  const ObserveRequest observe = prefill_observe(res.taps);
  BS_RETURN_IF_ERROR(
      run_.drafter.observe(run_.draft_kv, observe.block_table, observe.taps, observe.start_pos));
  const bool last = prefilled(seconds_since(t));
  // The read-back of the first token waits for the forward and the observe; a chunk
  // without logits waits for them too, so that the prefill's time is its own.
  Backend& backend = run_.target.backend();
  if (!last) {
    backend.synchronize();
    return Status::Ok();
  }
  const Tensor out = run_.first_tokens.rows(0, 1);
  std::vector<sampling::LogitRules> rules;
  add_logit_rules(0, 1, &rules);
  choose_first_token(logits_to_choose_from(backend, res.logits, Tensor(), rules), out);
  int32_t token = 0;
  backend.copy_to_host(&token, out);
  take_first_token(token, res.logits);
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
  step_ = StepRecord{.anchor_pos = s_, .anchor = anchor_};
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

Status SpeculativeSequence::commit(const Tensor& taps, std::span<const int32_t> result,
                                   const Tensor& verify_logits) {
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
  return commit_step(acc, taps, logits);
}

Status SpeculativeSequence::commit_step(const AcceptResult& acc, const Tensor& taps,
                                        std::span<const float> target_logits) {
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
  return Status::Ok();
}

void SpeculativeSequence::record_times(const StepTimes& times) {
  step_.times = times;
  st_.draft_seconds += times.propose;
  st_.verify_seconds += times.verify;
  st_.accept_seconds += times.accept;
  st_.commit_seconds += times.commit;
  st_.observe_seconds += times.observe;
}

std::vector<std::pair<int64_t, double>> measure_verify_time(SpeculativeRun& run) {
  Backend& backend = run.target.backend();
  const int64_t R = rows_per_sequence(run.drafter);
  const int64_t max_rows = run.max_seqs * R;
  {
    const std::vector<int32_t> zeros(static_cast<size_t>(max_rows), 0);
    backend.copy_from_host(run.verify_tokens, zeros.data());
  }
  std::vector<std::unique_ptr<SequenceKv>> kvs;  // the borrowed blocks, returned at the end
  std::vector<std::pair<int64_t, double>> points;
  for (int64_t rows = 1;; rows = std::min(rows * 2, max_rows)) {
    const int64_t n = (rows + R - 1) / R;
    while (static_cast<int64_t>(kvs.size()) < n) {
      auto kv = std::make_unique<SequenceKv>(run.allocator, kKvBlockSize);
      if (!kv->reserve(R).ok()) return points;  // the pool is busy: the points so far
      kvs.push_back(std::move(kv));
    }
    run.reqs.clear();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = std::min(R, rows - i * R);
      run.reqs.push_back({.start_pos = 0,
                          .block_table = kvs[static_cast<size_t>(i)]->block_table(),
                          .num_logits = len,
                          .tap_layers = run.drafter.target_layers(),
                          .device_tokens = run.verify_tokens.rows(i * R, len)});
    }
    double best = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first run untimed
      const auto t = Clock::now();
      if (!run.target.forward_batch(run.reqs, run.target_kv, &run.res).ok()) return points;
      backend.synchronize();
      if (rep > 0) best = seconds_since(t);
    }
    points.emplace_back(rows, best);
    if (rows == max_rows) return points;
  }
}

namespace {

// Exponential average of the step's time outside the modelled verify.
constexpr double kFixedWeight = 0.1;

}  // namespace

SpeculativeStep::SpeculativeStep(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs,
                                 std::span<SpeculativeSequence* const> prompts,
                                 std::span<const int64_t> prompt_tokens)
    : run_(run), seqs_(seqs), prompts_(prompts), prompt_tokens_(prompt_tokens) {
  BS_CHECK(!seqs.empty() && static_cast<int64_t>(seqs.size()) <= run.max_seqs);
  BS_CHECK(prompts.size() == prompt_tokens.size() &&
           static_cast<int64_t>(prompts.size()) <= run.max_seqs);
  for (SpeculativeSequence* seq : seqs) any_greedy_ |= seq->greedy();
}

Status SpeculativeStep::draft(std::vector<std::vector<float>>* survival) {
  survival->assign(seqs_.size(), {});
  std::vector<size_t> wanting;  // indices into seqs_
  std::vector<ProposeRequest> reqs;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i]->drafts_wanted() == 0) continue;
    wanting.push_back(i);
    reqs.push_back(seqs_[i]->propose_request());
  }
  if (wanting.empty()) return Status::Ok();
  Drafter& drafter = run_.drafter;
  if (drafter.draws_drafts()) {
    // The drafter draws (DSpark's Markov chain, DFlash2's selector walk): one call for all, the
    // drafts land in run.verify_tokens; the survivals (one read-back of the propose) when a
    // confidence cut or the verify budget will read them.
    std::vector<DraftDraw> draws;
    bool confidence = false;
    for (const size_t i : wanting) {
      draws.push_back(seqs_[i]->draft_draw());
      confidence |= seqs_[i]->wants_confidence() ||
                    (seqs_[i]->in_verify_budget() && drafter.has_confidence());
    }
    std::vector<std::vector<float>> a;
    BS_RETURN_IF_ERROR(drafter.propose_draw(run_.draft_kv, reqs, draws, confidence ? &a : nullptr));
    for (size_t r = 0; r < wanting.size() && confidence; ++r) {
      (*survival)[wanting[r]] = std::move(a[r]);
    }
    return Status::Ok();
  }
  if (run_.batched_propose && wanting.size() > 1) {
    Tensor logits;
    const Status st = drafter.propose_batch(run_.draft_kv, reqs, &logits);
    if (st.ok()) {
      const int64_t nd = logits.dim(0) / static_cast<int64_t>(wanting.size());
      for (size_t r = 0; r < wanting.size(); ++r) {
        seqs_[wanting[r]]->take_drafts(logits.rows(static_cast<int64_t>(r) * nd, nd));
      }
      return Status::Ok();
    }
    if (st.code() != StatusCode::kUnimplemented) return st;
    run_.batched_propose = false;
  }
  // One propose each, each sequence taking its drafts before the next propose reuses the
  // drafter's scratch.
  for (size_t r = 0; r < wanting.size(); ++r) {
    Tensor logits;
    BS_RETURN_IF_ERROR(drafter.propose(run_.draft_kv, reqs[r], &logits));
    seqs_[wanting[r]]->take_drafts(logits);
  }
  return Status::Ok();
}

void SpeculativeStep::choose_lengths(const std::vector<std::vector<float>>& survival) {
  bool any_budget = false;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    SpeculativeSequence& seq = *seqs_[i];
    if (seq.wants_confidence() && !survival[i].empty()) seq.cut_drafts(survival[i]);
    any_budget |= seq.in_verify_budget();
  }
  // The rule runs once the model has both parts (a given model has them from the start).
  if (!any_budget || run_.step_time.empty() || (!run_.step_time_given && run_.fixed_samples == 0)) {
    return;
  }
  std::vector<VerifyCandidates> candidates;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const SpeculativeSequence& seq = *seqs_[i];
    candidates.push_back(
        {.drafts = seq.drafts_wanted(), .survival = survival[i], .fixed = !seq.in_verify_budget()});
  }
  const std::vector<int64_t> lengths = admit_drafts(candidates, run_.step_time);
  for (size_t i = 0; i < seqs_.size(); ++i) seqs_[i]->keep_drafts(lengths[i]);
}

Status SpeculativeStep::propose() {
  Backend& backend = run_.target.backend();
  const int64_t num_seqs = static_cast<int64_t>(seqs_.size());
  // The verify budget's model: measured once, at the first step of a sequence that takes part
  // (outside the phase's time, which feeds the model's fixed part).
  if (!run_.step_time_given && run_.step_time.empty() &&
      std::any_of(seqs_.begin(), seqs_.end(),
                  [](const SpeculativeSequence* s) { return s->in_verify_budget(); })) {
    auto points = measure_verify_time(run_);
    if (!points.empty()) run_.step_time = StepTimeModel(std::move(points), 0);
  }
  const auto t = Clock::now();

  // Block i of the step is rows [offsets[i], offsets[i + 1]) of run.verify_tokens and of the
  // verify forward (its logit rows too). The anchors go up first; the drafts are chosen in next
  // to them on the device.
  std::vector<int32_t>& offsets = run_.offsets_host;
  offsets.assign(1, 0);
  for (SpeculativeSequence* seq : seqs_) {
    offsets.push_back(offsets.back() + static_cast<int32_t>(seq->verify_rows()));
  }
  rows_ = offsets.back();
  run_.tokens_host.assign(static_cast<size_t>(rows_), 0);
  for (int64_t i = 0; i < num_seqs; ++i) {
    run_.tokens_host[static_cast<size_t>(offsets[i])] = seqs_[i]->anchor();
    seqs_[i]->set_verify_row(offsets[i]);
  }
  backend.copy_from_host(run_.verify_tokens.rows(0, rows_), run_.tokens_host.data());
  std::vector<std::vector<float>> survival;
  BS_RETURN_IF_ERROR(draft(&survival));
  choose_lengths(survival);
  // Cuts shrank some blocks: close the gaps (through run.target_ids, free until the verify) so
  // that the blocks lie back to back again.
  bool moved = false;
  for (int64_t i = 0; i < num_seqs; ++i) {
    moved |= offsets[i] + seqs_[i]->verify_rows() != offsets[i + 1];
  }
  if (moved) {
    backend.copy(run_.target_ids.rows(0, rows_), run_.verify_tokens.rows(0, rows_));
    int32_t row = 0;
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int64_t n = seqs_[i]->verify_rows();
      backend.copy(run_.verify_tokens.rows(row, n), run_.target_ids.rows(offsets[i], n));
      seqs_[i]->move_block(row);
      offsets[i] = row;
      row += static_cast<int32_t>(n);
    }
    offsets[num_seqs] = row;
    rows_ = row;
  }
  if (any_greedy_) backend.copy_from_host(run_.offsets.rows(0, num_seqs + 1), offsets.data());
  times_.propose = seconds_since(t);
  return Status::Ok();
}

Status SpeculativeStep::verify() {
  const auto t = Clock::now();
  run_.reqs.clear();
  for (SpeculativeSequence* seq : seqs_) run_.reqs.push_back(seq->verify_request());
  first_rows_.clear();
  int64_t firsts = 0;
  for (size_t j = 0; j < prompts_.size(); ++j) {
    BS_ASSIGN_OR_RETURN(const ForwardRequest req, prompts_[j]->prefill_request(prompt_tokens_[j]));
    run_.reqs.push_back(req);
    first_rows_.push_back(req.num_logits > 0 ? firsts++ : -1);
  }
  BS_RETURN_IF_ERROR(run_.target.forward_batch(run_.reqs, run_.target_kv, &run_.res));
  times_.verify = seconds_since(t);
  return Status::Ok();
}

Status SpeculativeStep::accept() {
  const auto t = Clock::now();
  Backend& backend = run_.target.backend();
  const int64_t num_seqs = static_cast<int64_t>(seqs_.size());
  const std::vector<int32_t>& offsets = run_.offsets_host;
  const Tensor logits = run_.res.logits.rows(0, rows_);  // [rows, vocab]: the blocks'
  const Tensor result = run_.accepted.rows(0, num_seqs);
  const int64_t width = result.dim(1);
  // Every block's [a, next, drafts] into its row of `result`: one greedy_accept for all (rows of
  // sampled blocks are then overwritten), a rejection sampling per sampled block.
  std::vector<sampling::LogitRules> rules;
  for (int64_t i = 0; i < num_seqs; ++i) {
    seqs_[i]->add_logit_rules(offsets[i], seqs_[i]->verify_rows(), &rules);
  }
  const Tensor choice =
      logits_to_choose_from(backend, logits, run_.verify_tokens.rows(0, rows_), rules);
  if (any_greedy_) {
    const Tensor target_ids = run_.target_ids.rows(0, rows_);
    backend.argmax(target_ids, choice);
    backend.greedy_accept(result, run_.verify_tokens.rows(0, rows_), target_ids,
                          run_.offsets.rows(0, num_seqs + 1));
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    SpeculativeSequence& seq = *seqs_[i];
    if (seq.greedy()) continue;
    seq.accept_on_device(choice.rows(offsets[i], seq.verify_rows()),
                         result.rows(i, 1).view({width}).rows(0, seq.verify_rows() + 1));
  }
  // The step's one read-back (a mixed step's first tokens have their own).
  run_.accepted_host.resize(static_cast<size_t>(result.numel()));
  backend.copy_to_host(run_.accepted_host.data(), result);
  if (!prompts_.empty()) read_first_tokens();
  times_.accept = seconds_since(t);
  return Status::Ok();
}

void SpeculativeStep::read_first_tokens() {
  // The completed prompts' logits rows come after the blocks': one argmax for all (the sampled
  // rows' draws then overwrite theirs), one read-back.
  Backend& backend = run_.target.backend();
  const int64_t firsts = run_.res.logits.dim(0) - rows_;
  first_tokens_.assign(static_cast<size_t>(firsts), 0);
  if (firsts == 0) return;
  const Tensor first_logits = run_.res.logits.rows(rows_, firsts);
  const Tensor first_ids = run_.first_tokens.rows(0, firsts);
  bool any_greedy = false;
  std::vector<sampling::LogitRules> rules;
  for (size_t j = 0; j < prompts_.size(); ++j) {
    any_greedy |= first_rows_[j] >= 0 && prompts_[j]->greedy();
    if (first_rows_[j] >= 0) prompts_[j]->add_logit_rules(first_rows_[j], 1, &rules);
  }
  const Tensor choice = logits_to_choose_from(backend, first_logits, Tensor(), rules);
  if (any_greedy) backend.argmax(first_ids, choice);
  for (size_t j = 0; j < prompts_.size(); ++j) {
    const int64_t row = first_rows_[j];
    if (row >= 0 && !prompts_[j]->greedy()) {
      prompts_[j]->choose_first_token(choice.rows(row, 1), first_ids.rows(row, 1));
    }
  }
  backend.copy_to_host(first_tokens_.data(), first_ids);
}

Status SpeculativeStep::commit() {
  const auto t = Clock::now();
  const size_t width = static_cast<size_t>(run_.accepted.dim(1));
  const std::vector<int32_t>& offsets = run_.offsets_host;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    SpeculativeSequence& seq = *seqs_[i];
    BS_RETURN_IF_ERROR(seq.commit(run_.res.seqs[i].taps,
                                  std::span(run_.accepted_host).subspan(i * width, width),
                                  run_.res.logits.rows(offsets[i], seq.verify_rows())));
  }
  times_.commit = seconds_since(t);
  return Status::Ok();
}

Status SpeculativeStep::observe() {
  const auto t = Clock::now();
  std::vector<SpeculativeSequence*> pending;
  std::vector<ObserveRequest> reqs;
  for (SpeculativeSequence* seq : seqs_) {
    if (!seq->pending_observe()) continue;
    pending.push_back(seq);
    reqs.push_back(*seq->pending_observe());
  }
  const size_t num_seqs = seqs_.size();
  for (size_t j = 0; j < prompts_.size(); ++j) {  // a mixed step's prompt rows
    reqs.push_back(prompts_[j]->prefill_observe(run_.res.seqs[num_seqs + j].taps));
  }
  // Launched without waiting for it: the next step's read-back does.
  if (!reqs.empty()) BS_RETURN_IF_ERROR(run_.drafter.observe_batch(run_.draft_kv, reqs));
  for (SpeculativeSequence* seq : pending) seq->observed();
  times_.observe = seconds_since(t);
  for (size_t j = 0; j < prompts_.size(); ++j) {
    const bool last = prompts_[j]->prefilled(times_.observe);
    const int64_t row = first_rows_[j];
    BS_CHECK(last == (row >= 0));
    if (last) {
      prompts_[j]->take_first_token(first_tokens_[static_cast<size_t>(row)],
                                    run_.res.logits.rows(rows_ + row, 1));
    }
  }
  return Status::Ok();
}

Status SpeculativeStep::run() {
  BS_RETURN_IF_ERROR(propose());
  BS_RETURN_IF_ERROR(verify());
  BS_RETURN_IF_ERROR(accept());
  BS_RETURN_IF_ERROR(commit());
  BS_RETURN_IF_ERROR(observe());
  for (SpeculativeSequence* seq : seqs_) seq->record_times(times_);
  // The model's fixed part: the step's time outside the modelled verify (not from a mixed step,
  // whose verify forward also fed prompt rows).
  if (!run_.step_time_given && !run_.step_time.empty() && prompts_.empty()) {
    const double fixed = times_.total() - run_.step_time.verify_seconds(rows_);
    const double w = run_.fixed_samples == 0 ? 1.0 : kFixedWeight;
    run_.step_time.set_fixed_seconds((1 - w) * run_.step_time.fixed_seconds() + w * fixed);
    ++run_.fixed_samples;
  }
  return Status::Ok();
}

Status speculative_step(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs) {
  return SpeculativeStep(run, seqs).run();
}

Status prefill_batch(SpeculativeRun& run, std::span<SpeculativeSequence* const> seqs) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  BS_CHECK(n >= 1 && n <= run.max_seqs);
  run.reqs.clear();
  for (SpeculativeSequence* seq : seqs) {
    BS_ASSIGN_OR_RETURN(const ForwardRequest req, seq->prefill_request(0));
    run.reqs.push_back(req);
  }
  BS_RETURN_IF_ERROR(run.target.forward_batch(run.reqs, run.target_kv, &run.res));
  const auto t = Clock::now();
  std::vector<ObserveRequest> observes;
  observes.reserve(seqs.size());
  for (int64_t i = 0; i < n; ++i) {
    observes.push_back(seqs[i]->prefill_observe(run.res.seqs[static_cast<size_t>(i)].taps));
  }
  BS_RETURN_IF_ERROR(run.drafter.observe_batch(run.draft_kv, observes));
  const double observe_seconds = seconds_since(t);
  // Every prompt's first token from its logits row (logits [n, vocab]): one argmax for all (the
  // sampled rows' draws then overwrite theirs), one read-back.
  Backend& backend = run.target.backend();
  const Tensor& logits = run.res.logits;
  const Tensor ids = run.first_tokens.rows(0, n);
  std::vector<sampling::LogitRules> rules;
  for (int64_t i = 0; i < n; ++i) seqs[i]->add_logit_rules(i, 1, &rules);
  const Tensor choice = logits_to_choose_from(backend, logits, Tensor(), rules);
  if (std::any_of(seqs.begin(), seqs.end(), [](const auto* s) { return s->greedy(); })) {
    backend.argmax(ids, choice);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!seqs[i]->greedy()) seqs[i]->choose_first_token(choice.rows(i, 1), ids.rows(i, 1));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  backend.copy_to_host(tokens.data(), ids);
  for (int64_t i = 0; i < n; ++i) {
    BS_CHECK(seqs[i]->prefilled(observe_seconds));
    seqs[i]->take_first_token(tokens[static_cast<size_t>(i)], logits.rows(i, 1));
  }
  return Status::Ok();
}

}  // namespace bs::detail
