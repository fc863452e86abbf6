// Sliding-window targets (Mistral: every layer; Qwen2: layers >= max_window_layers) against
// goldens from the transformers-free PyTorch reference (tools/reference/target_ref.py, made by
// tools/goldens/make_sliding_window_goldens.py) for a 24-token prompt with a window of 4-5 keys:
// one prefill, then the same prompt through the paged cache in chunks and token by token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "io/safetensors.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

// Max |a-b| / (1 + |b|).
double max_rel_err(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    e = std::max(e, std::abs(double(a[i]) - b[i]) / (1 + std::abs(b[i])));
  }
  return e;
}

class SlidingWindowGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(SlidingWindowGolden, MatchesReferenceInPrefillChunksAndDecode) {
  const std::string dir = std::string(BS_TEST_DATA) + "/" + GetParam();
  auto golden = io::Checkpoint::open_file(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  auto backend = make_cpu_backend(2);
  auto model = load_target(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  CausalLM& m = **model;
  const int64_t V = m.config().vocab_size;
  ASSERT_TRUE(m.config().sliding_window.has_value());
  const std::vector<float> ids_f = test_util::golden_floats(*golden, "prompt_ids");
  const std::vector<int32_t> prompt(ids_f.begin(), ids_f.end());
  const std::vector<float> ref = test_util::golden_floats(*golden, "logits");  // [P, V]
  const int64_t P = static_cast<int64_t>(prompt.size());
  ASSERT_GT(P, 3 * *m.config().sliding_window);
  ASSERT_EQ(static_cast<int64_t>(ref.size()), P * V);

  // Chunk sizes: the whole prompt at once; 7-token chunks (each row's window spans chunks and
  // KV blocks); one token at a time (the decode shape).
  for (const int64_t chunk : {P, int64_t{7}, int64_t{1}}) {
    const std::vector<float> got = test_util::chunked_prompt_logits(m, prompt, chunk);
    ASSERT_EQ(got.size(), ref.size()) << "chunk " << chunk;
    for (int64_t r = 0; r < P; ++r) {
      EXPECT_LT(max_rel_err(&got[r * V], &ref[r * V], V), 1e-4)
          << "chunk " << chunk << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, SlidingWindowGolden,
                         ::testing::Values("tiny-mistral-swa", "tiny-qwen2-swa"));

}  // namespace
}  // namespace bs
