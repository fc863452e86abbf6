// Targets against goldens made by Hugging Face transformers (tools/goldens/make_target_goldens.py,
// fp32 eager): prefill logits and hidden states, token-by-token decode from the cache, and a
// multi-row chunk against the cache (the verify shape of speculative decoding).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> ints(const io::Checkpoint& g, const std::string& name) {
  const auto f = test_util::golden_floats(g, name);
  return std::vector<int32_t>(f.begin(), f.end());
}

// Max |a-b| / (1 + |b|) over a row range.
double max_rel_err(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i)
    e = std::max(e, std::abs(double(a[i]) - b[i]) / (1 + std::abs(b[i])));
  return e;
}

class TargetGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TargetGolden, MatchesTransformers) {
  const std::string dir = std::string(BS_TEST_DATA) + "/" + GetParam();
  ASSERT_TRUE(fs::exists(dir + "/golden.safetensors")) << dir;
  auto golden = io::Checkpoint::open_file(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  auto backend = make_cpu_backend(2);
  auto model = load_target(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  CausalLM& m = **model;
  const auto& c = m.config();
  const int64_t V = c.vocab_size, H = c.hidden_size, L = c.num_layers;

  const auto prompt = ints(*golden, "prompt_ids");
  const auto ref_logits = test_util::golden_floats(*golden, "prefill_logits");
  const auto ref_hidden = test_util::golden_floats(*golden, "prefill_hidden");  // [L+1, P, H]
  const int64_t P = static_cast<int64_t>(prompt.size());
  KvPool pool = m.make_kv_pool(32);
  BlockAllocator alloc(32);
  SequenceKv seq(alloc, kKvBlockSize);
  ASSERT_TRUE(seq.reserve(P + 16).ok());

  std::vector<int> taps(L - 1);  // hidden_states[L] is post-norm in transformers
  std::iota(taps.begin(), taps.end(), 0);
  ForwardResult res;
  ASSERT_TRUE(m.forward({.tokens = prompt,
                         .start_pos = 0,
                         .block_table = seq.block_table(),
                         .num_logits = P,
                         .tap_layers = taps},
                        pool, &res)
                  .ok());
  const auto logits = backend->to_host_f32(res.logits);
  EXPECT_LT(max_rel_err(logits.data(), ref_logits.data(), P * V), 1e-4);
  const auto tapped = backend->to_host_f32(res.taps);  // [P, (L-1)*H]
  for (int64_t l = 0; l + 1 < L; ++l) {
    for (int64_t p = 0; p < P; ++p) {
      ASSERT_LT(max_rel_err(&tapped[(p * (L - 1) + l) * H], &ref_hidden[((l + 1) * P + p) * H], H),
                1e-4)
          << "layer " << l << " position " << p;
    }
  }
  seq.set_length(P);

  // Decode one token at a time from the cache.
  const auto decode_ids = ints(*golden, "decode_ids");
  const auto decode_logits = test_util::golden_floats(*golden, "decode_logits");
  for (size_t i = 0; i < decode_ids.size(); ++i) {
    const int32_t tok = decode_ids[i];
    // Step i feeds the argmax of the previous logits.
    const int64_t start = P + static_cast<int64_t>(i);
    ASSERT_TRUE(m.forward({.tokens = {&tok, 1},
                           .start_pos = start,
                           .block_table = seq.block_table(),
                           .num_logits = 1},
                          pool, &res)
                    .ok());
    const auto step = backend->to_host_f32(res.logits);
    EXPECT_LT(max_rel_err(step.data(), &decode_logits[i * V], V), 1e-4) << "decode step " << i;
    seq.set_length(start + 1);
  }

  // A 5-token chunk right after the prompt (roll back the decoded tokens first).
  seq.truncate(P);
  const auto chunk = ints(*golden, "chunk_ids");
  const auto chunk_logits = test_util::golden_floats(*golden, "chunk_logits");
  const int64_t n = static_cast<int64_t>(chunk.size());
  ASSERT_TRUE(
      m.forward(
           {.tokens = chunk, .start_pos = P, .block_table = seq.block_table(), .num_logits = n},
           pool, &res)
          .ok());
  const auto chunk_out = backend->to_host_f32(res.logits);
  EXPECT_LT(max_rel_err(chunk_out.data(), chunk_logits.data(), n * V), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TargetGolden,
                         ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-qwen3-yarn",
                                           "tiny-qwen2"));

// The real stories260K checkpoint: greedy ids and logits from transformers.
TEST(Stories260K, GreedyMatchesTransformers) {
  const std::string golden_path =
      std::string(BS_TEST_DATA) + "/stories260K-golden/golden.safetensors";
  ASSERT_TRUE(fs::exists(golden_path));
  auto golden = io::Checkpoint::open_file(golden_path);
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  auto backend = make_cpu_backend(2);
  auto model = load_target(std::string(BS_SOURCE_DIR) + "/models/stories260K", *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  // prompt_ids_k -> ids_k: BOS only, "Once upon a time", "The little dog".
  for (int k = 0; k < 3; ++k) {
    const auto prompt = ints(*golden, "prompt_ids_" + std::to_string(k));
    const auto ref = ints(*golden, "ids_" + std::to_string(k));
    GenerateOptions opt;
    opt.max_tokens = static_cast<int64_t>(ref.size());
    auto out = generate_plain(**model, prompt, opt, nullptr, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, ref) << "prompt " << k;
  }
  // Logits of the first 40 positions in one prefill.
  // Input [BOS, ids[0..38]]: row i predicts ids[i].
  const auto ref_logits = test_util::golden_floats(*golden, "logits");
  const int64_t n = static_cast<int64_t>(ref_logits.size()) / 512;
  std::vector<int32_t> input{1};
  const auto ids = ints(*golden, "ids");
  input.insert(input.end(), ids.begin(), ids.begin() + n - 1);
  KvPool pool = (*model)->make_kv_pool(8);
  BlockAllocator alloc(8);
  SequenceKv seq(alloc, kKvBlockSize);
  ASSERT_TRUE(seq.reserve(n).ok());
  ForwardResult res;
  ASSERT_TRUE(
      (*model)
          ->forward(
              {.tokens = input, .start_pos = 0, .block_table = seq.block_table(), .num_logits = n},
              pool, &res)
          .ok());
  const auto logits = backend->to_host_f32(res.logits);
  EXPECT_LT(max_rel_err(logits.data(), ref_logits.data(), n * 512), 1e-4);
}

}  // namespace
}  // namespace bs
