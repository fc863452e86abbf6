// Batched plain decoding: several sequences step together through one target forward per step.
#include <memory>

#include "engine/generate.h"
#include "engine/generation_common.h"
#include "engine/kv_cache.h"

namespace bs {

using detail::Clock;
using detail::seconds_since;

namespace {

const TokenCallback kNoCallback;  // batched generation reports tokens at the end

// One sequence of the batch: its cache view, sampler and committed tokens.
struct BatchSequence {
  BatchSequence(BlockAllocator& allocator, const GenerateOptions& options, GenerateStats& stats)
      : kv(allocator, kKvBlockSize), sampler(options.sampling), out(options, kNoCallback, stats) {}
  SequenceKv kv;
  Sampler sampler;
  detail::CommittedTokens out;
  std::vector<int32_t> step_tokens;  // tokens the next forward feeds (the prompt, then 1)
  bool done = false;
};

}  // namespace

Result<std::vector<std::vector<int32_t>>> generate_plain_batch(
    CausalLM& target, std::span<const std::vector<int32_t>> prompts, const GenerateOptions& options,
    std::vector<GenerateStats>* stats) {
  if (prompts.empty()) return InvalidArgument("generate: no prompts");
  const int64_t max_context = detail::context_window(target, options);
  std::vector<GenerateStats> local;
  std::vector<GenerateStats>& st = stats ? *stats : local;
  st.assign(prompts.size(), GenerateStats{});
  // Blocks for what each sequence can reach: its prompt plus max_tokens, within the window.
  int64_t num_blocks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    BS_RETURN_IF_ERROR(detail::begin_generation(target, prompts[i], options, max_context, st[i])
                           .with_context(fmt::format("prompt {}", i)));
    const int64_t reach = std::min<int64_t>(
        static_cast<int64_t>(prompts[i].size()) + std::max<int64_t>(options.max_tokens, 0),
        max_context);
    num_blocks += (reach + kKvBlockSize - 1) / kKvBlockSize;
  }
  KvPool pool = target.make_kv_pool(num_blocks);
  BlockAllocator allocator(num_blocks);
  std::vector<std::unique_ptr<BatchSequence>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(std::make_unique<BatchSequence>(allocator, options, st[i]));
    seqs.back()->step_tokens = prompts[i];
  }
  Backend& backend = target.backend();
  const bool greedy = options.sampling.greedy();
  const Tensor argmax_ids =
      backend.empty({static_cast<int64_t>(prompts.size())}, DType::kI32);  // greedy, on device
  std::vector<int32_t> next(prompts.size());
  std::vector<ForwardRequest> reqs;
  std::vector<BatchSequence*> active;
  std::vector<float> logits;
  BatchForwardResult res;
  auto t0 = Clock::now();
  double prefill_seconds = 0;
  bool prefill = true;
  while (true) {
    // The sequences that take part in this step: not finished, under max_tokens and the window.
    reqs.clear();
    active.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      BatchSequence* s = seqs[i].get();
      if (s->done) continue;
      const int64_t start = s->kv.length(), n = static_cast<int64_t>(s->step_tokens.size());
      if (s->out.size() >= options.max_tokens) {
        s->done = true;  // finish stays kLength
        continue;
      }
      if (start + n > max_context) {
        s->done = true;
        st[i].finish = FinishReason::kContext;
        continue;
      }
      BS_RETURN_IF_ERROR(s->kv.reserve(start + n));
      reqs.push_back({.tokens = s->step_tokens,
                      .start_pos = start,
                      .block_table = s->kv.block_table(),
                      .num_logits = 1,
                      .tap_layers = {}});
      active.push_back(s);
    }
    if (reqs.empty()) break;
    BS_RETURN_IF_ERROR(target.forward_batch(reqs, pool, &res));
    const int64_t rows = static_cast<int64_t>(reqs.size());
    if (greedy) {
      backend.argmax(argmax_ids.rows(0, rows), res.logits);
      backend.copy_to_host(next.data(), argmax_ids.rows(0, rows));
    } else {
      logits = backend.to_host_f32(res.logits);
    }
    if (prefill) {
      prefill_seconds = seconds_since(t0);
      t0 = Clock::now();
      prefill = false;
    }
    const int64_t vocab = target.config().vocab_size;
    for (int64_t r = 0; r < rows; ++r) {
      BatchSequence& s = *active[r];
      s.kv.set_length(reqs[r].start_pos + static_cast<int64_t>(reqs[r].tokens.size()));
      const int32_t token = greedy ? next[r]
                                   : s.sampler.sample(std::span<const float>(
                                         logits.data() + r * vocab, static_cast<size_t>(vocab)));
      if (s.out.commit(token)) {
        s.done = true;
      } else {
        s.step_tokens.assign(1, token);
      }
    }
  }
  std::vector<std::vector<int32_t>> outputs;
  const double decode_seconds = seconds_since(t0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    outputs.push_back(seqs[i]->out.finish());
    st[i].prefill_seconds = prefill_seconds;
    st[i].decode_seconds = decode_seconds;
  }
  return outputs;
}

}  // namespace bs
