#include "engine/prompt_logprobs.h"

#include <algorithm>

#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "models/kv_pool.h"

namespace bs {

namespace {

Result<std::vector<TokenLogprobs>> score_prompt(CausalLM& target, std::span<const int32_t> prompt,
                                                int top_n, int64_t rows_per_forward) {
  const auto P = static_cast<int64_t>(prompt.size());
  const int64_t V = target.config().vocab_size;
  BS_RETURN_IF_ERROR(validate_prompt(target, prompt, target.config().max_position_embeddings));
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return InvalidArgument("top logprobs {} not in [0, {}]", top_n, kMaxTopLogprobs);
  }
  const int64_t rows = std::clamp<int64_t>(rows_per_forward, 1, P);
  const int64_t blocks = (P + kKvBlockSize - 1) / kKvBlockSize;
  Backend& backend = target.backend();
  // The cache, one forward's logits (device and host copies, F32 at most) and its activations
  // (a few rows of hidden-size vectors, small next to the logits).
  const int64_t need = kv_pool_bytes(target.make_kv_pool(1)) * blocks + 2 * rows * V * 4;
  if (const MemoryInfo mem = backend.memory_info(); need > mem.free) {
    return OutOfMemory(
        "prompt logprobs of {} tokens need {:.1f} MiB of {} memory, {:.1f} MiB are free", P,
        static_cast<double>(need) / (1 << 20), backend.name(),
        static_cast<double>(mem.free) / (1 << 20));
  }
  KvPool pool = target.make_kv_pool(blocks);
  BlockAllocator allocator(blocks);
  SequenceKv seq(allocator, kKvBlockSize);
  BS_RETURN_IF_ERROR(seq.reserve(P));
  std::vector<TokenLogprobs> out(static_cast<size_t>(P - 1));
  for (int64_t start = 0; start < P - 1; start += rows) {
    const int64_t n = std::min(rows, P - start);
    ForwardResult res;
    BS_RETURN_IF_ERROR(target.forward({.tokens = prompt.subspan(start, n),
                                       .start_pos = start,
                                       .block_table = seq.block_table(),
                                       .num_logits = n,
                                       .tap_layers = {}},
                                      pool, &res));
    const std::vector<float> logits = backend.to_host_f32(res.logits);  // [n, V]
    for (int64_t i = 0; i < n && start + i + 1 < P; ++i) {
      token_logprobs(std::span<const float>(logits).subspan(i * V, V), prompt[start + i + 1], top_n,
                     &out[start + i]);
    }
    seq.set_length(start + n);
  }
  return out;
}

}  // namespace

Result<std::vector<TokenLogprobs>> prompt_logprobs(CausalLM& target,
                                                   std::span<const int32_t> prompt, int top_n,
                                                   int64_t rows_per_forward) {
  return catch_allocation_failure([&]() -> Result<std::vector<TokenLogprobs>> {
    return score_prompt(target, prompt, top_n, rows_per_forward);
  });
}

}  // namespace bs
