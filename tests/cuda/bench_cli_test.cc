// Smoke test of `blockspec synth` and `blockspec bench` on the CPU (runs everywhere, GPU or not):
// a tiny synthetic checkpoint with a forced-acceptance drafter, then the benchmark with
// std::chrono timing. On a GPU machine the same bench also runs with --device cuda. The FlashMap
// drafters of `synth` (forced 100% and 0%) are checked end to end through bench and generate,
// and the qwen3-8b preset's FlashMap shape through a dry run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"

namespace bs {
namespace {

namespace fs = std::filesystem;

// Runs a shell command; returns its exit status and stdout+stderr.
int run(const std::string& cmd, std::string* output) {
  const fs::path log =
      fs::temp_directory_path() / ("bs_bench_test_" + std::to_string(getpid()) + ".log");
  const int rc = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  *output = ss.str();
  fs::remove(log);
  return rc;
}

// The speculative end-to-end line of a forced-acceptance (100%) drafter: every draft offered is
// accepted, and the output is plain decoding's.
void expect_forced_acceptance(const std::string& out) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("drafts accepted (\\d+)/(\\d+)"))) << out;
  EXPECT_EQ(m[1].str(), m[2].str()) << out;
  EXPECT_GT(std::stoi(m[2].str()), 0) << out;
  EXPECT_NE(out.find("output == plain"), std::string::npos) << out;
}

// The first "(\\d+)" group of `pattern` in `out` as a number (-1 when absent).
int64_t capture_int(const std::string& out, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(pattern))) return -1;
  return std::stoll(m[1].str());
}

// A forced-0% drafter: drafts were offered, none accepted, one token committed per step.
void expect_zero_acceptance(const std::string& out) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("drafts accepted (\\d+)/(\\d+)"))) << out;
  EXPECT_EQ(m[1].str(), "0") << out;
  EXPECT_GT(std::stoi(m[2].str()), 0) << out;
  EXPECT_NE(out.find("acceptance length 1.00 "), std::string::npos) << out;
  EXPECT_NE(out.find("output == plain"), std::string::npos) << out;
}

// A forced drafter's bench output: every draft accepted (acc 100) or none (acc 0).
void expect_forced(const std::string& out, int acc) {
  if (acc == 100) {
    expect_forced_acceptance(out);
  } else {
    expect_zero_acceptance(out);
  }
}

// `generate` of the synthetic target `dir` with the forced drafter `ddir` (acceptance `acc`, 100
// or 0): the output line is `plain`'s, and every draft (100) or none (0) is accepted.
void expect_forced_generate(const std::string& dir, const std::string& ddir, int acc,
                            const std::string& plain) {
  std::string out;
  ASSERT_EQ(run(std::string(BS_BINARY_DIR) + "/blockspec generate --model " + dir + " --drafter " +
                    ddir + " --device cpu --threads 2 --prompt 'Hello' --max-tokens 40",
                &out),
            0)
      << out;
  EXPECT_EQ(out.substr(0, out.find('\n')), plain.substr(0, plain.find('\n'))) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("(\\d+)/(\\d+) drafts accepted"))) << out;
  EXPECT_GT(std::stoi(m[2].str()), 0) << out;
  EXPECT_EQ(m[1].str(), acc == 100 ? m[2].str() : "0") << out;
}

class BenchCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("bs_synth_" + std::to_string(getpid()))).string();
    std::string out;
    const int rc =
        run(bin() + " synth --preset tiny --out " + dir_ + " --drafter dflash-b16 --acceptance 100",
            &out);
    ASSERT_EQ(rc, 0) << out;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::remove_all(dir_ + "-dflash-b16-acc100", ec);
  }
  static std::string bin() { return std::string(BS_BINARY_DIR) + "/blockspec"; }
  // `blockspec bench` of the tiny checkpoint on the CPU; `args` follow the common options.
  static int bench_on_cpu(const std::string& args, std::string* out) {
    return run(bin() + " bench --model " + dir_ + " --device cpu --threads 2 --copy-mb 16 " + args,
               out);
  }
  static std::string dir_;
};
std::string BenchCli::dir_;

TEST_F(BenchCli, PlainBenchOnCpu) {
  std::string out;
  const int rc = run(bin() + " bench --model " + dir_ +
                         " --device cpu --threads 2 --context 48 --iters 3 --warmup 1 "
                         "--gen-tokens 8 --copy-mb 16",
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("decode step"), std::string::npos) << out;
  EXPECT_NE(out.find("verify step"), std::string::npos) << out;
  EXPECT_NE(out.find("generate (plain)"), std::string::npos) << out;
}

TEST_F(BenchCli, BatchedDecodeBenchOnCpu) {
  std::string out;
  const int rc = run(bin() + " bench --model " + dir_ +
                         " --device cpu --threads 2 --batch 4 --context 40 --iters 3 --warmup 1 "
                         "--gen-tokens 8 --copy-mb 16",
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("batch decode step (4 sequences x 1 token)"), std::string::npos) << out;
  // 4 sequences x 8 tokens, all generated (no stop tokens in the options).
  EXPECT_NE(out.find("generate (plain, batch 4): 32 tokens"), std::string::npos) << out;
  // Bad values are refused with a message.
  ASSERT_NE(run(bin() + " bench --model " + dir_ + " --device cpu --batch 0", &out), 0);
  EXPECT_NE(out.find("--batch 0"), std::string::npos) << out;
}

// --prompt-tokens sets the end-to-end runs' prompt length (default min(32, --context)), longer
// than the timed context too; --kernels with --batch times the batched decode step's ops.
TEST_F(BenchCli, BatchedBenchPromptTokensAndKernels) {
  std::string out;
  ASSERT_EQ(bench_on_cpu("--batch 3 --context 40 --iters 2 --warmup 1 --gen-tokens 4", &out), 0)
      << out;
  EXPECT_NE(out.find("generate (plain, batch 3): 12 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("tok/s; prompts of 32 tokens"), std::string::npos) << out;
  ASSERT_EQ(bench_on_cpu("--batch 3 --context 40 --iters 2 --warmup 1 --gen-tokens 4 "
                         "--prompt-tokens 50 --kernels",
                         &out),
            0)
      << out;
  EXPECT_NE(out.find("generate (plain, batch 3): 12 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("tok/s; prompts of 50 tokens; "), std::string::npos) << out;
  EXPECT_NE(out.find(" tok/s end to end (prefill "), std::string::npos) << out;
  EXPECT_NE(out.find("kernels, batched decode step (3 sequences x 1 row, 40 cached tokens each)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("prologue+attention (fused, as the decoder)"), std::string::npos) << out;
  EXPECT_NE(out.find("attention over 41 keys in each of 3 sequences"), std::string::npos) << out;
  EXPECT_NE(out.find("batched step from its ops"), std::string::npos) << out;
  // One sequence: the plain run's prompt too.
  ASSERT_EQ(
      bench_on_cpu("--context 40 --iters 2 --warmup 1 --gen-tokens 4 --prompt-tokens 7", &out), 0)
      << out;
  EXPECT_NE(out.find("tok/s; prompt of 7 tokens"), std::string::npos) << out;
  // With the prefill counted the rate is lower (the same tokens over a longer time).
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(out, m,
                        std::regex(R"(generate \(plain\): 4 tokens in [\d.]+ s -> ([\d.]+) )"
                                   R"(tok/s; prompt of 7 tokens; ([\d.]+) tok/s end to end )"
                                   R"(\(prefill ([\d.]+) ms\))")))
      << out;
  EXPECT_LT(std::stod(m[2].str()), std::stod(m[1].str())) << out;
  EXPECT_GT(std::stod(m[3].str()), 0.0) << out;
  // Bad values are refused with a message naming the flag.
  ASSERT_NE(bench_on_cpu("--batch 2 --prompt-tokens 0", &out), 0);
  EXPECT_NE(out.find("--prompt-tokens: must be at least 1"), std::string::npos) << out;
  ASSERT_NE(bench_on_cpu("--batch 2 --prompt-tokens 4096", &out), 0);
  EXPECT_NE(out.find("--prompt-tokens 4096: the model's context window (4096 positions)"),
            std::string::npos)
      << out;
}

TEST_F(BenchCli, SpeculativeBenchWithForcedAcceptance) {
  std::string out;
  const int rc = run(bin() + " bench --model " + dir_ + " --drafter " + dir_ +
                         "-dflash-b16-acc100 --device cpu --threads 2 --context 48 --iters 2 "
                         "--warmup 1 --gen-tokens 40 --copy-mb 16",
                     &out);
  if (rc != 0 && out.find("not implemented") != std::string::npos) {
    GTEST_SKIP() << "drafter or speculative loop not implemented yet: " << out;
  }
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("draft step"), std::string::npos) << out;
  expect_forced_acceptance(out);
}

TEST_F(BenchCli, BatchedSpeculativeBenchOnCpu) {
  std::string out;
  ASSERT_EQ(bench_on_cpu("--drafter " + dir_ +
                             "-dflash-b16-acc100 --batch 3 --context 40 --iters 2 --warmup 1 "
                             "--gen-tokens 24",
                         &out),
            0)
      << out;
  EXPECT_NE(out.find("batch verify step (3 sequences x 16 rows"), std::string::npos) << out;
  EXPECT_NE(out.find("generate (speculative, batch 3): 72 tokens"), std::string::npos) << out;
  expect_forced_acceptance(out);
}

TEST_F(BenchCli, BenchOnGpuWhenPresent) {
  auto be = make_backend("cuda");
  if (!be.ok()) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
  be->reset();
  std::string out;
  const int rc = run(bin() + " bench --model " + dir_ + " --device cuda --context 48 --iters 3 " +
                         "--warmup 1 --gen-tokens 8 --copy-mb 64",
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("decode step (pinned cuBLASLt)"), std::string::npos) << out;
}

// `blockspec synth --drafter flashmap-b16` at forced acceptance 100% and 0% (tiny preset).
class SynthFlashMap : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("bs_synth_fm_" + std::to_string(getpid()))).string();
    for (const char* acc : {"100", "0"}) {
      std::string out;
      const int rc = run(bin() + " synth --preset tiny --out " + dir_ +
                             " --drafter flashmap-b16 --acceptance " + acc,
                         &out);
      ASSERT_EQ(rc, 0) << out;
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    for (const char* suffix : {"", "-flashmap-b16-acc100", "-flashmap-b16-acc0"}) {
      fs::remove_all(dir_ + suffix, ec);
    }
  }
  static std::string bin() { return std::string(BS_BINARY_DIR) + "/blockspec"; }
  static std::string drafter(int acc) { return dir_ + "-flashmap-b16-acc" + std::to_string(acc); }
  // `blockspec bench` of the tiny target with the FlashMap drafter forced to `acc`, on the CPU.
  static int bench(int acc, const std::string& args, std::string* out) {
    return run(bin() + " bench --model " + dir_ + " --drafter " + drafter(acc) +
                   " --device cpu --threads 2 --copy-mb 16 --context 40 --iters 2 --warmup 1 " +
                   args,
               out);
  }
  static std::string dir_;
};
std::string SynthFlashMap::dir_;

TEST_F(SynthFlashMap, FullAcceptanceWithNoiseForOneAndTwoJumps) {
  // Noise on (scale 1, the default); 1 jump runs the folded path, 2 jumps the exact one.
  for (const char* steps : {"1", "2"}) {
    SCOPED_TRACE(std::string("jumps ") + steps);
    std::string out;
    ASSERT_EQ(bench(100, std::string("--gen-tokens 64 --flashmap-steps ") + steps, &out), 0) << out;
    // Every step of the timed parts ran with FlashMap's shapes: 16 drafts, 17 verify rows.
    EXPECT_NE(out.find("verify step (17 rows, taps)"), std::string::npos) << out;
    EXPECT_NE(out.find("context update (17 positions)"), std::string::npos) << out;
    EXPECT_NE(out.find("draft step (16 drafts)"), std::string::npos) << out;
    expect_forced_acceptance(out);
    // 64 tokens in full blocks of 17: several steps, every one accepting all 16 drafts.
    EXPECT_GE(capture_int(out, "over (\\d+) steps"), 3) << out;
    EXPECT_GE(capture_int(out, "drafts accepted (\\d+)/"), 48) << out;
  }
}

TEST_F(SynthFlashMap, FullAcceptanceInABatch) {
  std::string out;
  ASSERT_EQ(bench(100, "--batch 2 --gen-tokens 40 --flashmap-steps 2", &out), 0) << out;
  EXPECT_NE(out.find("batch verify step (2 sequences x 17 rows"), std::string::npos) << out;
  EXPECT_NE(out.find("generate (speculative, batch 2): 80 tokens"), std::string::npos) << out;
  expect_forced_acceptance(out);
}

TEST_F(SynthFlashMap, ZeroAcceptanceWithNoiseForOneAndTwoJumps) {
  for (const char* args : {"--flashmap-steps 1", "--flashmap-steps 2 --flashmap-noise-scale 3"}) {
    SCOPED_TRACE(args);
    std::string out;
    ASSERT_EQ(bench(0, std::string("--gen-tokens 24 ") + args, &out), 0) << out;
    expect_zero_acceptance(out);
    EXPECT_EQ(capture_int(out, "over (\\d+) steps"), 23) << out;  // the first token: prefill
  }
}

TEST_F(SynthFlashMap, GenerateEqualsPlainOutput) {
  // The synthetic target ships a tokenizer: generate prints the forced token's text.
  std::string plain;
  ASSERT_EQ(run(bin() + " generate --model " + dir_ +
                    " --no-drafter --device cpu --threads 2 --prompt 'Hello' --max-tokens 40",
                &plain),
            0)
      << plain;
  const std::string text = plain.substr(0, plain.find('\n'));
  EXPECT_NE(text.find("<|favoured|><|favoured|>"), std::string::npos) << plain;
  for (int acc : {100, 0}) {
    SCOPED_TRACE(acc);
    std::string out;
    ASSERT_EQ(run(bin() + " generate --model " + dir_ + " --drafter " + drafter(acc) +
                      " --device cpu --threads 2 --prompt 'Hello' --max-tokens 40 --seed 7 "
                      "--flashmap-steps 2",
                  &out),
              0)
        << out;
    EXPECT_EQ(out.substr(0, out.find('\n')), text) << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("(\\d+)/(\\d+) drafts accepted"))) << out;
    EXPECT_GT(std::stoi(m[2].str()), 0) << out;
    EXPECT_EQ(m[1].str(), acc == 100 ? m[2].str() : "0") << out;
  }
}

TEST_F(SynthFlashMap, FullAndZeroAcceptanceOnGpuWhenPresent) {
  auto be = make_backend("cuda");
  if (!be.ok()) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
  be->reset();
  for (int acc : {100, 0}) {
    SCOPED_TRACE(acc);
    std::string out;
    ASSERT_EQ(run(bin() + " bench --model " + dir_ + " --drafter " + drafter(acc) +
                      " --device cuda --context 48 --iters 3 --warmup 1 --gen-tokens 40 "
                      "--copy-mb 64 --gemv auto --flashmap-steps " +
                      (acc ? "1" : "2"),
                  &out),
              0)
        << out;
    expect_forced(out, acc);
  }
}

TEST_F(SynthFlashMap, Qwen3_8bShapeInADryRun) {
  const std::string out_dir = dir_ + "-q8";
  std::string out;
  ASSERT_EQ(run(bin() + " synth --preset qwen3-8b --out " + out_dir +
                    " --drafter flashmap-b16 --acceptance 0 --dry-run",
                &out),
            0)
      << out;
  EXPECT_FALSE(fs::exists(out_dir)) << "a dry run writes nothing";
  EXPECT_FALSE(fs::exists(out_dir + "-flashmap-b16-acc0"));
  // Qwen3-8B itself: 8.19B parameters (untied LM head).
  const int64_t target = capture_int(out, "preset qwen3-8b.*: \\d+ tensors, (\\d+) parameters");
  EXPECT_GT(target, 8'150'000'000) << out;
  EXPECT_LT(target, 8'250'000'000) << out;
  // The drafter: ~500M like j-shen/FlashMap-Qwen3-8B (docs/FLASHMAP.md, "Synthetic checkpoints").
  const int64_t params =
      capture_int(out, "flashmap-b16, forced acceptance 0%\\): \\d+ tensors, (\\d+) parameters");
  EXPECT_GT(params, 490'000'000) << out;
  EXPECT_LT(params, 510'000'000) << out;
  const size_t at = out.find("drafter config: ");
  ASSERT_NE(at, std::string::npos) << out;
  const auto cfg = nlohmann::json::parse(out.substr(at + 16, out.find('\n', at) - at - 16));
  EXPECT_EQ(cfg["architectures"][0], "FlashMapDraftModel");
  EXPECT_EQ(cfg["hidden_size"], 2048);
  EXPECT_EQ(cfg["target_hidden_size"], 4096);
  EXPECT_EQ(cfg["num_hidden_layers"], 6);
  EXPECT_EQ(cfg["num_attention_heads"], 16);
  EXPECT_EQ(cfg["head_dim"], 128);
  EXPECT_EQ(cfg["intermediate_size"], 8192);
  EXPECT_EQ(cfg["timestep_embed_dim"], 256);
  EXPECT_EQ(cfg["block_size"], 16);
  EXPECT_EQ(cfg["vocab_size"], 151936);
  EXPECT_EQ(cfg["eagle_aux_hidden_state_layer_ids"], nlohmann::json({2, 10, 18, 26, 34}));
  EXPECT_EQ(cfg["num_steps"], 1);
}

TEST_F(SynthFlashMap, UnknownDrafterNamesTheKnownOnes) {
  std::string out;
  EXPECT_NE(run(bin() + " synth --preset tiny --out " + dir_ + "-x --drafter dspark", &out), 0);
  EXPECT_NE(out.find("dflash-b16, dspark-b7, dflash2-b16, flashmap-b16"), std::string::npos) << out;
}

// Writes the tiny synthetic target into a temporary `dir` with each of synth's DSpark (7 drafts
// per step) and DFlash2 (15) drafters at forced 100 % and 0 % acceptance, and calls
// check(dir, drafter dir, acceptance) for each; removes them afterwards.
void for_each_synth_relative(
    const std::string& tag,
    const std::function<void(const std::string&, const std::string&, int)>& check) {
  const std::string dir =
      (fs::temp_directory_path() / ("bs_synth_" + tag + "_" + std::to_string(getpid()))).string();
  const std::string bin = std::string(BS_BINARY_DIR) + "/blockspec";
  for (const char* drafter : {"dspark-b7", "dflash2-b16"}) {
    for (int acc : {100, 0}) {
      SCOPED_TRACE(std::string(drafter) + " " + std::to_string(acc));
      std::string out;
      ASSERT_EQ(run(bin + " synth --preset tiny --out " + dir + " --drafter " + drafter +
                        " --acceptance " + std::to_string(acc),
                    &out),
                0)
          << out;
      const std::string ddir = dir + "-" + drafter + "-acc" + std::to_string(acc);
      check(dir, ddir, acc);
      std::error_code ec;
      fs::remove_all(ddir, ec);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// synth's DSpark and DFlash2 drafters force 100 % / 0 % acceptance too, and generate's output
// equals the plain one.
TEST(SynthRelatives, ForcedAcceptanceAndPlainOutput) {
  std::string plain;
  for_each_synth_relative("rel", [&](const std::string& dir, const std::string& ddir, int acc) {
    if (plain.empty()) {
      ASSERT_EQ(run(std::string(BS_BINARY_DIR) + "/blockspec generate --model " + dir +
                        " --no-drafter --device cpu --threads 2 --prompt 'Hello' --max-tokens 40",
                    &plain),
                0)
          << plain;
    }
    expect_forced_generate(dir, ddir, acc, plain);
  });
}

// The same drafters on the GPU, where the tiny preset's hidden size (256) takes DFlash2's fused
// convolution kernels (the projection's K-slice partials summed by the prepare convolution, the
// finish convolution and the RMSNorm after it in one launch; the test drafters of hidden 64 run
// the ops apart): bench's speculative output equals its plain one, every draft accepted at 100 %
// and none at 0 %.
TEST(SynthRelatives, ForcedAcceptanceOnGpuWhenPresent) {
  auto be = make_backend("cuda");
  if (!be.ok()) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
  be->reset();
  for_each_synth_relative("relgpu", [](const std::string& dir, const std::string& ddir, int acc) {
    std::string out;
    ASSERT_EQ(
        run(std::string(BS_BINARY_DIR) + "/blockspec bench --model " + dir + " --drafter " + ddir +
                " --device cuda --context 48 --iters 3 --warmup 1 --gen-tokens 40 "
                "--copy-mb 64 --gemv auto",
            &out),
        0)
        << out;
    expect_forced(out, acc);
  });
}

// synth --draft-vocab N: the DFlash drafter ships d2t (N distinct sorted target ids holding both
// forced tokens) and draft_vocab_size N, and keeps its forced 100 % / 0 % acceptance with plain
// decoding's output; other drafters and out-of-range N are refused.
TEST(SynthDraftVocab, RestrictedDFlashKeepsForcedAcceptance) {
  const std::string dir =
      (fs::temp_directory_path() / ("bs_synth_dv_" + std::to_string(getpid()))).string();
  const std::string bin = std::string(BS_BINARY_DIR) + "/blockspec";
  std::string plain, out;
  for (int acc : {100, 0}) {
    SCOPED_TRACE(acc);
    ASSERT_EQ(run(bin + " synth --preset tiny --out " + dir +
                      " --drafter dflash-b16 --draft-vocab 300 --acceptance " + std::to_string(acc),
                  &out),
              0)
        << out;
    const std::string ddir = dir + "-dflash-b16-acc" + std::to_string(acc);
    std::ifstream cf(ddir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(cf)["draft_vocab_size"], 300);
    auto ckpt = io::Checkpoint::open(ddir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    auto d2t = ckpt->get("d2t", {300});
    ASSERT_TRUE(d2t.ok()) << d2t.status().message();
    ASSERT_EQ((*d2t)->dtype, DType::kI64);
    std::vector<int64_t> off(300);
    std::memcpy(off.data(), (*d2t)->data, sizeof(int64_t) * 300);
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < 300; ++j) ids.push_back(j + off[j]);
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
    EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
    EXPECT_GE(ids.front(), 0);
    EXPECT_LT(ids.back(), 4096);
    for (int64_t forced : {1000, 2000}) {
      EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), forced)) << forced;
    }
    if (plain.empty()) {
      ASSERT_EQ(run(bin + " generate --model " + dir +
                        " --no-drafter --device cpu --threads 2 --prompt 'Hello' --max-tokens 40",
                    &plain),
                0)
          << plain;
    }
    expect_forced_generate(dir, ddir, acc, plain);
    std::error_code ec;
    fs::remove_all(ddir, ec);
  }
  EXPECT_NE(run(bin + " synth --preset tiny --out " + dir + " --drafter dspark-b7 --draft-vocab 64",
                &out),
            0);
  EXPECT_NE(out.find("--draft-vocab needs --drafter dflash-b16"), std::string::npos) << out;
  EXPECT_NE(
      run(bin + " synth --preset tiny --out " + dir + " --drafter dflash-b16 --draft-vocab 4096",
          &out),
      0);
  EXPECT_NE(out.find("--draft-vocab 4096 must be in [2, 4096)"), std::string::npos) << out;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace bs
