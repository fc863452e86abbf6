// A host reference of sampled speculative decoding for one sequence: the loop of
// generate_speculative written out with the model API and the host sampling rules (Sampler over
// logits read back to the host, accept_sampled), in the RNG order of the engine (the k drafts'
// uniforms, then the accept's k + 1). The engine draws and accepts on the device
// (DeviceSampling), where the CPU backend runs the same host functions, so on the CPU the two give
// the same tokens for the same seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "engine/speculative_accept.h"
#include "models/drafter.h"

namespace bs::test_util {

// The tokens generate_speculative gives for `prompt` with `o` (temperature > 0; max_tokens,
// stop_ids, draft_tokens, max_context and the sampling parameters are honoured; no callbacks).
inline std::vector<int32_t> host_speculative(CausalLM& target, Drafter& drafter,
                                             const std::vector<int32_t>& prompt,
                                             const GenerateOptions& o) {
  EXPECT_FALSE(o.sampling.greedy());
  Backend& be = target.backend();
  const int64_t vocab = target.config().vocab_size, B = drafter.block_size();
  const int64_t ctx = o.max_context > 0 ? o.max_context : target.config().max_position_embeddings;
  const int64_t budget = o.draft_tokens > 0 ? o.draft_tokens : drafter.max_drafts();
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t blocks = (std::min(P + o.max_tokens, ctx) + B + kKvBlockSize - 1) / kKvBlockSize;
  KvPool tkv = target.make_kv_pool(blocks), dkv = drafter.make_kv_pool(blocks);
  BlockAllocator allocator(blocks);
  SequenceKv kv(allocator, kKvBlockSize);
  Sampler sampler(o.sampling);
  const std::vector<int>& taps = drafter.target_layers();

  std::vector<int32_t> out;
  const auto commit = [&](int32_t t) {  // true: generation ends with t
    out.push_back(t);
    return std::find(o.stop_ids.begin(), o.stop_ids.end(), t) != o.stop_ids.end();
  };
  EXPECT_TRUE(kv.reserve(P).ok());
  ForwardResult res;
  EXPECT_TRUE(target
                  .forward({.tokens = prompt,
                            .start_pos = 0,
                            .block_table = kv.block_table(),
                            .num_logits = 1,
                            .tap_layers = taps},
                           tkv, &res)
                  .ok());
  kv.set_length(P);
  EXPECT_TRUE(drafter.observe(dkv, kv.block_table(), res.taps, 0).ok());
  bool done = commit(sampler.sample(be.to_host_f32(res.logits)));
  std::vector<float> row, q, p;
  while (!done && static_cast<int64_t>(out.size()) < o.max_tokens) {
    const int64_t s = kv.length();
    if (s + 1 > ctx) break;
    const int64_t k =
        std::min({budget, o.max_tokens - static_cast<int64_t>(out.size()) - 1, ctx - s - 1});
    EXPECT_TRUE(kv.reserve(s + std::max(B, k + 1)).ok());
    std::vector<int32_t> tokens = {out.back()};
    q.clear();
    if (k > 0) {
      Tensor draft_logits;
      EXPECT_TRUE(drafter
                      .propose(dkv,
                               {.anchor = out.back(),
                                .anchor_pos = s,
                                .block_table = kv.block_table(),
                                .num_drafts = k,
                                .noise_seed = o.sampling.seed.value_or(0)},
                               &draft_logits)
                      .ok());
      const std::vector<float> x = be.to_host_f32(draft_logits.rows(0, k));
      for (int64_t i = 0; i < k; ++i) {
        sampler.probs(std::span(x).subspan(static_cast<size_t>(i * vocab), vocab), &row);
        tokens.push_back(sampler.sample_from(row));
        q.insert(q.end(), row.begin(), row.end());
      }
    }
    EXPECT_TRUE(target
                    .forward({.tokens = tokens,
                              .start_pos = s,
                              .block_table = kv.block_table(),
                              .num_logits = k + 1,
                              .tap_layers = taps},
                             tkv, &res)
                    .ok());
    const std::vector<float> x = be.to_host_f32(res.logits);
    p.clear();
    for (int64_t i = 0; i <= k; ++i) {
      sampler.probs(std::span(x).subspan(static_cast<size_t>(i * vocab), vocab), &row);
      p.insert(p.end(), row.begin(), row.end());
    }
    const std::span<const int32_t> drafts = std::span(tokens).subspan(1);
    const AcceptResult acc = accept_sampled(drafts, q, p, vocab, sampler);
    kv.set_length(s + k + 1);
    kv.truncate(s + acc.accepted + 1);
    for (int64_t i = 0; i < acc.accepted && !done; ++i) done = commit(drafts[i]);
    if (!done) done = commit(acc.next);
    if (!done) {
      EXPECT_TRUE(
          drafter.observe(dkv, kv.block_table(), res.taps.rows(0, acc.accepted + 1), s).ok());
    }
  }
  return out;
}

}  // namespace bs::test_util
