// Helpers shared by the test programs.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/device_sampling.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"

namespace bs::test_util {

// A golden file's tensor as floats, whatever its dtype; a missing tensor fails the test and
// gives an empty vector.
inline std::vector<float> golden_floats(const io::Checkpoint& golden, const std::string& name) {
  auto info = golden.get(name);
  EXPECT_TRUE(info.ok()) << name;
  std::vector<float> out(info.ok() ? (*info)->numel() : 0);
  if (info.ok()) convert_to_f32((*info)->dtype, (*info)->data, out.data(), out.size());
  return out;
}

// A fresh directory per test (named after the test), removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() / fmt::format("bs_test_{}_{}_{}_{}", getpid(),
                                                                 info->test_suite_name(),
                                                                 info->name(), counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// stories260K prompts (token ids): BOS; "Once upon a time"; "The little dog"; a mid-story prefix
// from the held-out set.
inline const std::vector<std::vector<int32_t>> kStoryPrompts = {
    {1},
    {1, 403, 407, 261, 378},
    {1, 291, 376, 400, 428},
    {1, 403, 407, 261, 378, 432, 383, 286, 261, 297, 417, 331, 376, 298, 315}};

// The embedded stories260K target (models/stories260K) on a one-thread CPU backend and, unless
// `drafter` is empty, the shipped drafter models/<drafter>. Fails the test on a load error.
inline void load_stories(const std::string& drafter, std::unique_ptr<Backend>* backend,
                         std::unique_ptr<CausalLM>* target, std::unique_ptr<Drafter>* out) {
  const std::string models = std::string(BS_SOURCE_DIR) + "/models";
  *backend = make_cpu_backend(1);
  auto t = load_target(models + "/stories260K", **backend);
  ASSERT_TRUE(t.ok()) << t.status().message();
  *target = std::move(*t);
  if (drafter.empty()) return;
  auto d = load_drafter(models + "/" + drafter, **target, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  *out = std::move(*d);
}

// The target's logits of the last `num_logits` rows [num_logits, vocab] after `tokens`, from one
// CausalLM::forward on a fresh cache. Fails the test on a forward error.
inline std::vector<float> forward_logits(CausalLM& target, const std::vector<int32_t>& tokens,
                                         int64_t num_logits) {
  const int64_t blocks = (static_cast<int64_t>(tokens.size()) + kKvBlockSize - 1) / kKvBlockSize;
  KvPool pool = target.make_kv_pool(blocks);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  ForwardResult res;
  const Status st = target.forward(
      {.tokens = tokens, .start_pos = 0, .block_table = table, .num_logits = num_logits}, pool,
      &res);
  EXPECT_TRUE(st.ok()) << st.message();
  return st.ok() ? target.backend().to_host_f32(res.logits) : std::vector<float>();
}

// generate_plain of up to `max_tokens` tokens after `prompt` with `sampling` (and logprobs);
// empty after reporting a failure.
inline std::vector<int32_t> generate_sampled(CausalLM& target, const std::vector<int32_t>& prompt,
                                             const SamplingParams& sampling, int64_t max_tokens,
                                             int logprobs = -1) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling = sampling;
  o.logprobs = logprobs;
  auto out = generate_plain(target, prompt, o, nullptr, nullptr);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<int32_t>();
}

// Counts the tokens of `calls` device draws of one token per row of `logits` [rows, V].
inline std::map<int32_t, int64_t> count_device_draws(DeviceSampling& dev, Sampler& sampler,
                                                     const Tensor& logits, int64_t calls) {
  std::map<int32_t, int64_t> counts;
  std::vector<int32_t> ids;
  for (int64_t c = 0; c < calls; ++c) {
    dev.sample(sampler, logits, &ids);
    for (int32_t id : ids) ++counts[id];
  }
  return counts;
}

// A restricted draft vocabulary of stories260K (512 tokens): 128 target ids, in draft-id order.
// `shuffled` permutes them (EAGLE-3 d2t is usually sorted, but any order is allowed).
inline std::vector<int32_t> stories_draft_vocab(bool shuffled = false) {
  std::vector<int32_t> hot;
  for (int32_t t = 0; t < 64; ++t) hot.push_back(t);
  for (int32_t k = 0; k < 64; ++k) hot.push_back(64 + 7 * k);
  if (shuffled) {
    for (size_t i = 0; i < hot.size(); ++i) std::swap(hot[i], hot[(i * 53 + 17) % hot.size()]);
  }
  return hot;
}

// EAGLE-3 offsets of a draft vocabulary: d2t[j] = hot[j] - j.
inline std::vector<int64_t> d2t_offsets(const std::vector<int32_t>& hot) {
  std::vector<int64_t> d2t(hot.size());
  for (size_t j = 0; j < hot.size(); ++j) d2t[j] = hot[j] - static_cast<int64_t>(j);
  return d2t;
}

// Writes the drafter folder `dst`: config.json = `config`, model.safetensors = the tensors of
// `src`'s single-file checkpoint (minus those named in `drop`) plus `extra`.
inline void write_drafter_variant(const std::string& src, const std::string& dst,
                                  const nlohmann::json& config,
                                  std::vector<io::TensorToWrite> extra = {},
                                  const std::vector<std::string>& drop = {}) {
  std::filesystem::create_directories(dst);
  std::ofstream(std::filesystem::path(dst) / "config.json") << config.dump(2);
  auto ckpt = io::Checkpoint::open(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  std::vector<io::TensorToWrite> tensors;
  for (const std::string& n : ckpt->names()) {
    if (std::find(drop.begin(), drop.end(), n) != drop.end()) continue;
    const io::TensorInfo* info = *ckpt->get(n);
    tensors.push_back({n, info->dtype, info->shape, info->data});
  }
  for (auto& t : extra) tensors.push_back(std::move(t));
  const Status st =
      io::write_safetensors((std::filesystem::path(dst) / "model.safetensors").string(), tensors);
  ASSERT_TRUE(st.ok()) << st.message();
}

// A GoogleTest parameter name from any string: characters other than letters and digits become
// '_' (INSTANTIATE_TEST_SUITE_P(..., [](const auto& info) { return param_name(info.param); })).
inline std::string param_name(std::string s) {
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// `prompt` through `m` from position 0 in forwards of `chunk` tokens each (a fresh pool): the
// logits of every row, read back.
inline std::vector<float> chunked_prompt_logits(CausalLM& m, std::span<const int32_t> prompt,
                                                int64_t chunk) {
  const int64_t P = static_cast<int64_t>(prompt.size()), blocks = P / kKvBlockSize + 1;
  KvPool pool = m.make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  SequenceKv seq(alloc, kKvBlockSize);
  EXPECT_TRUE(seq.reserve(P).ok());
  std::vector<float> out;
  for (int64_t start = 0; start < P; start += chunk) {
    const int64_t n = std::min(chunk, P - start);
    ForwardResult res;
    const Status st = m.forward({.tokens = prompt.subspan(start, n),
                                 .start_pos = start,
                                 .block_table = seq.block_table(),
                                 .num_logits = n},
                                pool, &res);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return {};
    const std::vector<float> rows = m.backend().to_host_f32(res.logits);
    out.insert(out.end(), rows.begin(), rows.end());
    seq.set_length(start + n);
  }
  return out;
}

// A drafter's context before its first block: `prompt` through `target` (into `seq`'s blocks,
// with the drafter's tap layers), then the drafter observes every prompt position but the last,
// which is the anchor of the first proposal.
inline Status prefill_and_observe(CausalLM& target, Drafter& drafter,
                                  const std::vector<int32_t>& prompt, const SequenceKv& seq,
                                  KvPool& target_kv, KvPool& draft_kv) {
  const auto P = static_cast<int64_t>(prompt.size());
  ForwardResult res;
  BS_RETURN_IF_ERROR(target.forward({.tokens = prompt,
                                     .start_pos = 0,
                                     .block_table = seq.block_table(),
                                     .num_logits = 1,
                                     .tap_layers = drafter.target_layers()},
                                    target_kv, &res));
  return drafter.observe(draft_kv, seq.block_table(), res.taps.rows(0, P - 1), 0);
}

// The counts a generation reports (finish, prompt and generated tokens, steps, drafts and their
// acceptance per position) are the same in `got` as in `want`.
inline void expect_same_counts(const GenerateStats& got, const GenerateStats& want,
                               const std::string& where) {
  EXPECT_EQ(got.finish, want.finish) << where;
  EXPECT_EQ(got.prompt_tokens, want.prompt_tokens) << where;
  EXPECT_EQ(got.generated_tokens, want.generated_tokens) << where;
  EXPECT_EQ(got.steps, want.steps) << where;
  EXPECT_EQ(got.drafted, want.drafted) << where;
  EXPECT_EQ(got.accepted, want.accepted) << where;
  EXPECT_EQ(got.position_offered, want.position_offered) << where;
  EXPECT_EQ(got.position_accepted, want.position_accepted) << where;
}

}  // namespace bs::test_util
