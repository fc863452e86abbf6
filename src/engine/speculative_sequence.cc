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

SpeculativeRun::SpeculativeRun(CausalLM& target, Drafter& drafter, int64_t num_blocks)
    : target(target),
      drafter(drafter),
      target_kv(target.make_kv_pool(num_blocks)),
      draft_kv(drafter.make_kv_pool(num_blocks)),
      allocator(num_blocks),
      argmax_ids(target.backend().empty({std::max(drafter.block_size(), drafter.max_drafts()) + 1},
                                        DType::kI32)) {}

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
      out_(options, on_token, on_logprobs, stats) {}

Status SpeculativeSequence::observe(const Tensor& taps, int64_t start) {
  const auto t = Clock::now();
  BS_RETURN_IF_ERROR(run_.drafter.observe(run_.draft_kv, kv_.block_table(), taps, start));
  run_.target.backend().synchronize();
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
  std::vector<float> logits;
  if (last) logits = run_.target.backend().to_host_f32(res.logits);
  BS_RETURN_IF_ERROR(observe(res.taps, start));
  if (last) done_ = out_.commit(sampler_.sample(logits), logits);
  return Status::Ok();
}

Result<bool> SpeculativeSequence::begin_step(bool propose) {
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
  const int32_t anchor = out_.back();
  const int64_t B = run_.drafter.block_size();
  BS_RETURN_IF_ERROR(kv_.reserve(s_ + std::max(B, k_ + 1)));

  verify_tokens_.assign(1, anchor);
  q_.clear();
  step_ = SpeculativeStep{.anchor_pos = s_, .anchor = anchor};
  if (propose && k_ > 0) {
    const auto t = Clock::now();
    Tensor dl;
    BS_RETURN_IF_ERROR(run_.drafter.propose(run_.draft_kv, propose_request(), &dl));
    take_drafts(dl, 0.0);
    step_.draft_seconds = seconds_since(t);
  }
  return true;
}

ProposeRequest SpeculativeSequence::propose_request() const {
  return {.anchor = verify_tokens_[0],
          .anchor_pos = s_,
          .block_table = kv_.block_table(),
          .num_drafts = k_,
          .noise_seed = options_.sampling.seed.value_or(0)};
}

void SpeculativeSequence::take_drafts(const Tensor& draft_logits, double draft_seconds) {
  Backend& backend = run_.target.backend();
  if (options_.sampling.greedy()) {
    std::vector<int32_t> drafts;
    device_argmax(backend, run_.argmax_ids, draft_logits.rows(0, k_), &drafts);
    verify_tokens_.insert(verify_tokens_.end(), drafts.begin(), drafts.end());
  } else {
    const int64_t vocab = run_.target.config().vocab_size;
    draft_logits_ = backend.to_host_f32(draft_logits.rows(0, k_));
    std::vector<float> row_q;
    for (int64_t i = 0; i < k_; ++i) {
      const std::span<const float> row(draft_logits_.data() + i * vocab,
                                       static_cast<size_t>(vocab));
      sampler_.probs(row, &row_q);
      verify_tokens_.push_back(sampler_.sample_from(row_q));
      q_.insert(q_.end(), row_q.begin(), row_q.end());
    }
  }
  step_.drafts = std::span<const int32_t>(verify_tokens_).subspan(1);
  step_.draft_seconds = draft_seconds;
}

ForwardRequest SpeculativeSequence::verify_request() const {
  return {.tokens = verify_tokens_,
          .start_pos = s_,
          .block_table = kv_.block_table(),
          .num_logits = k_ + 1,
          .tap_layers = run_.drafter.target_layers()};
}

Status SpeculativeSequence::accept(const Tensor& taps, std::span<const int32_t> target_argmax,
                                   std::span<const float> target_logits, bool observe_now) {
  kv_.set_length(s_ + k_ + 1);
  const std::span<const int32_t> drafts = step_.drafts;
  AcceptResult acc;
  if (options_.sampling.greedy()) {
    acc = accept_greedy(drafts, target_argmax);
  } else {
    const int64_t vocab = run_.target.config().vocab_size;
    p_.resize(static_cast<size_t>((k_ + 1) * vocab));
    std::vector<float> row_p;
    for (int64_t i = 0; i <= k_; ++i) {
      sampler_.probs(
          target_logits.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab)),
          &row_p);
      std::copy(row_p.begin(), row_p.end(), p_.begin() + i * vocab);
    }
    acc = accept_sampled(drafts, q_, p_, vocab, sampler_);
  }
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
  const double observe_before = st_.observe_seconds;
  pending_observe_.reset();
  if (!done_) {
    if (observe_now) {
      BS_RETURN_IF_ERROR(observe(taps.rows(0, a + 1), s_));
    } else {
      pending_observe_ = ObserveRequest{
          .block_table = kv_.block_table(), .taps = taps.rows(0, a + 1), .start_pos = s_};
    }
  }
  step_.accepted = a;
  step_.next = acc.next;
  step_.observe_seconds = st_.observe_seconds - observe_before;
  st_.draft_seconds += step_.draft_seconds;
  return Status::Ok();
}

}  // namespace bs::detail
