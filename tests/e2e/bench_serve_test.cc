// `blockspec bench-serve` against a real `blockspec serve` (stories260K on the CPU): the report's
// counts add up (every request completed, the tokens asked for were streamed), and an unreachable
// server is a clean failure.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

namespace {

const std::string kBin = std::string(BS_BINARY_DIR) + "/blockspec";
const std::string kModel = std::string(BS_SOURCE_DIR) + "/models/stories260K";

// A `blockspec serve` child on a free port; stopped (SIGTERM, then waited for) on destruction.
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& args) {
    log_ = std::string(BS_BINARY_DIR) + "/bench_serve_test_" + std::to_string(getpid()) + ".log";
    pid_ = fork();
    if (pid_ == 0) {
      const std::string cmd = "exec " + kBin + " serve --port 0 " + args + " 2> " + log_;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Waits for the listening line (the port is chosen by the server).
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream f(log_);
      std::stringstream ss;
      ss << f.rdbuf();
      log_text_ = ss.str();
      std::smatch m;
      if (std::regex_search(log_text_, m, std::regex("listening on http://[^:]+:(\\d+)"))) {
        port_ = std::stoi(m[1].str());
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(log_.c_str());
  }
  int port() const { return port_; }
  const std::string& log() const { return log_text_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_, log_text_;
};

// Runs the CLI; returns its exit status and stdout.
int run(const std::string& args, std::string* out) {
  FILE* p = popen((kBin + " " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(BenchServe, ReportCountsAddUpAgainstServe) {
  ServeProcess serve("--model " + kModel + " --no-drafter --device cpu --threads 1");
  ASSERT_GT(serve.port(), 0) << serve.log();
  // 6 requests from 3 clients, 12-token prompts, 9 tokens each (ids within stories260K's 512).
  std::string out;
  const int rc = run("bench-serve --port " + std::to_string(serve.port()) +
                         " --clients 3 --requests 6 --prompt-tokens 12 --output-tokens 9"
                         " --token-range 3 500 --json",
                     &out);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["requests"], 6);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["input_tokens"], 6 * 12);
  EXPECT_EQ(j["output_tokens"], 6 * 9);
  EXPECT_GT(j["output_chunks"].get<int64_t>(), 0);
  EXPECT_LE(j["output_chunks"].get<int64_t>(), 6 * 9);
  EXPECT_GT(j["output_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["ttft_ms"]["p50"].get<double>(), 0.0);
  EXPECT_LE(j["ttft_ms"]["p50"].get<double>(), j["ttft_ms"]["p99"].get<double>());
  EXPECT_LE(j["ttft_ms"]["p99"].get<double>(), j["e2e_latency_ms"]["p99"].get<double>());
  EXPECT_GT(j["tpot_ms"]["mean"].get<double>(), 0.0);
  // The decode rate is the clients over the mean time per output token.
  EXPECT_NEAR(j["decode_tokens_per_s"].get<double>(), 3 * 1e3 / j["tpot_ms"]["mean"].get<double>(),
              1e-6 * j["decode_tokens_per_s"].get<double>());

  // Random lengths (range ratio) and the human-readable table.
  out.clear();
  ASSERT_EQ(run("bench-serve --port " + std::to_string(serve.port()) +
                    " --clients 2 --requests 4 --prompt-tokens 10 --output-tokens 6"
                    " --range-ratio 0.5 --seed 3",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("completed 4 / failed 0"), std::string::npos) << out;
  EXPECT_NE(out.find("TTFT"), std::string::npos) << out;
  EXPECT_NE(out.find("ITL"), std::string::npos) << out;
}

TEST(BenchServe, NoServerIsAFailureNotAHang) {
  std::string out;
  // Port 1 has no server: every request fails, exit status 2, and the report says why.
  EXPECT_EQ(run("bench-serve --port 1 --clients 2 --requests 2 --output-tokens 4", &out), 2) << out;
  EXPECT_NE(out.find("completed 0 / failed 2"), std::string::npos) << out;
  EXPECT_NE(out.find("first error"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run("bench-serve --port 1 --wait 0.5", &out), 1) << out;
  EXPECT_NE(out.find("/health"), std::string::npos) << out;
}

}  // namespace
