#include "engine/generate.h"

#include <algorithm>

#include "core/check.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"
#include "engine/plain_sequence.h"

namespace bs {
namespace detail {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t context_window(const CausalLM& target, const GenerateOptions& options) {
  return options.max_context > 0 ? options.max_context : target.config().max_position_embeddings;
}

Status begin_generation(const CausalLM& target, std::span<const int32_t> prompt,
                        const GenerateOptions& options, int64_t max_context, GenerateStats& stats) {
  BS_RETURN_IF_ERROR(options.sampling.validate());
  const int64_t max_top = std::min<int64_t>(kMaxTopLogprobs, target.config().vocab_size);
  if (options.logprobs < -1 || options.logprobs > max_top) {
    return InvalidArgument("logprobs must be -1 (off) or in [0, {}], got {}", max_top,
                           options.logprobs);
  }
  BS_RETURN_IF_ERROR(validate_prompt(target, prompt, max_context));
  for (const auto& entry : options.sampling.logit_bias) {
    if (entry.first >= target.config().vocab_size) {
      return InvalidArgument("logit_bias token id {} out of range [0, {})", entry.first,
                             target.config().vocab_size);
    }
  }
  if (options.generated_prefix < 0 ||
      options.generated_prefix >= static_cast<int64_t>(prompt.size())) {
    return InvalidArgument("generated_prefix {} must be in [0, prompt length {})",
                           options.generated_prefix, prompt.size());
  }
  stats = GenerateStats{};
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.finish = FinishReason::kLength;
  return Status::Ok();
}

bool CommittedTokens::commit(int32_t token, std::span<const float> logits) {
  tokens_.push_back(token);
  if (options_.logprobs >= 0) {
    BS_CHECK(!logits.empty());
    token_logprobs(logits, token, options_.logprobs, &logprobs_);
    if (on_logprobs_) on_logprobs_(logprobs_);
  }
  const bool stop = std::find(options_.stop_ids.begin(), options_.stop_ids.end(), token) !=
                    options_.stop_ids.end();
  if (on_token_ && !on_token_(token)) {
    stats_.finish = FinishReason::kCancelled;
    return true;
  }
  if (stop) {
    stats_.finish = FinishReason::kStop;
    return true;
  }
  return false;
}

std::vector<int32_t> CommittedTokens::finish() {
  stats_.generated_tokens = static_cast<int64_t>(tokens_.size());
  return std::move(tokens_);
}

}  // namespace detail

using detail::Clock;
using detail::seconds_since;

Status validate_prompt(const CausalLM& target, std::span<const int32_t> prompt,
                       int64_t max_context) {
  const auto& c = target.config();
  if (prompt.empty()) return InvalidArgument("prompt is empty (it needs at least a BOS token)");
  if (static_cast<int64_t>(prompt.size()) >= max_context) {
    return InvalidArgument("prompt too long: {} tokens, the context window is {} tokens",
                           prompt.size(), max_context);
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgument("prompt token id {} out of range [0, {})", t, c.vocab_size);
    }
  }
  return Status::Ok();
}

namespace {

// generate_plain without the conversion of an allocation failure.
Result<std::vector<int32_t>> run_plain(CausalLM& target, std::span<const int32_t> prompt,
                                       const GenerateOptions& options,
                                       const TokenCallback& on_token, GenerateStats* stats,
                                       const LogprobsCallback& on_logprobs) {
  const int64_t max_context = detail::context_window(target, options);
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  BS_RETURN_IF_ERROR(detail::begin_generation(target, prompt, options, max_context, st));

  const int64_t num_blocks = (max_context + kKvBlockSize - 1) / kKvBlockSize;
  KvPool pool = target.make_kv_pool(num_blocks);
  BlockAllocator allocator(num_blocks);
  detail::PlainSequence seq(allocator, options, max_context, prompt, on_token, on_logprobs, st);
  const Tensor token = target.backend().empty({1}, DType::kI32);  // chosen on the device
  auto t0 = Clock::now();
  // The prefill: the prompt's head in chunks without logits, then the first step feeds the rest
  // (at most one chunk) with logits of its last row only.
  while (options.prefill_chunk > 0 && seq.prompt_left() > options.prefill_chunk) {
    BS_RETURN_IF_ERROR(seq.prefill_chunk(target, pool, options.prefill_chunk));
  }
  for (bool stepped = true; stepped;) {
    const bool prefill = !seq.prefilled();
    BS_RETURN_IF_ERROR(detail::plain_step(target, pool, token, seq, &stepped));
    if (prefill && stepped) {
      st.prefill_seconds = seconds_since(t0);
      t0 = Clock::now();
    }
  }
  st.decode_seconds = seconds_since(t0);
  return seq.finish();
}

}  // namespace

Result<std::vector<int32_t>> generate_plain(CausalLM& target, std::span<const int32_t> prompt,
                                            const GenerateOptions& options,
                                            const TokenCallback& on_token, GenerateStats* stats,
                                            const LogprobsCallback& on_logprobs) {
  return catch_allocation_failure([&]() -> Result<std::vector<int32_t>> {
    return run_plain(target, prompt, options, on_token, stats, on_logprobs);
  });
}

}  // namespace bs
