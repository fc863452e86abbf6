// Whole models on the CUDA backend against the CPU reference: logits of stories260K and of the
// tiny goldens' checkpoints (bf16 tolerance), greedy decoding of stories260K from BOS, drafter
// proposals, and greedy speculative decoding (single and batched, DFlash and FlashMap) on the GPU
// == plain decoding on the GPU, reading back from the GPU once per step; seeded sampled
// speculative decoding on the GPU (reproducible, one read per step). Skipped without a GPU;
// drafter checks are skipped when their test data or family is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "counting_backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/prompt_logprobs.h"
#include "engine/scheduler.h"
#include "io/safetensors.h"
#include "models/drafter.h"
#include "models/registry.h"
#include "test_util.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

const std::string kStories = std::string(BS_SOURCE_DIR) + "/models/stories260K";

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

int32_t argmax_row(const std::vector<float>& v, int64_t row, int64_t width) {
  const float* p = v.data() + row * width;
  return static_cast<int32_t>(std::max_element(p, p + width) - p);
}

// The gap between the best and second-best logit of a row.
float top2_margin(const std::vector<float>& v, int64_t row, int64_t width) {
  std::vector<float> r(v.begin() + row * width, v.begin() + (row + 1) * width);
  std::partial_sort(r.begin(), r.begin() + 2, r.end(), std::greater<float>());
  return r[0] - r[1];
}

// The stories260K target and one drafter, each loaded on the GPU (g, dg) and on the CPU (c, dc).
struct ModelPair {
  std::unique_ptr<CausalLM> g, c;
  std::unique_ptr<Drafter> dg, dc;
};

class CudaModels : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = make_backend("cuda");
    if (!be.ok()) GTEST_SKIP() << "CUDA backend unavailable: " << be.status().message();
    gpu_ = std::move(*be);
    cpu_ = make_cpu_backend(0);
  }
  // Loads stories260K and the drafter at `dir` on both backends into *m.
  void load_pair(const std::string& dir, const DrafterOptions& options, ModelPair* m) {
    auto g = load_target(kStories, *gpu_);
    ASSERT_TRUE(g.ok()) << g.status().message();
    m->g = std::move(*g);
    auto c = load_target(kStories, *cpu_);
    ASSERT_TRUE(c.ok()) << c.status().message();
    m->c = std::move(*c);
    auto dg = load_drafter(dir, *m->g, options);
    ASSERT_TRUE(dg.ok()) << dg.status().message();
    m->dg = std::move(*dg);
    auto dc = load_drafter(dir, *m->c, options);
    ASSERT_TRUE(dc.ok()) << dc.status().message();
    m->dc = std::move(*dc);
  }
  std::unique_ptr<Backend> gpu_, cpu_;
};

// Prefill `prompt`, then a verify-style chunk of 5 tokens on top of the cache; returns the
// logits of every row of both forwards, concatenated.
std::vector<float> run_forwards(CausalLM& m, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& chunk) {
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t C = static_cast<int64_t>(chunk.size());
  const int64_t blocks = (P + C) / kKvBlockSize + 2;
  KvPool pool = m.make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  SequenceKv seq(alloc, kKvBlockSize);
  EXPECT_TRUE(seq.reserve(P + C).ok());
  ForwardResult res;
  EXPECT_TRUE(m.forward({.tokens = prompt,
                         .start_pos = 0,
                         .block_table = seq.block_table(),
                         .num_logits = P,
                         .tap_layers = {}},
                        pool, &res)
                  .ok());
  std::vector<float> out = m.backend().to_host_f32(res.logits);
  seq.set_length(P);
  EXPECT_TRUE(m.forward({.tokens = chunk,
                         .start_pos = P,
                         .block_table = seq.block_table(),
                         .num_logits = C,
                         .tap_layers = {}},
                        pool, &res)
                  .ok());
  const auto more = m.backend().to_host_f32(res.logits);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

void compare_target(Backend& gpu, Backend& cpu, const std::string& dir) {
  auto g = load_target(dir, gpu);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = load_target(dir, cpu);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const int64_t V = (*c)->config().vocab_size;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(40), chunk(5);
  for (auto& t : prompt) t = tok(rng);
  if ((*c)->config().bos_token_id >= 0)
    prompt[0] = static_cast<int32_t>((*c)->config().bos_token_id);
  for (auto& t : chunk) t = tok(rng);
  const auto lg = run_forwards(**g, prompt, chunk);
  const auto lc = run_forwards(**c, prompt, chunk);
  ASSERT_EQ(lg.size(), lc.size());
  const double e = rel_err(lg, lc);
  EXPECT_LT(e, 3e-2) << dir << ": CUDA vs CPU logits";
  // Argmax agreement wherever the CPU's top-2 margin is clear of bf16 noise.
  const int64_t rows = static_cast<int64_t>(lc.size()) / V;
  int disagree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (top2_margin(lc, r, V) > 0.05f && argmax_row(lg, r, V) != argmax_row(lc, r, V)) ++disagree;
  }
  EXPECT_EQ(disagree, 0) << dir << ": argmax differs on " << disagree << " of " << rows << " rows";
  std::printf("[ %s: CUDA vs CPU logits rel err %.2e over %lld rows ]\n", dir.c_str(), e,
              static_cast<long long>(rows));
}

TEST_F(CudaModels, Stories260KLogitsMatchCpu) { compare_target(*gpu_, *cpu_, kStories); }

TEST_F(CudaModels, TinyGoldenCheckpointsMatchCpu) {
  int found = 0;
  const fs::path data = BS_TEST_DATA;
  if (!fs::exists(data)) GTEST_SKIP() << "no " << data;
  for (const auto& e : fs::directory_iterator(data)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tiny-", 0) != 0 || !fs::exists(e.path() / "config.json")) continue;
    ++found;
    SCOPED_TRACE(name);
    compare_target(*gpu_, *cpu_, e.path().string());
  }
  if (found == 0) GTEST_SKIP() << "no tests/data/tiny-* checkpoints";
}

// Sliding-window targets on the GPU against the PyTorch reference's logits (tests/data/*-swa,
// tools/goldens/make_sliding_window_goldens.py): a 24-token prompt with a 4-5 key window, in one
// prefill (flash-prefill kernel, hd 64), in 7-token chunks and token by token (split-KV decode).
TEST_F(CudaModels, SlidingWindowTargetsMatchReference) {
  for (const char* name : {"tiny-mistral-swa", "tiny-qwen2-swa"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(BS_TEST_DATA) + "/" + name;
    auto golden = io::Checkpoint::open_file(dir + "/golden.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status().message();
    const std::vector<float> ids_f = test_util::golden_floats(*golden, "prompt_ids"),
                             ref = test_util::golden_floats(*golden, "logits");
    const std::vector<int32_t> prompt(ids_f.begin(), ids_f.end());
    auto model = load_target(dir, *gpu_);
    ASSERT_TRUE(model.ok()) << model.status().message();
    CausalLM& m = **model;
    const int64_t P = static_cast<int64_t>(prompt.size()), V = m.config().vocab_size;
    for (const int64_t chunk : {P, int64_t{7}, int64_t{1}}) {
      const std::vector<float> got = test_util::chunked_prompt_logits(m, prompt, chunk);
      EXPECT_LT(rel_err(got, ref), 3e-2) << "chunk " << chunk;
      // The reference computes in fp32, the GPU keeps bf16 activations (~1e-2 relative noise):
      // the argmax must agree where the reference's top-2 margin is clear of that noise, 2 % of
      // the row's largest logit (tiny-mistral-swa row 13: 8.74 vs 8.68, a 0.7 % margin, flips
      // in the chunked runs). A window applied wrongly moves logits by up to 8.7 (the CPU
      // golden test's failure before the fix), which rel_err above catches anyway.
      for (int64_t r = 0; r < P; ++r) {
        float row_max = 0.0f;
        for (int64_t v = 0; v < V; ++v) row_max = std::max(row_max, std::abs(ref[r * V + v]));
        if (top2_margin(ref, r, V) > 0.02f * row_max) {
          EXPECT_EQ(argmax_row(got, r, V), argmax_row(ref, r, V))
              << "chunk " << chunk << " row " << r;
        }
      }
    }
  }
}

std::vector<int32_t> greedy(CausalLM& m, int64_t n) {
  GenerateOptions opt;
  opt.max_tokens = n;
  const std::vector<int32_t> prompt = {static_cast<int32_t>(m.config().bos_token_id)};
  auto out = generate_plain(m, prompt, opt, nullptr, nullptr);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<int32_t>{};
}

TEST_F(CudaModels, Stories260KGreedy100TokensMatchCpu) {
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = load_target(kStories, *cpu_);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto tg = greedy(**g, 100), tc = greedy(**c, 100);
  ASSERT_EQ(tc.size(), 100u);
  size_t first_diff = 0;
  while (first_diff < tc.size() && first_diff < tg.size() && tg[first_diff] == tc[first_diff]) {
    ++first_diff;
  }
  EXPECT_EQ(tg, tc) << "first difference at token " << first_diff;
  if (first_diff < tc.size()) {
    // Diagnose: the CPU's margin at the diverging step (teacher-forced on the CPU prefix).
    std::vector<int32_t> prefix = {1};
    prefix.insert(prefix.end(), tc.begin(), tc.begin() + first_diff);
    const auto lc = run_forwards(**c, prefix, {tc[first_diff]});
    const int64_t V = (*c)->config().vocab_size;
    std::printf("[ CPU top-2 logit margin at the diverging step: %.4f ]\n",
                top2_margin(lc, static_cast<int64_t>(prefix.size()) - 1, V));
  }
}

TEST_F(CudaModels, SampledDecodingDrawsOnTheGpuReproducibly) {
  // Plain sampled decoding draws on the device (DeviceSampling): a seed reproduces the run, and
  // logprobs (which read the logits back) do not change the tokens.
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  SamplingParams s{.temperature = 0.9f, .top_k = 100, .top_p = 0.95f, .seed = 17};
  const std::vector<int32_t> a = test_util::generate_sampled(**g, prompt, s, 60);
  ASSERT_EQ(a.size(), 60u);
  EXPECT_EQ(test_util::generate_sampled(**g, prompt, s, 60), a);
  EXPECT_EQ(test_util::generate_sampled(**g, prompt, s, 60, /*logprobs=*/3), a);
  s.seed = 18;
  EXPECT_NE(test_util::generate_sampled(**g, prompt, s, 60), a);
}

TEST_F(CudaModels, BatchedGenerationMatchesPerPromptOnGpu) {
  // Batched decoding on the GPU: with at most 16 rows per forward every matmul uses the pinned
  // few-row algorithm and attention runs per sequence, so each sequence's tokens equal its own
  // generate_plain on the GPU exactly.
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> tok(1, 511);
  std::vector<std::vector<int32_t>> prompts(3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].push_back(1);
    for (size_t j = 0; j < 2 + 2 * i; ++j) prompts[i].push_back(tok(rng));  // 15 rows in all
  }
  GenerateOptions o;
  o.max_tokens = 40;
  auto batch = generate_plain_batch(**g, prompts, o, nullptr);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate_plain(**g, prompts[i], o, nullptr, nullptr);
    ASSERT_TRUE(alone.ok()) << alone.status().message();
    EXPECT_EQ((*batch)[i], *alone) << "prompt " << i;
  }
}

TEST_F(CudaModels, BatchedSpeculativeMatchesPerPromptOnGpu) {
  // Batched speculative decoding on the GPU with the shipped drafters (DFlash: one batched
  // propose; FlashMap: one propose per sequence): 3 sequences of at most 5 verify rows keep every
  // batched forward within the 16 rows where matmuls are pinned, so each sequence equals its own
  // generate_speculative and generate_plain on the GPU. Greedy: the drafts, the verify input and
  // the acceptance stay on the GPU (speculative_step's device path).
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const char* name : {"stories260K-dflash", "stories260K-flashmap"}) {
    auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/" + name, **g, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    const std::vector<std::vector<int32_t>> prompts = {
        {1}, {1, 403, 407, 261, 378}, {1, 291, 376, 400, 428, 261, 297}};
    GenerateOptions o;
    o.max_tokens = 60;
    o.stop_ids = {2};
    o.draft_tokens = 4;
    std::vector<GenerateStats> stats;
    auto batch = generate_speculative_batch(**g, **d, prompts, o, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    int64_t accepted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateStats alone_stats;
      auto alone = generate_speculative(**g, **d, prompts[i], o, nullptr, &alone_stats);
      auto plain = generate_plain(**g, prompts[i], o, nullptr, nullptr);
      ASSERT_TRUE(alone.ok() && plain.ok());
      EXPECT_EQ((*batch)[i], *alone) << name << " prompt " << i;
      EXPECT_EQ((*batch)[i], *plain) << name << " prompt " << i;
      EXPECT_EQ(stats[i].accepted, alone_stats.accepted) << name << " prompt " << i;
      accepted += stats[i].accepted;
    }
    EXPECT_GT(accepted, 10) << name;  // trained drafters: real multi-row verifies
  }
}

// Logits processing on the GPU (Backend::apply_logit_rules' kernel on the BF16 verify logits):
// greedy speculative decoding with penalties, a bias and min_tokens equals plain decoding on the
// GPU, single and batched, with the shipped trained drafters (multi-draft blocks accepted, so a
// verify row's counts include the drafts before it); and the processing changes the output.
TEST_F(CudaModels, LogitProcessingIsLosslessOnGpu) {
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::vector<std::vector<int32_t>> prompts = {
      {1}, {1, 403, 407, 261, 378}, {1, 291, 376, 400, 428, 261, 297}};
  GenerateOptions o;
  o.max_tokens = 40;
  o.stop_ids = {2};
  o.draft_tokens = 4;
  o.sampling.presence_penalty = 1.0f;
  o.sampling.frequency_penalty = 1.5f;
  o.sampling.repetition_penalty = 1.8f;
  o.sampling.logit_bias = {{261, 1.5f}, {400, -2.0f}};
  o.sampling.min_tokens = 12;
  GenerateOptions off = o;
  off.sampling = {};
  int changed = 0;
  for (const char* name : {"stories260K-dflash", "stories260K-dspark", "stories260K-dflash2"}) {
    auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/" + name, **g, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    auto batch = generate_speculative_batch(**g, **d, prompts, o, nullptr);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    int64_t accepted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateStats st;
      auto alone = generate_speculative(**g, **d, prompts[i], o, nullptr, &st);
      auto plain = generate_plain(**g, prompts[i], o, nullptr, nullptr);
      auto unprocessed = generate_plain(**g, prompts[i], off, nullptr, nullptr);
      ASSERT_TRUE(alone.ok() && plain.ok() && unprocessed.ok());
      EXPECT_EQ(*alone, *plain) << name << " prompt " << i;
      EXPECT_EQ((*batch)[i], *plain) << name << " prompt " << i << " (batched)";
      changed += *plain != *unprocessed ? 1 : 0;
      accepted += st.accepted;
    }
    EXPECT_GT(accepted, 10) << name;
  }
  EXPECT_GT(changed, 0);
}

// Overlapped steps (SchedulerOptions::overlap) on the GPU: step n + 1 queued from step n's ids on
// the device (device_tokens, CUDA graphs replaying) before step n is read back through a pinned
// buffer and an event. Greedy and seeded sampled requests, stop ids met mid-way and short
// max_tokens, more requests than max_num_seqs: each gives generate_plain's tokens on the GPU
// with overlap on and off (at most 16 rows a forward, where GPU rows do not depend on the row
// count), one read-back per forward, and the KV pool is empty at the end.
TEST_F(CudaModels, OverlappedSchedulerStepsOnGpu) {
  test_util::CountingBackend counting(*gpu_);
  auto g = load_target(kStories, counting);
  ASSERT_TRUE(g.ok()) << g.status().message();
  GenerateOptions greedy;
  greedy.max_tokens = 48;
  greedy.stop_ids = {2};
  auto probe = generate_plain(**g, test_util::kStoryPrompts[1], greedy, nullptr, nullptr);
  ASSERT_TRUE(probe.ok() && probe->size() > 10);
  GenerateOptions stop_mid = greedy;
  stop_mid.stop_ids = {2, (*probe)[7]};
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.9f, .top_k = 100, .top_p = 0.95f, .seed = 17};
  GenerateOptions short_one = greedy;
  short_one.max_tokens = 5;
  const std::vector<std::pair<std::vector<int32_t>, GenerateOptions>> requests = {
      {test_util::kStoryPrompts[1], greedy},   {test_util::kStoryPrompts[2], sampled},
      {test_util::kStoryPrompts[1], stop_mid}, {test_util::kStoryPrompts[3], short_one},
      {test_util::kStoryPrompts[0], sampled},  {test_util::kStoryPrompts[3], greedy}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& [prompt, o] : requests) {
    auto alone = generate_plain(**g, prompt, o, nullptr, nullptr);
    ASSERT_TRUE(alone.ok());
    want.push_back(*alone);
  }
  for (const bool overlap : {true, false}) {
    Scheduler s(**g, nullptr, {.max_num_seqs = 4, .overlap = overlap});
    std::vector<std::vector<int32_t>> got(requests.size());
    std::vector<Status> status(requests.size(), InvalidArgument("not done"));
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(s.add(
                       i, requests[i].first, requests[i].second,
                       [&got, i](int32_t t) {
                         got[i].push_back(t);
                         return true;
                       },
                       [&status, i](Completion c) { status[i] = c.status; })
                      .ok());
    }
    counting.reset();
    while (!s.idle()) ASSERT_TRUE(s.step().ok());
    int64_t async_reads = 0;
    for (const auto& r : counting.reads()) async_reads += r.async;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(status[i].ok()) << status[i].message();
      EXPECT_EQ(got[i], want[i]) << "overlap " << overlap << ", request " << i;
    }
    EXPECT_EQ(s.num_kv_blocks_used(), 0) << "overlap " << overlap;
    if (overlap) {
      EXPECT_GT(s.times().overlapped_steps, 20);
      EXPECT_GT(async_reads, s.times().overlapped_steps);
    } else {
      EXPECT_EQ(async_reads, 0);
    }
  }
}

// Prefix caching (SchedulerOptions::prefix_caching) on the GPU: prompts that share a 32-token
// head take its cached KV blocks (target and drafter pools) and give the tokens of their single
// runs on the GPU, plain and speculative (the shipped DFlash drafter), greedy and seeded sampled.
// Chunks of 4 prompt tokens, 2 sequences and 4 drafts keep every forward within the 16 rows where
// GPU rows do not depend on the row count, so cached and computed KV are the same bits.
TEST_F(CudaModels, PrefixCachingKeepsOutputsOnGpu) {
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash", **g, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  GenerateOptions greedy;
  greedy.max_tokens = 40;
  greedy.stop_ids = {2};
  greedy.draft_tokens = 4;
  greedy.prefill_chunk = 4;
  const std::vector<int32_t> bos = {1};
  auto story = generate_plain(**g, bos, greedy, nullptr, nullptr);  // a natural head
  ASSERT_TRUE(story.ok() && story->size() >= 31u);
  std::vector<int32_t> head = {1};
  head.insert(head.end(), story->begin(), story->begin() + 31);
  GenerateOptions sampled = greedy;
  sampled.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 11};
  std::vector<std::pair<std::vector<int32_t>, GenerateOptions>> requests;
  for (const int32_t tail : {300, 301, 302, 303}) {
    std::vector<int32_t> p = head;
    p.insert(p.end(), {tail, 262, tail});
    requests.emplace_back(p, tail % 2 ? sampled : greedy);
  }
  requests.emplace_back(head, greedy);  // the whole head: its last block is computed again
  for (Drafter* drafter : {static_cast<Drafter*>(nullptr), d->get()}) {
    const char* what = drafter ? "dflash" : "plain";
    std::vector<std::vector<int32_t>> want;
    for (const auto& [prompt, o] : requests) {
      auto alone = drafter ? generate_speculative(**g, *drafter, prompt, o, nullptr, nullptr)
                           : generate_plain(**g, prompt, o, nullptr, nullptr);
      ASSERT_TRUE(alone.ok()) << alone.status().message();
      want.push_back(*alone);
    }
    Scheduler s(**g, drafter, {.max_num_seqs = 2, .max_prefill_tokens = 4, .prefix_caching = true});
    std::vector<Completion> done(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(s.add(
                       i, requests[i].first, requests[i].second, [](int32_t) { return true; },
                       [&done, i](Completion c) { done[i] = std::move(c); })
                      .ok());
    }
    while (!s.idle()) ASSERT_TRUE(s.step().ok());
    int64_t cached = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(done[i].status.ok()) << what << " " << i << ": " << done[i].status.message();
      EXPECT_EQ(done[i].tokens, want[i]) << what << ", request " << i;
      cached += done[i].stats.cached_tokens;
    }
    // The first two run together and compute the head; requests 2 and 3 find its two blocks,
    // the bare head its first one (a prompt's last token is always computed).
    EXPECT_GE(cached, 2 * 32 + 16) << what;
  }
}

// Chunked prefill (Scheduler max_prefill_tokens) and logprobs on the GPU, with the shipped DFlash
// drafter: a 15-token prompt prefilled whole or in chunks of 7 or 1 tokens gives the tokens of
// generate_plain on the GPU and the same logprobs bit for bit (every forward has at most 16
// rows, where GPU rows do not depend on the row count); the logprobs are the CPU's within bf16
// noise wherever the two backends chose the same tokens.
TEST_F(CudaModels, ChunkedPrefillAndLogprobsOnGpu) {
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = load_target(kStories, *cpu_);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash", **g, {});
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::vector<int32_t> prompt = test_util::kStoryPrompts[3];
  ASSERT_EQ(prompt.size(), 15u);
  GenerateOptions o;
  o.max_tokens = 40;
  o.stop_ids = {2};
  o.logprobs = 3;
  std::vector<TokenLogprobs> cpu_lp;
  auto cpu_tokens = generate_plain(**c, prompt, o, nullptr, nullptr,
                                   [&](const TokenLogprobs& l) { cpu_lp.push_back(l); });
  auto gpu_plain = generate_plain(**g, prompt, o, nullptr, nullptr);
  ASSERT_TRUE(cpu_tokens.ok() && gpu_plain.ok());
  std::vector<TokenLogprobs> whole;
  for (const int64_t chunk : {0, 7, 1}) {
    Scheduler s(**g, d->get(), {.max_num_seqs = 2, .max_prefill_tokens = chunk});
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> lp;
    Status status = InvalidArgument("not done");
    ASSERT_TRUE(s.add(
                     1, prompt, o,
                     [&](int32_t t) {
                       tokens.push_back(t);
                       return true;
                     },
                     [&](Completion done) { status = done.status; },
                     [&](const TokenLogprobs& l) { lp.push_back(l); })
                    .ok());
    bool chunked = false;
    while (!s.idle()) {
      ASSERT_TRUE(s.step().ok());
      chunked |= s.num_prefilling() > 0;
    }
    EXPECT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(chunked, chunk > 0) << "chunk " << chunk;
    EXPECT_EQ(tokens, *gpu_plain) << "chunk " << chunk;
    ASSERT_EQ(lp.size(), tokens.size());
    for (size_t i = 0; i < lp.size(); ++i) {
      EXPECT_EQ(lp[i].token, tokens[i]);
      ASSERT_EQ(lp[i].top.size(), 3u);
      if (chunk == 0) continue;
      EXPECT_EQ(lp[i].logprob, whole[i].logprob) << "chunk " << chunk << " token " << i;
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(lp[i].top[j].token, whole[i].top[j].token) << "chunk " << chunk << " token " << i;
        EXPECT_EQ(lp[i].top[j].logprob, whole[i].top[j].logprob);
      }
    }
    if (chunk == 0) whole = lp;
  }
  size_t same = 0;
  while (same < whole.size() && same < cpu_lp.size() && whole[same].token == cpu_lp[same].token) {
    EXPECT_NEAR(whole[same].logprob, cpu_lp[same].logprob,
                0.05 + 0.01 * std::abs(cpu_lp[same].logprob))
        << "token " << same;
    ++same;
  }
  // bf16 logits part the greedy paths at the first near-tie (token 9 for this prompt on the H200).
  EXPECT_GE(same, 5u) << "GPU and CPU greedy tokens part within 5 tokens";
}

// Prompt logprobs (the server's echo) on the GPU equal the CPU's within bf16 noise (relative to
// the value: unlikely tokens sit ~20 nats down, where bf16 logits are off by ~0.1), whether the
// prompt goes through in one forward of 40 rows or in forwards of 16 and 1 rows.
TEST_F(CudaModels, PromptLogprobsMatchCpu) {
  auto g = load_target(kStories, *gpu_);
  auto c = load_target(kStories, *cpu_);
  ASSERT_TRUE(g.ok() && c.ok());
  std::vector<int32_t> prompt = test_util::kStoryPrompts[3];
  while (prompt.size() < 40) prompt.push_back(prompt[prompt.size() % 15]);
  auto want = prompt_logprobs(**c, prompt, 3);
  ASSERT_TRUE(want.ok()) << want.status().message();
  for (const int64_t rows : {256, 16, 1}) {
    auto got = prompt_logprobs(**g, prompt, 3, rows);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_EQ((*got)[i].token, (*want)[i].token);
      const auto tolerance = [](float lp) { return 0.05 + 0.01 * std::abs(lp); };
      EXPECT_NEAR((*got)[i].logprob, (*want)[i].logprob, tolerance((*want)[i].logprob))
          << rows << " rows, token " << i;
      ASSERT_EQ((*got)[i].top.size(), 3u);
      EXPECT_NEAR((*got)[i].top[0].logprob, (*want)[i].top[0].logprob,
                  tolerance((*want)[i].top[0].logprob));
    }
  }
}

// Runs `body(target, drafter, name)` with stories260K and each shipped drafter loaded on
// `backend` (here a read-counting decorator of the GPU backend).
void for_each_shipped_drafter(
    Backend& backend, const std::function<void(CausalLM&, Drafter&, const std::string&)>& body) {
  auto g = load_target(kStories, backend);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const char* name : {"stories260K-dflash", "stories260K-flashmap"}) {
    auto d = load_drafter(std::string(BS_SOURCE_DIR) + "/models/" + name, **g, {});
    ASSERT_TRUE(d.ok()) << d.status().message();
    body(**g, **d, name);
  }
}

TEST_F(CudaModels, GreedySpeculativeReadsBackOncePerStepOnGpu) {
  // The models run on a decorator of the CUDA backend that counts device-to-host reads (graph
  // capture included): the prefill reads its first token's id, every greedy step one small
  // result.
  test_util::CountingBackend counting(*gpu_);
  for_each_shipped_drafter(counting, [&](CausalLM& g, Drafter& d, const std::string& name) {
    GenerateOptions o;
    o.max_tokens = 100;
    const std::vector<int32_t> bos = {1};
    auto plain = generate_plain(g, bos, o, nullptr, nullptr);
    ASSERT_TRUE(plain.ok());
    counting.reset();
    GenerateStats st;
    auto spec = generate_speculative(g, d, bos, o, nullptr, &st);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(*spec, *plain) << name;
    EXPECT_EQ(static_cast<int64_t>(counting.reads().size()), 1 + st.steps) << name;
    EXPECT_EQ(counting.syncs(), 0) << name;

    const std::vector<std::vector<int32_t>> prompts = {{1}, {1, 403, 407, 261, 378}};
    o.draft_tokens = 4;
    counting.reset();
    std::vector<GenerateStats> stats;
    auto batch = generate_speculative_batch(g, d, prompts, o, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    const int64_t steps = std::max(stats[0].steps, stats[1].steps);
    // The two prompts prefill together (one read of both first tokens), then a read a step.
    EXPECT_EQ(static_cast<int64_t>(counting.reads().size()), 1 + steps) << name << " batch";
  });
}

#ifdef BLOCKSPEC_HAS_CUDA  // cuda::set_gemv_mode exists only in CUDA builds
// With the stream GEMM (GemvMode::kStream) for every few-row product, greedy speculative decoding
// still reproduces plain decoding token for token (its rows do not depend on the row count), with
// the decoder forwards and the drafters' proposals in CUDA graphs: the default variant, and the
// bulk variants 4-9, whose fused forms take the RMSNorms into q/k/v, gate/up and the LM head
// (the shipped models' down projection, k = 172, is not a multiple of 8: SwiGLU stays apart; their
// k is one span of the split variants 8 and 9: cuda_ops_test holds split products to the row
// invariance, and bench's `output == plain` at Qwen3-8B shapes).
TEST_F(CudaModels, GreedySpeculativeEqualsPlainWithStreamGemm) {
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kStream);
  for (const int variant : {cuda::kStreamDefaultVariant, 4, 5, 6, 7, 8, 9}) {
    cuda::set_stream_options(*gpu_, variant, int64_t{1} << 20);
    for_each_shipped_drafter(*gpu_, [&](CausalLM& g, Drafter& d, const std::string& name) {
      GenerateOptions o;
      o.max_tokens = 100;
      for (const std::vector<int32_t>& prompt :
           {std::vector<int32_t>{1}, std::vector<int32_t>{1, 403, 407, 261, 378}}) {
        auto plain = generate_plain(g, prompt, o, nullptr, nullptr);
        ASSERT_TRUE(plain.ok());
        GenerateStats st;
        auto spec = generate_speculative(g, d, prompt, o, nullptr, &st);
        ASSERT_TRUE(spec.ok()) << spec.status().message();
        EXPECT_EQ(*spec, *plain) << name << " variant " << variant;
        EXPECT_GT(st.accepted, 0) << name << ": no draft accepted, nothing verified in many rows";
      }
    });
  }
  cuda::set_stream_options(*gpu_, cuda::kStreamDefaultVariant, cuda::kStreamDefaultMaxMib);
  cuda::set_gemv_mode(*gpu_, cuda::GemvMode::kAuto);
}
#endif  // BLOCKSPEC_HAS_CUDA

TEST_F(CudaModels, SampledSpeculativeIsSeededAndReadsBackOncePerStepOnGpu) {
  // Sampled speculative decoding on the GPU: each sequence's drafts are drawn on the device into
  // the verify input and accepted by rejection sampling there, so a step reads back one small I32
  // result (the prefill one token id). A seed reproduces the run, single and batched (a batch's
  // rows equal a single sequence's within the 16 pinned rows, so the draws do too); logprobs
  // (which read the committed rows' logits) do not change the tokens.
  test_util::CountingBackend counting(*gpu_);
  for_each_shipped_drafter(counting, [&](CausalLM& g, Drafter& d, const std::string& name) {
    GenerateOptions o;
    o.max_tokens = 60;  // no stop tokens: exactly 60 tokens, finish kLength
    o.sampling = {.temperature = 0.9f, .top_k = 100, .top_p = 0.95f, .seed = 17};
    const std::vector<int32_t> prompt = {1, 403, 407, 261};
    counting.reset();
    GenerateStats st;
    auto a = generate_speculative(g, d, prompt, o, nullptr, &st);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status().message();
    EXPECT_EQ(a->size(), 60u) << name;
    EXPECT_EQ(st.generated_tokens, 60) << name;
    EXPECT_EQ(st.finish, FinishReason::kLength) << name;
    EXPECT_GT(st.accepted, 0) << name;
    std::printf("[ %s sampled: %lld steps, %lld of %lld drafts accepted ]\n", name.c_str(),
                static_cast<long long>(st.steps), static_cast<long long>(st.accepted),
                static_cast<long long>(st.drafted));
    const auto reads = counting.reads();
    EXPECT_EQ(static_cast<int64_t>(reads.size()), 1 + st.steps) << name;
    for (const auto& r : reads) {
      EXPECT_TRUE(!r.f32 && r.dtype == DType::kI32) << name << ": a read of " << r.numel;
    }
    EXPECT_EQ(counting.syncs(), 0) << name;
    for (int64_t t : *a) EXPECT_TRUE(t >= 0 && t < g.config().vocab_size) << name;

    auto again = generate_speculative(g, d, prompt, o, nullptr, nullptr);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *a) << name << ": the same seed";
    GenerateOptions with_logprobs = o;
    with_logprobs.logprobs = 3;
    int64_t reported = 0;
    auto lp = generate_speculative(g, d, prompt, with_logprobs, nullptr, nullptr,
                                   [&](const TokenLogprobs&) { ++reported; });
    ASSERT_TRUE(lp.ok());
    EXPECT_EQ(*lp, *a) << name << ": logprobs";
    EXPECT_EQ(reported, 60) << name;
    GenerateOptions other = o;
    other.sampling.seed = 18;
    auto b = generate_speculative(g, d, prompt, other, nullptr, nullptr);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(*b, *a) << name << ": another seed";

    // Batched (3 sequences of at most 5 verify rows): each equals its own run, one read a step.
    const std::vector<std::vector<int32_t>> prompts = {
        {1}, {1, 403, 407, 261, 378}, {1, 291, 376, 400, 428, 261, 297}};
    o.draft_tokens = 4;
    counting.reset();
    std::vector<GenerateStats> stats;
    auto batch = generate_speculative_batch(g, d, prompts, o, &stats);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    const int64_t batch_reads = static_cast<int64_t>(counting.reads().size());
    int64_t steps = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      steps = std::max(steps, stats[i].steps);
      EXPECT_EQ((*batch)[i].size(), 60u) << name << " prompt " << i;
      auto alone = generate_speculative(g, d, prompts[i], o, nullptr, nullptr);
      ASSERT_TRUE(alone.ok());
      EXPECT_EQ((*batch)[i], *alone) << name << " prompt " << i;
    }
    EXPECT_EQ(batch_reads, 1 + steps) << name << " batch";  // one batched prefill, a read a step
  });
}

// Drafter data made by the drafter engineers (tests/data/<name>), against stories260K.
const char* kDrafters[] = {"tests/data/dflash-stories260K", "tests/data/dflash-stories260K-swa",
                           "tests/data/flashmap-stories260K",
                           "tests/data/flashmap-stories260K-dv128"};

struct DraftRun {
  std::vector<float> logits;
  bool ok = false;
};

// Prefill a prompt with the drafter's taps, observe it, propose once; returns draft logits.
DraftRun draft_once(CausalLM& target, Drafter& drafter, const std::vector<int32_t>& prompt) {
  DraftRun r;
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t B = drafter.block_size();
  const int64_t blocks = (P + B) / kKvBlockSize + 2;
  KvPool tpool = target.make_kv_pool(blocks);
  KvPool dpool = drafter.make_kv_pool(blocks);
  BlockAllocator alloc(blocks);
  SequenceKv seq(alloc, kKvBlockSize);
  if (!seq.reserve(P + B).ok()) return r;
  // The anchor is the last prompt token: context = positions [0, P-1).
  Status st = test_util::prefill_and_observe(target, drafter, prompt, seq, tpool, dpool);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return r;
  Tensor logits;
  ProposeRequest req{.anchor = prompt.back(),
                     .anchor_pos = P - 1,
                     .block_table = seq.block_table(),
                     .num_drafts = drafter.max_drafts(),
                     .noise_seed = 99};
  st = drafter.propose(dpool, req, &logits);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return r;
  r.logits = target.backend().to_host_f32(logits);
  r.ok = true;
  return r;
}

// BOS and 29 random stories260K tokens.
std::vector<int32_t> random_prompt(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, 511);
  std::vector<int32_t> prompt(30);
  for (auto& t : prompt) t = tok(rng);
  prompt[0] = 1;
  return prompt;
}

// Relative error of the GPU's draft logits after `prompt` against the CPU's.
double draft_logits_rel_err(CausalLM& g, Drafter& dg, CausalLM& c, Drafter& dc,
                            const std::vector<int32_t>& prompt) {
  const DraftRun rg = draft_once(g, dg, prompt), rc = draft_once(c, dc, prompt);
  EXPECT_TRUE(rg.ok && rc.ok);
  return rg.ok && rc.ok ? rel_err(rg.logits, rc.logits) : INFINITY;
}

// Greedy speculative decoding of up to 100 tokens after `prompt` must produce plain greedy
// decoding's tokens (on the target's backend); *st gets the speculative run's statistics.
void expect_lossless(CausalLM& target, Drafter& drafter, const std::vector<int32_t>& prompt,
                     const std::string& what, GenerateStats* st) {
  GenerateOptions opt;
  opt.max_tokens = 100;
  auto plain = generate_plain(target, prompt, opt, nullptr, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  auto spec = generate_speculative(target, drafter, prompt, opt, nullptr, st);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(*spec, *plain) << what << ": speculative != plain on the GPU";
}

// DFlash with FP8 weights (DrafterOptions::fp8_weights): the GPU's drafts follow the CPU's
// FP8 reference, and greedy speculative decoding still reproduces plain decoding. The shipped
// stories260K drafter has k = 64 (FP8 tensor-core kernel) and k = 172 (dequantizing fallback).
// Also with the bulk FP8 kernel, whose fused forms take the drafter's RMSNorms (and the head's).
TEST_F(CudaModels, Fp8DFlashMatchesCpuAndIsLossless) {
  for (const std::string name : {"v1", "bulk"}) {
#ifdef BLOCKSPEC_HAS_CUDA
    cuda::set_fp8_kernel(*gpu_, name == "v1" ? cuda::Fp8Kernel::kV1 : cuda::Fp8Kernel::kBulk);
#endif
    ModelPair m;
    ASSERT_NO_FATAL_FAILURE(load_pair(std::string(BS_SOURCE_DIR) + "/models/stories260K-dflash",
                                      {.fp8_weights = true}, &m));
    const std::vector<int32_t> prompt = random_prompt(4);
    const double e = draft_logits_rel_err(*m.g, *m.dg, *m.c, *m.dc, prompt);
    EXPECT_LT(e, 5e-2) << "CUDA vs CPU FP8 draft logits, " << name;
    std::printf("[ fp8 dflash (%s): CUDA vs CPU draft logits rel err %.2e ]\n", name.c_str(), e);

    for (const std::vector<int32_t>& p : {std::vector<int32_t>{1}, prompt}) {
      GenerateStats st;
      ASSERT_NO_FATAL_FAILURE(expect_lossless(*m.g, *m.dg, p, "FP8 drafter " + name, &st));
      std::printf("[ fp8 dflash (%s) on GPU: acceptance length %.2f over %lld steps ]\n",
                  name.c_str(), st.acceptance_length(), static_cast<long long>(st.steps));
    }
  }
#ifdef BLOCKSPEC_HAS_CUDA
  cuda::set_fp8_kernel(*gpu_, cuda::Fp8Kernel::kV1);  // the default again
#endif
}

// DFlash with a restricted draft vocabulary (d2t of 128 ids, written at test time from the
// stories260K drafter), BF16 and FP8 weights: the GPU's draft logits follow the CPU's, are -inf
// exactly outside the draft vocabulary, their argmax (the greedy draft) is the CPU's wherever the
// CPU's margin is clear and lies inside the draft vocabulary; greedy speculative == plain.
TEST_F(CudaModels, DraftVocabDFlashMatchesCpuAndIsLossless) {
  test_util::TempDir tmp;
  const std::string src = std::string(BS_TEST_DATA) + "/dflash-stories260K";
  const std::vector<int32_t> hot = test_util::stories_draft_vocab(/*shuffled=*/true);
  std::vector<int64_t> d2t = test_util::d2t_offsets(hot);
  nlohmann::json config;
  std::ifstream(src + "/config.json") >> config;
  config["draft_vocab_size"] = hot.size();
  const std::string dir = tmp.file("dv");
  test_util::write_drafter_variant(src, dir, config, {{"d2t", DType::kI64, {128}, d2t.data()}});
  auto g = load_target(kStories, *gpu_);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto c = load_target(kStories, *cpu_);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::vector<int32_t> prompt = random_prompt(5);
  std::vector<char> in(512, 0);
  for (int32_t t : hot) in[t] = 1;
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    auto dg = load_drafter(dir, **g, {.fp8_weights = fp8});
    ASSERT_TRUE(dg.ok()) << dg.status().message();
    auto dc = load_drafter(dir, **c, {.fp8_weights = fp8});
    ASSERT_TRUE(dc.ok()) << dc.status().message();
    const DraftRun rg = draft_once(**g, **dg, prompt), rc = draft_once(**c, **dc, prompt);
    ASSERT_TRUE(rg.ok && rc.ok);
    const double e = rel_err(rg.logits, rc.logits);  // inf unless the -inf columns agree
    EXPECT_LT(e, 5e-2) << "CUDA vs CPU restricted draft logits";
    std::printf("[ d2t dflash (%s): CUDA vs CPU draft logits rel err %.2e ]\n",
                fp8 ? "fp8" : "bf16", e);
    const int64_t rows = static_cast<int64_t>(rc.logits.size()) / 512;
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t ag = argmax_row(rg.logits, r, 512), ac = argmax_row(rc.logits, r, 512);
      EXPECT_TRUE(in[ag]) << "row " << r << ": GPU draft " << ag << " outside the draft vocabulary";
      if (top2_margin(rc.logits, r, 512) > 0.05f) {
        EXPECT_EQ(ag, ac) << "row " << r;
      }
    }
    GenerateOptions opt;
    opt.max_tokens = 100;
    auto plain = generate_plain(**g, prompt, opt, nullptr, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    GenerateStats st;
    auto spec = generate_speculative(**g, **dg, prompt, opt, nullptr, &st);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(*spec, *plain) << "d2t drafter: speculative != plain on the GPU";
    EXPECT_GT(st.drafted, 0);
  }
}

// The stories260K target and the drafter of <source dir>/<param>, each on the GPU and on the CPU
// (m_); skipped when that test data is absent.
class CudaDrafterData : public CudaModels, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    CudaModels::SetUp();
    if (IsSkipped()) return;
    const std::string dir = std::string(BS_SOURCE_DIR) + "/" + GetParam();
    if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "no drafter test data at " << dir;
    ASSERT_NO_FATAL_FAILURE(load_pair(dir, {}, &m_));
  }
  ModelPair m_;
};

// The parameter's last path component with '-' as '_' (a GoogleTest name).
std::string data_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  s = s.substr(s.rfind('/') + 1);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

class CudaDrafters : public CudaDrafterData {};

TEST_P(CudaDrafters, ProposalsMatchCpuAndSpeculativeIsLossless) {
  const double e = draft_logits_rel_err(*m_.g, *m_.dg, *m_.c, *m_.dc, random_prompt(3));
  EXPECT_LT(e, 5e-2) << GetParam() << ": CUDA vs CPU draft logits";
  std::printf("[ %s: CUDA vs CPU draft logits rel err %.2e ]\n", GetParam(), e);

  // Greedy speculative decoding on the GPU must produce plain greedy decoding's tokens.
  GenerateStats st;
  ASSERT_NO_FATAL_FAILURE(expect_lossless(*m_.g, *m_.dg, {1}, GetParam(), &st));
  std::printf("[ %s on GPU: acceptance length %.2f over %lld steps ]\n", GetParam(),
              st.acceptance_length(), static_cast<long long>(st.steps));
}

INSTANTIATE_TEST_SUITE_P(Data, CudaDrafters, ::testing::ValuesIn(kDrafters), data_name);

// DSpark / DFlash2 on the GPU, through the fused Backend::markov_row / candidate_walk: the greedy
// chain's rows against the CPU's (their drafts equal; values over the entries finite on both),
// greedy speculative == plain, and a sampled speculative run (the sampled walk and its q).
class CudaRelatives : public CudaDrafterData {};

TEST_P(CudaRelatives, ChainMatchesCpuAndSpeculativeIsLossless) {
  const int64_t V = m_.g->config().vocab_size;
  for (const uint32_t seed : {3u, 5u, 8u}) {
    const DraftRun rg = draft_once(*m_.g, *m_.dg, random_prompt(seed));
    const DraftRun rc = draft_once(*m_.c, *m_.dc, random_prompt(seed));
    ASSERT_TRUE(rg.ok && rc.ok);
    ASSERT_EQ(rg.logits.size(), rc.logits.size());
    const int64_t rows = static_cast<int64_t>(rc.logits.size()) / V;
    // The rows up to the first draft that differs (each row depends on the previous draft). The
    // GPU's activations are BF16, so a draft may differ where the two best scores of a row are
    // close: that row must hold a near tie on one side.
    std::vector<float> a, b;
    int64_t same = 0;
    for (; same < rows; ++same) {
      const int32_t ig = argmax_row(rg.logits, same, V), ic = argmax_row(rc.logits, same, V);
      const float* gr = rg.logits.data() + same * V;
      const float* cr = rc.logits.data() + same * V;
      if (ig != ic) {
        const float tol = 0.1f * std::max(1.0f, std::fabs(cr[ic]));
        const bool near_tie = (std::isfinite(cr[ig]) && cr[ic] - cr[ig] <= tol) ||
                              (std::isfinite(gr[ic]) && gr[ig] - gr[ic] <= tol);
        // A restricted row (DFlash2's top-K candidates, the rest -inf) may also part at the
        // K-th place: near-equal unary logits (bf16 activations) put a different token last. Then
        // one side's draft is not a candidate of the other, and the two candidate sets still share
        // all but a few entries (a boundary swap, not a different row).
        int64_t only_g = 0, only_c = 0;
        for (int64_t i = 0; i < V; ++i) {
          only_g += std::isfinite(gr[i]) && !std::isfinite(cr[i]);
          only_c += std::isfinite(cr[i]) && !std::isfinite(gr[i]);
        }
        const bool cut_swap = (!std::isfinite(cr[ig]) || !std::isfinite(gr[ic])) && only_g <= 2 &&
                              only_c <= 2 && only_g == only_c;
        EXPECT_TRUE(near_tie || cut_swap)
            << GetParam() << " seed " << seed << " row " << same << ": GPU draft " << ig
            << " vs CPU " << ic << " without a near tie (" << only_g << " GPU-only and " << only_c
            << " CPU-only candidates)";
        break;
      }
      for (int64_t i = 0; i < V; ++i) {
        if (std::isfinite(gr[i]) && std::isfinite(cr[i])) {
          a.push_back(gr[i]);
          b.push_back(cr[i]);
        }
      }
    }
    const double e = rel_err(a, b);
    EXPECT_LT(e, 5e-2) << GetParam() << ": CUDA vs CPU chain rows";
    std::printf("[ %s seed %u: %lld of %lld drafts equal, rows rel err %.2e ]\n", GetParam(), seed,
                static_cast<long long>(same), static_cast<long long>(rows), e);
  }
  const std::vector<int32_t> bos = {1};
  GenerateStats st;
  ASSERT_NO_FATAL_FAILURE(expect_lossless(*m_.g, *m_.dg, bos, GetParam(), &st));
  GenerateOptions opt;
  opt.max_tokens = 100;
  opt.sampling.temperature = 0.8f;
  opt.sampling.top_k = 20;
  opt.sampling.seed = 7;
  GenerateStats sst;
  auto sampled = generate_speculative(*m_.g, *m_.dg, bos, opt, nullptr, &sst);
  ASSERT_TRUE(sampled.ok()) << sampled.status().message();
  EXPECT_FALSE(sampled->empty());
  for (int32_t t : *sampled) EXPECT_TRUE(t >= 0 && t < V);
  std::printf("[ %s on GPU: greedy acceptance length %.2f, sampled %.2f ]\n", GetParam(),
              st.acceptance_length(), sst.acceptance_length());
}

// Drafter directories under the source tree. DFlash2 is checked with the shipped trained drafter,
// not the random one of tests/data: with random weights and the stories260K LM head, ~250 byte
// tokens have unary logits within ~2e-3 of each other and that clump fills the top-16 from block
// row 2 on, so the candidate set is decided by rounding noise (on the H200, 8-14 of the 16
// candidates differ between the GPU's bf16 activations and the CPU's fp32 ones: session 9). The
// walk kernel itself is compared with the CPU on identical inputs
// (CudaOps.CandidateWalkMatchesCpu).
const char* kRelatives[] = {"tests/data/dspark-stories260K", "models/stories260K-dspark",
                            "models/stories260K-dflash2"};
INSTANTIATE_TEST_SUITE_P(Data, CudaRelatives, ::testing::ValuesIn(kRelatives), data_name);

}  // namespace
}  // namespace bs
