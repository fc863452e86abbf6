#include "engine/generate.h"

#include <chrono>

#include "engine/kv_cache.h"

namespace bs {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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

Result<std::vector<int32_t>> generate_plain(CausalLM& target, std::span<const int32_t> prompt,
                                            const GenerateOptions& options,
                                            const TokenCallback& on_token, GenerateStats* stats) {
  BS_RETURN_IF_ERROR(options.sampling.validate());
  const int64_t max_context =
      options.max_context > 0 ? options.max_context : target.config().max_position_embeddings;
  BS_RETURN_IF_ERROR(validate_prompt(target, prompt, max_context));
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  st = GenerateStats{};
  st.prompt_tokens = static_cast<int64_t>(prompt.size());

  const int64_t num_blocks = (max_context + kKvBlockSize - 1) / kKvBlockSize;
  KvPool pool = target.make_kv_pool(num_blocks);
  BlockAllocator allocator(num_blocks);
  SequenceKv seq(allocator, kKvBlockSize);
  Sampler sampler(options.sampling);
  Backend& backend = target.backend();

  std::vector<int32_t> out;
  std::vector<float> logits;
  const Tensor argmax_id = backend.empty({1}, DType::kI32);  // greedy: argmax on the device
  auto t0 = std::chrono::steady_clock::now();
  // Prefill: the whole prompt, logits of the last row only.
  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  st.finish = FinishReason::kLength;
  while (static_cast<int64_t>(out.size()) < options.max_tokens) {
    const int64_t start = seq.length();
    const int64_t n = static_cast<int64_t>(step_tokens.size());
    if (start + n > max_context) {
      st.finish = FinishReason::kContext;
      break;
    }
    BS_RETURN_IF_ERROR(seq.reserve(start + n));
    ForwardRequest req{.tokens = step_tokens,
                       .start_pos = start,
                       .block_table = seq.block_table(),
                       .num_logits = 1,
                       .tap_layers = {}};
    ForwardResult res;
    BS_RETURN_IF_ERROR(target.forward(req, pool, &res));
    seq.set_length(start + n);
    int32_t token = 0;
    if (options.sampling.greedy()) {
      backend.argmax(argmax_id, res.logits);
      backend.copy_to_host(&token, argmax_id);
    } else {
      logits = backend.to_host_f32(res.logits);
      token = sampler.sample(logits);
    }
    if (start == 0) {
      st.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    out.push_back(token);
    const bool stop = std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
                      options.stop_ids.end();
    if (on_token && !on_token(token)) {
      st.finish = FinishReason::kCancelled;
      break;
    }
    if (stop) {
      st.finish = FinishReason::kStop;
      break;
    }
    step_tokens.assign(1, token);
  }
  st.decode_seconds = seconds_since(t0);
  st.generated_tokens = static_cast<int64_t>(out.size());
  return out;
}

}  // namespace bs
