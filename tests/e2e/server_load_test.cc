// Issue 18's load and fault protocol against a running `blockspec serve` (any backend: the GPU
// run is tools/device/run_gpu_load.sh): waves of concurrent clients mixing streaming and
// non-streaming requests, prompt lengths up to the context window, greedy and seeded sampling,
// 20 % of the clients leaving mid-stream. Nothing may be lost (every client that stays gets a 200
// with a complete reply), every greedy output must equal what the same server answers for that
// request alone, the server must end each wave idle and healthy, and its resident memory must not
// grow from one wave to the next. The in-process CPU version is
// Server.LoadAndFaultTwoWavesOf256Clients (server_test.cc); this driver needs a server and skips
// without one.
//
// Environment (only BLOCKSPEC_LOAD_PORT is required):
//   BLOCKSPEC_LOAD_PORT            port of the server on 127.0.0.1
//   BLOCKSPEC_LOAD_CLIENTS         concurrent clients per wave (256)
//   BLOCKSPEC_LOAD_WAVES           waves (2)
//   BLOCKSPEC_LOAD_MAX_MODEL_LEN   the server's context window; when set, BLOCKSPEC_LOAD_LONG (4)
//                                  cases have prompts that end 0, 1, 63, 1500, ... tokens (at most
//                                  a quarter of it) short of it, less their 8 generated tokens;
//                                  each wave sends each once
//   BLOCKSPEC_LOAD_VOCAB           prompt token ids are drawn from [3, vocab) (30000)
//   BLOCKSPEC_LOAD_MAX_PROMPT      longest short prompt in tokens (3000)
//   BLOCKSPEC_LOAD_PID             the server's pid: its VmRSS is read after each wave
//   BLOCKSPEC_LOAD_RSS_GROWTH_MIB  allowed growth of that RSS over the second wave (64)
//   BLOCKSPEC_LOAD_STRICT_SAMPLED  1: seeded outputs must equal their single runs too (they need
//                                  not with --preemption and a drafter, docs/RELIABILITY.md)
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http_client_util.h"

namespace {

using bs::test_util::metric_value;
using bs::test_util::post_and_leave;
using bs::test_util::sse_events;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

struct Case {
  std::vector<int32_t> prompt;  // token ids
  int64_t max_tokens;
  int seed;  // -1: greedy
  bool long_prompt;
};

// What a client got: HTTP status (-1: left on purpose, 0: no reply), the text, the completion
// token count (non-streaming) and the finish reason.
struct Outcome {
  int status = 0;
  std::string text, finish, error;
  int64_t completion_tokens = -1;
};

json request_body(const Case& c, bool stream) {
  json body = {{"prompt", c.prompt},
               {"max_tokens", c.max_tokens},
               {"temperature", c.seed >= 0 ? 0.8 : 0.0},
               {"stream", stream}};
  if (c.seed >= 0) body["seed"] = c.seed;
  return body;
}

// One request to completion; for a stream, the chunks' texts joined (an error event or a missing
// [DONE] is an error).
Outcome complete(int port, const Case& c, bool stream, int timeout_s) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(timeout_s);
  cli.set_write_timeout(timeout_s);
  auto r = cli.Post("/v1/completions", request_body(c, stream).dump(), "application/json");
  Outcome out;
  if (!r) {
    out.error = "no reply: " + httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  if (r->status != 200) {
    out.error = r->body.substr(0, 300);
    return out;
  }
  if (!stream) {
    const json body = json::parse(r->body, nullptr, false);
    if (body.is_discarded() || !body.contains("choices")) {
      out.error = "unreadable reply: " + r->body.substr(0, 300);
      return out;
    }
    out.text = body["choices"][0].value("text", "");
    out.finish = body["choices"][0].value("finish_reason", "");
    out.completion_tokens = body["usage"].value("completion_tokens", int64_t{-1});
    return out;
  }
  bool done = false;
  for (const std::string& payload : sse_events(r->body)) {
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json e = json::parse(payload, nullptr, false);
    if (e.is_discarded() || e.contains("error") || !e.contains("choices")) {
      out.error = "stream event: " + payload.substr(0, 300);
      continue;
    }
    if (e["choices"].empty()) continue;  // the usage chunk
    out.text += e["choices"][0].value("text", "");
    if (e["choices"][0].contains("finish_reason") && !e["choices"][0]["finish_reason"].is_null()) {
      out.finish = e["choices"][0]["finish_reason"];
    }
  }
  if (!done && out.error.empty()) out.error = "stream without [DONE]";
  return out;
}

// A streaming request whose client leaves after its second chunk.
void leave_mid_stream(int port, const Case& c, int timeout_s) {
  post_and_leave(port, "/v1/completions", request_body(c, true).dump(), 2, timeout_s);
}

// The value of /metrics series vllm:<name> (first label set), or -1.
double series(int port, const std::string& name) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10);
  auto r = cli.Get("/metrics");
  if (!r) return -1;
  return metric_value(r->body, "vllm:" + name + "{").value_or(-1);
}

int64_t rss_kib(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(ServerLoad, ExternalServerLosesNothingAndKeepsGreedyOutputs) {
  const int port = static_cast<int>(env_int("BLOCKSPEC_LOAD_PORT", 0));
  if (port <= 0) GTEST_SKIP() << "BLOCKSPEC_LOAD_PORT not set (tools/device/run_gpu_load.sh)";
  const int clients = static_cast<int>(env_int("BLOCKSPEC_LOAD_CLIENTS", 256));
  const int waves = static_cast<int>(env_int("BLOCKSPEC_LOAD_WAVES", 2));
  const int64_t max_model_len = env_int("BLOCKSPEC_LOAD_MAX_MODEL_LEN", 0);
  const int64_t long_cases = max_model_len > 0 ? env_int("BLOCKSPEC_LOAD_LONG", 4) : 0;
  const int64_t vocab = env_int("BLOCKSPEC_LOAD_VOCAB", 30000);
  const int64_t max_prompt = env_int("BLOCKSPEC_LOAD_MAX_PROMPT", 3000);
  const int64_t pid = env_int("BLOCKSPEC_LOAD_PID", 0);
  const int64_t rss_growth_mib = env_int("BLOCKSPEC_LOAD_RSS_GROWTH_MIB", 64);
  const bool strict_sampled = env_int("BLOCKSPEC_LOAD_STRICT_SAMPLED", 0) != 0;
  constexpr int kTimeoutS = 600;

  // 16 short cases (prompt lengths spread up to max_prompt, 4 output lengths, every third
  // seeded), then the long ones (greedy, 8 tokens, ending 0, 1, 63, 1500, ... short of the window).
  std::mt19937 rng(18);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab - 1));
  const auto prompt_of = [&](int64_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = token(rng);
    return p;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    const int64_t n = std::max<int64_t>(1, max_prompt * (i * i) / 225);  // 1 .. max_prompt
    cases.push_back(
        {prompt_of(n), std::vector<int64_t>{8, 24, 48, 96}[i % 4], i % 3 == 0 ? i : -1, false});
  }
  const std::vector<int64_t> shortfall = {0, 1, 63, 1500, 4000, 9000};
  for (int64_t k = 0; k < long_cases; ++k) {
    const int64_t max_tokens = 8;
    const int64_t short_of = std::min(shortfall[k % shortfall.size()] + k / 6, max_model_len / 4);
    const int64_t n = max_model_len - max_tokens - short_of;
    cases.push_back({prompt_of(n), max_tokens, -1, true});
  }
  const int short_cases = 16;
  // Client i's case: a long one for clients 64 j + 5 (each long case once a wave), else a
  // short one.
  const auto case_of = [&](int i, int wave) {
    if (long_cases > 0 && i % 64 == 5 && i / 64 < long_cases) return short_cases + i / 64;
    return (i * 7 + wave) % short_cases;
  };

  // Single-request outputs: each case alone on the idle server.
  const auto t_ref = Clock::now();
  std::vector<Outcome> want;
  for (size_t c = 0; c < cases.size(); ++c) {
    want.push_back(complete(port, cases[c], /*stream=*/false, kTimeoutS));
    ASSERT_EQ(want.back().status, 200)
        << "case " << c << " alone (" << cases[c].prompt.size() << " prompt tokens, max_tokens "
        << cases[c].max_tokens << "): " << want.back().error;
  }
  std::printf("LOAD reference: %zu cases alone in %.1f s (longest prompt %zu tokens)\n",
              cases.size(), seconds_since(t_ref),
              std::max_element(cases.begin(), cases.end(), [](const Case& a, const Case& b) {
                return a.prompt.size() < b.prompt.size();
              })->prompt.size());

  int64_t rss_first = -1;
  for (int wave = 0; wave < waves; ++wave) {
    std::vector<Outcome> got(clients);
    std::vector<char> left(clients, 0);  // not vector<bool>: written by the client threads
    std::atomic<bool> running{true};
    double max_waiting = 0, max_running = 0;
    std::thread monitor([&] {  // how full the server was: requests waiting and running
      while (running) {
        max_waiting = std::max(max_waiting, series(port, "num_requests_waiting"));
        max_running = std::max(max_running, series(port, "num_requests_running"));
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
    });
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        const Case& c = cases[case_of(i, wave)];
        const bool streaming = i % 2 == 1, cancels = i % 5 == 0 && !c.long_prompt;
        if (cancels) {
          leave_mid_stream(port, c, kTimeoutS);
          left[i] = 1;
          return;
        }
        got[i] = complete(port, c, streaming, kTimeoutS);
      });
    }
    for (auto& t : threads) t.join();
    const double wall = seconds_since(t0);
    // Idle again: nothing running or waiting (a client that left ends at the next step).
    bool idle = false;
    for (int k = 0; k < 240 && !idle; ++k) {
      idle = series(port, "num_requests_running") == 0 && series(port, "num_requests_waiting") == 0;
      if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    running = false;
    monitor.join();
    int ok = 0, cancelled = 0, lost = 0, greedy_diff = 0, sampled_diff = 0, sampled = 0;
    for (int i = 0; i < clients; ++i) {
      if (left[i]) {
        ++cancelled;
        continue;
      }
      const int c = case_of(i, wave);
      const Outcome& g = got[i];
      if (g.status != 200 || !g.error.empty()) {
        ++lost;
        ADD_FAILURE() << "wave " << wave << ", client " << i << " (case " << c << ", "
                      << cases[c].prompt.size() << " prompt tokens) lost: HTTP " << g.status << " "
                      << g.error;
        continue;
      }
      ++ok;
      const bool same =
          g.text == want[c].text && g.finish == want[c].finish &&
          (g.completion_tokens < 0 || g.completion_tokens == want[c].completion_tokens);
      if (cases[c].seed < 0) {
        if (!same) ++greedy_diff;
        EXPECT_TRUE(same) << "wave " << wave << ", client " << i << ", greedy case " << c << " ("
                          << cases[c].prompt.size() << " prompt tokens): got \""
                          << g.text.substr(0, 200) << "\" (" << g.finish << "), alone \""
                          << want[c].text.substr(0, 200) << "\" (" << want[c].finish << ")";
      } else {
        ++sampled;
        if (!same) ++sampled_diff;
        if (strict_sampled) {
          EXPECT_TRUE(same) << "wave " << wave << ", seeded case " << c;
        }
      }
    }
    EXPECT_TRUE(idle) << "wave " << wave << ": requests still running or waiting after 60 s";
    httplib::Client cli("127.0.0.1", port);
    auto health = cli.Get("/health");
    EXPECT_TRUE(health && health->status == 200) << "wave " << wave << ": /health";
    const int64_t rss = pid > 0 ? rss_kib(pid) : -1;
    std::printf(
        "LOAD wave %d: %d clients in %.1f s: %d ok, %d left mid-stream, %d lost; greedy outputs "
        "different from their single run: %d; seeded: %d of %d different; most waiting %.0f, "
        "most running %.0f; idle after: %s; server RSS %.1f MiB\n",
        wave, clients, wall, ok, cancelled, lost, greedy_diff, sampled_diff, sampled, max_waiting,
        max_running, idle ? "yes" : "no", rss / 1024.0);
    std::fflush(stdout);
    if (wave == 0) rss_first = rss;
    if (wave > 0 && rss >= 0 && rss_first >= 0) {
      EXPECT_LT(rss - rss_first, rss_growth_mib * 1024)
          << "server RSS grew from " << rss_first << " KiB after wave 0 to " << rss
          << " KiB after wave " << wave;
    }
  }
}

}  // namespace
