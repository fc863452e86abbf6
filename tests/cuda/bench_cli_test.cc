// Smoke test of `blockspec synth` and `blockspec bench` on the CPU (runs everywhere, GPU or not):
// a tiny synthetic checkpoint with a forced-acceptance drafter, then the benchmark with
// std::chrono timing. On a GPU machine the same bench also runs with --device cuda.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "backend/backend.h"

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

}  // namespace
}  // namespace bs
