// `blockspec bench-serve`: a serving benchmark in the manner of `vllm bench serve`. It drives a
// running `blockspec serve` (or any OpenAI-compatible /v1/completions server that takes token-id
// prompts) with N concurrent streaming clients and reports request throughput, output tokens/s,
// time to first token (TTFT), time per output token after the first (TPOT), the gaps between
// streamed chunks (ITL) and end-to-end latency, as percentiles. Results: docs/BENCHMARKS.md.
//
// Each request is a random token-id prompt (ids uniform in --token-range, so every model's
// tokenizer can take it) of --prompt-tokens ids and asks for exactly --output-tokens tokens
// (ignore_eos), streamed with usage; with --range-ratio r both lengths are drawn uniformly from
// [len (1 - r), len (1 + r)] per request (seeded). A speculative server streams several tokens per
// chunk, so ITL is per chunk; TPOT is per token: (latency - TTFT) / (output tokens - 1); the
// decode rate is clients / mean TPOT (the engine's view without prefill, as `bench --batch N`).
#include <fmt/format.h>
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace bs::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model;  // the request's "model" field (optional for blockspec serve)
  int clients = 1;
  int requests = 0;  // 0: 4 per client
  int prompt_tokens = 128;
  int output_tokens = 128;
  double range_ratio = 0.0;
  std::vector<int> token_range = {3, 500};
  uint64_t seed = 0;
  double temperature = 0.0;
  double wait_s = 0.0;
  double timeout_s = 600.0;
  bool json_out = false;
};

// One request's plan and what was measured.
struct RequestRecord {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  bool ok = false;
  std::string error;
  double start_s = 0, ttft_s = -1, latency_s = 0;  // start: since the benchmark began
  std::vector<double> chunk_gaps_s;                // between streamed chunks with text
  int64_t prompt_tokens = 0, output_tokens = 0, chunks = 0;
};

// Percentile p (0..100) of v by linear interpolation between order statistics (numpy's default).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double x = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(x);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (v[i + 1] - v[i]) * (x - static_cast<double>(i));
}
double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Reads the server-sent events of one streamed completion into `r`.
class StreamReader {
 public:
  StreamReader(RequestRecord* r, Clock::time_point start) : r_(r), start_(start) {}
  // Consumes bytes; false stops the transfer (an error event).
  bool feed(const char* data, size_t n) {
    buf_.append(data, n);
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      const std::string event = buf_.substr(0, end);
      buf_.erase(0, end + 2);
      if (!on_event(event)) return false;
    }
    return true;
  }
  bool done() const { return done_; }

 private:
  bool on_event(const std::string& event) {
    if (event.rfind("data: ", 0) != 0) return true;  // comments, keep-alives
    const std::string payload = event.substr(6);
    if (payload == "[DONE]") {
      done_ = true;
      return true;
    }
    const json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      r_->error = "unparseable event: " + payload.substr(0, 200);
      return false;
    }
    if (j.contains("error")) {
      r_->error = "server error: " + j["error"].dump();
      return false;
    }
    const double now = std::chrono::duration<double>(Clock::now() - start_).count();
    const auto& choices = j.value("choices", json::array());
    bool text = false;
    for (const auto& c : choices) {
      if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
        text = true;
      }
    }
    if (text) {
      if (r_->ttft_s < 0) {
        r_->ttft_s = now;
      } else {
        r_->chunk_gaps_s.push_back(now - last_);
      }
      last_ = now;
      ++r_->chunks;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      r_->prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
      r_->output_tokens = j["usage"].value("completion_tokens", int64_t{0});
    }
    return true;
  }

  RequestRecord* r_;
  Clock::time_point start_;
  std::string buf_;
  double last_ = 0;
  bool done_ = false;
};

void run_one(httplib::Client& client, const BenchServeArgs& a, RequestRecord* r,
             Clock::time_point bench_start) {
  json body = {{"prompt", r->prompt},
               {"max_tokens", r->max_tokens},
               {"temperature", a.temperature},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!a.model.empty()) body["model"] = a.model;
  const auto t0 = Clock::now();
  r->start_s = std::chrono::duration<double>(t0 - bench_start).count();
  StreamReader reader(r, t0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    return reader.feed(data, n);
  };
  const httplib::Result res = client.send(req);
  r->latency_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res) {
    if (r->error.empty()) r->error = "HTTP: " + httplib::to_string(res.error());
    return;
  }
  if (res->status != 200) {
    r->error = fmt::format("HTTP status {}", res->status);
    return;
  }
  if (!reader.done()) {
    if (r->error.empty()) r->error = "stream ended without [DONE]";
    return;
  }
  if (r->output_tokens <= 0) {
    r->error = "no usage in the stream (or no tokens)";
    return;
  }
  r->ok = true;
}

bool wait_ready(const BenchServeArgs& a) {
  httplib::Client c(a.host, a.port);
  c.set_connection_timeout(1, 0);
  const auto deadline = Clock::now() + std::chrono::duration<double>(a.wait_s);
  do {
    if (auto res = c.Get("/health"); res && res->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < deadline);
  return false;
}

int run_bench_serve(const BenchServeArgs& a) {
  if (a.token_range.size() != 2 || a.token_range[0] < 0 || a.token_range[1] <= a.token_range[0]) {
    fmt::print(stderr,
               "blockspec bench-serve: error: --token-range needs LO HI with 0 <= LO < HI\n");
    return 1;
  }
  if (a.range_ratio < 0.0 || a.range_ratio >= 1.0) {
    fmt::print(stderr, "blockspec bench-serve: error: --range-ratio must be in [0, 1)\n");
    return 1;
  }
  if (a.wait_s > 0 && !wait_ready(a)) {
    fmt::print(stderr,
               "blockspec bench-serve: error: no server answered /health on {}:{} in {} s\n",
               a.host, a.port, a.wait_s);
    return 1;
  }
  const int total = a.requests > 0 ? a.requests : 4 * a.clients;
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int32_t> tok(a.token_range[0], a.token_range[1] - 1);
  auto length = [&](int base) {
    if (a.range_ratio == 0.0) return base;
    const int lo = std::max(1, static_cast<int>(base * (1.0 - a.range_ratio)));
    const int hi = std::max(lo, static_cast<int>(base * (1.0 + a.range_ratio)));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::vector<RequestRecord> recs(static_cast<size_t>(total));
  for (auto& r : recs) {
    r.prompt.resize(static_cast<size_t>(length(a.prompt_tokens)));
    for (auto& t : r.prompt) t = tok(rng);
    r.max_tokens = length(a.output_tokens);
  }

  std::atomic<int> next{0};
  const auto bench_start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(a.clients, total); ++w) {
    workers.emplace_back([&] {
      httplib::Client client(a.host, a.port);
      client.set_read_timeout(static_cast<time_t>(a.timeout_s), 0);
      client.set_write_timeout(static_cast<time_t>(a.timeout_s), 0);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);  // the request's body is not held behind its headers
      for (int i; (i = next.fetch_add(1)) < total;) run_one(client, a, &recs[i], bench_start);
    });
  }
  for (auto& t : workers) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - bench_start).count();

  int completed = 0;
  int64_t in_tokens = 0, out_tokens = 0, chunks = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<std::string> errors;
  for (const auto& r : recs) {
    if (!r.ok) {
      errors.push_back(r.error);
      continue;
    }
    ++completed;
    in_tokens += r.prompt_tokens;
    out_tokens += r.output_tokens;
    chunks += r.chunks;
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.latency_s * 1e3);
    if (r.output_tokens > 1) {
      tpot.push_back((r.latency_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1));
    }
    for (double g : r.chunk_gaps_s) itl.push_back(g * 1e3);
  }
  auto stats = [](const std::vector<double>& v) {
    return json{{"mean", mean(v)},
                {"p50", percentile(v, 50)},
                {"p90", percentile(v, 90)},
                {"p99", percentile(v, 99)}};
  };
  // Aggregate decode rate, clients / mean TPOT: what the clients see between their first and last
  // tokens, comparable with `bench --batch N`'s generate figure (which leaves prefill out).
  const double tpot_mean = mean(tpot);
  const double decode_rate = tpot_mean > 0 ? std::min(a.clients, total) * 1e3 / tpot_mean : 0.0;
  json rep = {{"clients", a.clients},
              {"requests", total},
              {"completed", completed},
              {"failed", total - completed},
              {"duration_s", duration},
              {"input_tokens", in_tokens},
              {"output_tokens", out_tokens},
              {"output_chunks", chunks},
              {"request_throughput", completed / duration},
              {"output_tokens_per_s", static_cast<double>(out_tokens) / duration},
              {"total_tokens_per_s", static_cast<double>(in_tokens + out_tokens) / duration},
              {"decode_tokens_per_s", decode_rate},
              {"ttft_ms", stats(ttft)},
              {"tpot_ms", stats(tpot)},
              {"itl_ms", stats(itl)},
              {"e2e_latency_ms", stats(e2e)}};
  if (!errors.empty()) rep["first_error"] = errors.front();
  if (a.json_out) {
    fmt::print("{}\n", rep.dump(2));
  } else {
    fmt::print("bench-serve: {}:{}, {} clients, {} requests, prompt {} / output {} tokens{}\n",
               a.host, a.port, a.clients, total, a.prompt_tokens, a.output_tokens,
               a.range_ratio > 0 ? fmt::format(" (range ratio {})", a.range_ratio) : "");
    fmt::print("completed {} / failed {} in {:.2f} s\n", completed, total - completed, duration);
    fmt::print("input tokens {}, output tokens {} in {} chunks ({:.2f} tokens per chunk)\n",
               in_tokens, out_tokens, chunks,
               chunks ? static_cast<double>(out_tokens) / static_cast<double>(chunks) : 0.0);
    fmt::print("request throughput {:.2f} req/s, output {:.1f} tok/s, total {:.1f} tok/s\n",
               completed / duration, static_cast<double>(out_tokens) / duration,
               static_cast<double>(in_tokens + out_tokens) / duration);
    fmt::print("decode {:.1f} tok/s (clients / mean TPOT)\n", decode_rate);
    fmt::print("{:<16}{:>10}{:>10}{:>10}{:>10}\n", "ms", "mean", "p50", "p90", "p99");
    for (const auto& [name, v] : std::vector<std::pair<std::string, const std::vector<double>*>>{
             {"TTFT", &ttft}, {"TPOT", &tpot}, {"ITL (chunk)", &itl}, {"E2E latency", &e2e}}) {
      fmt::print("{:<16}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}\n", name, mean(*v), percentile(*v, 50),
                 percentile(*v, 90), percentile(*v, 99));
    }
    if (!errors.empty()) fmt::print("first error: {}\n", errors.front());
  }
  return completed == total ? 0 : 2;
}

CLI::App* g_cmd = nullptr;
BenchServeArgs g_args;

}  // namespace

void register_bench_serve(CLI::App& app) {
  g_cmd = app.add_subcommand(
      "bench-serve", "Drive a running server with concurrent streaming clients (vllm bench serve)");
  g_cmd->add_option("--host", g_args.host, "Server address");
  g_cmd->add_option("--port", g_args.port, "Server port")->check(CLI::Range(1, 65535));
  g_cmd->add_option("--served-model", g_args.model, "The requests' \"model\" field");
  g_cmd->add_option("--clients,--concurrency", g_args.clients, "Concurrent clients")
      ->check(CLI::PositiveNumber);
  g_cmd
      ->add_option("--requests,--num-prompts", g_args.requests,
                   "Requests in all (default: 4 per client)")
      ->check(CLI::NonNegativeNumber);
  g_cmd->add_option("--prompt-tokens,--input-len", g_args.prompt_tokens, "Prompt length in tokens")
      ->check(CLI::PositiveNumber);
  g_cmd->add_option("--output-tokens,--output-len", g_args.output_tokens, "Tokens to generate")
      ->check(CLI::PositiveNumber);
  g_cmd->add_option("--range-ratio", g_args.range_ratio,
                    "Random lengths: each uniform in [len (1 - r), len (1 + r)] (0: fixed)");
  g_cmd
      ->add_option("--token-range", g_args.token_range,
                   "Prompt token ids are uniform in [LO, HI) (default 3 500)")
      ->expected(2);
  g_cmd->add_option("--seed", g_args.seed, "Seed of the prompts and lengths");
  g_cmd->add_option("--temperature", g_args.temperature, "Sampling temperature (default 0)");
  g_cmd->add_option("--wait", g_args.wait_s, "Seconds to wait for /health first (0: no check)");
  g_cmd->add_option("--timeout", g_args.timeout_s, "Read timeout per request, seconds");
  g_cmd->add_flag("--json", g_args.json_out, "Print the report as one JSON object");
}

bool run_bench_serve_if_parsed(int* rc) {
  if (!g_cmd || !g_cmd->parsed()) return false;
  *rc = run_bench_serve(g_args);
  return true;
}

}  // namespace bs::cli
