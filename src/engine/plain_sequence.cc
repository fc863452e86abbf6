#include "engine/plain_sequence.h"

#include <algorithm>

#include "core/check.h"

namespace bs::detail {

PlainSequence::PlainSequence(BlockAllocator& allocator, const GenerateOptions& options,
                             int64_t max_context, std::span<const int32_t> prompt,
                             const TokenCallback& on_token, const LogprobsCallback& on_logprobs,
                             GenerateStats& stats)
    : options_(options),
      max_context_(max_context),
      st_(stats),
      kv_(allocator, kKvBlockSize),
      sampler_(options.sampling),
      out_(options, on_token, on_logprobs, stats),
      step_tokens_(prompt.begin(), prompt.end()),
      rules_(options, prompt) {
  if (!allocator.prefix_caching()) return;
  // The prompt's head from the prefix cache (at least its last token is computed: its logits
  // choose the first token); the rest prefills as usual.
  prompt_.assign(prompt.begin(), prompt.end());
  const int64_t n = take_cached_prefix(kv_, prompt);
  step_tokens_.erase(step_tokens_.begin(), step_tokens_.begin() + n);
  // (A resumed request's prompt ends with its earlier output: only the prompt proper counts.)
  st_.cached_tokens = std::min(n, std::ssize(prompt) - options.generated_prefix);
}

Result<bool> PlainSequence::begin_step() {
  if (done_) return false;
  if (out_.size() >= options_.max_tokens) {
    done_ = true;  // finish stays kLength
    return false;
  }
  const int64_t end = kv_.length() + static_cast<int64_t>(step_tokens_.size());
  if (end > max_context_) {
    st_.finish = FinishReason::kContext;
    done_ = true;
    return false;
  }
  BS_RETURN_IF_ERROR(kv_.reserve(end));
  return true;
}

ForwardRequest PlainSequence::request() const {
  return {.tokens = step_tokens_,
          .start_pos = kv_.length(),
          .block_table = kv_.block_table(),
          .num_logits = 1,
          .tap_layers = {}};
}

void PlainSequence::draw(Backend& backend, const Tensor& logits, const Tensor& out) {
  BS_CHECK(!greedy() && logits.dim(0) == 1);
  if (!device_) device_ = std::make_unique<DeviceSampling>(backend);
  device_->choose(sampler_, logits, out);
}

void PlainSequence::take(int32_t token, std::span<const float> logits) {
  kv_.set_length(kv_.length() + static_cast<int64_t>(step_tokens_.size()));
  if (out_.size() == 0 && !prompt_.empty()) {  // the prompt is cached: offer its full blocks
    kv_.allocator().cache_prefix(prompt_, kv_.block_table(), kKvBlockSize);
    prompt_ = {};
  }
  if (out_.commit(token, logits)) {
    done_ = true;
  } else {
    step_tokens_.assign(1, token);
  }
}

Status PlainSequence::prefill_chunk(CausalLM& target, KvPool& pool, int64_t n) {
  BS_ASSIGN_OR_RETURN(const ForwardRequest req, begin_chunk(n));
  ForwardResult res;
  BS_RETURN_IF_ERROR(target.forward(req, pool, &res));
  end_chunk(n);
  return Status::Ok();
}

Result<ForwardRequest> PlainSequence::begin_chunk(int64_t n) {
  BS_CHECK(n >= 1 && n < prompt_left());
  const int64_t start = kv_.length();
  BS_RETURN_IF_ERROR(kv_.reserve(start + n));
  return ForwardRequest{.tokens = std::span<const int32_t>(step_tokens_).first(n),
                        .start_pos = start,
                        .block_table = kv_.block_table(),
                        .num_logits = 0,
                        .tap_layers = {}};
}

void PlainSequence::end_chunk(int64_t n) {
  BS_CHECK(n >= 1 && n < prompt_left());
  kv_.set_length(kv_.length() + n);
  step_tokens_.erase(step_tokens_.begin(), step_tokens_.begin() + n);
}

bool PlainSequence::can_run_ahead() const {
  // (Logits processing needs this step's token on the host for the next step's rules.)
  return !done_ && prefilled() && !wants_logits() && !rules_.active() &&
         out_.size() + 1 < options_.max_tokens &&
         kv_.length() + static_cast<int64_t>(step_tokens_.size()) + 1 <= max_context_;
}

Status PlainSequence::reserve_ahead() {
  return kv_.reserve(kv_.length() + static_cast<int64_t>(step_tokens_.size()) + 1);
}

ForwardRequest PlainSequence::ahead_request(const Tensor& token) const {
  return {.tokens = {},
          .start_pos = kv_.length() + static_cast<int64_t>(step_tokens_.size()),
          .block_table = kv_.block_table(),
          .num_logits = 1,
          .tap_layers = {},
          .device_tokens = token};
}

void choose_tokens(Backend& backend, std::span<PlainSequence* const> seqs, const Tensor& logits,
                   const Tensor& ids_scratch) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  BS_CHECK(logits.dim(0) == n);
  const Tensor ids = ids_scratch.rows(0, n);
  std::vector<sampling::LogitRules> rules;
  for (int64_t i = 0; i < n; ++i) seqs[i]->add_logit_rules(i, &rules);
  const Tensor choice = logits_to_choose_from(backend, logits, Tensor(), rules);
  const bool any_greedy =
      std::any_of(seqs.begin(), seqs.end(), [](auto* s) { return s->greedy(); });
  if (any_greedy) backend.argmax(ids, choice);  // the sampled rows' draws overwrite theirs
  for (int64_t i = 0; i < n; ++i) {
    if (!seqs[i]->greedy()) seqs[i]->draw(backend, choice.rows(i, 1), ids.rows(i, 1));
  }
}

void take_step(Backend& backend, std::span<PlainSequence* const> seqs, const Tensor& logits,
               const Tensor& ids_scratch) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  choose_tokens(backend, seqs, logits, ids_scratch);
  const Tensor ids = ids_scratch.rows(0, n);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  backend.copy_to_host(tokens.data(), ids);
  std::vector<float> row;
  for (int64_t i = 0; i < n; ++i) {
    row.clear();
    if (seqs[i]->wants_logits()) row = backend.to_host_f32(logits.rows(i, 1));
    seqs[i]->take(tokens[static_cast<size_t>(i)], row);
  }
}

Status plain_step(CausalLM& target, KvPool& pool, const Tensor& ids_scratch, PlainSequence& seq,
                  bool* stepped) {
  BS_ASSIGN_OR_RETURN(*stepped, seq.begin_step());
  if (!*stepped) return Status::Ok();
  ForwardResult res;
  BS_RETURN_IF_ERROR(target.forward(seq.request(), pool, &res));
  PlainSequence* const seqs[] = {&seq};
  take_step(target.backend(), seqs, res.logits, ids_scratch);
  return Status::Ok();
}

}  // namespace bs::detail
