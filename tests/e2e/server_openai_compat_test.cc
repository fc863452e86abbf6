// `blockspec serve` as the tools users bring see it: the official OpenAI client's tool loop (npm
// `openai`, driven by node), the routes clients and vLLM users expect (/v1/models/{id},
// /tokenize with messages, /version), and /metrics read by a strict Prometheus text-format parser
// for every series vLLM's Grafana dashboard queries.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/server.h"
#include "server_fixture.h"
#include "tokenizer/tokenizer.h"

namespace bs::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kModel = std::string(BS_SOURCE_DIR) + "/models/stories260K";

// RunningServer (server_fixture.h) with a model folder first and a way to call it.
class Serving : public RunningServer {
 public:
  explicit Serving(const std::string& model_dir, bool drafter = false, ServerOptions options = {})
      : RunningServer(std::move(options), drafter, model_dir) {}

  struct Reply {
    int status = 0;
    json body;
    std::string raw;
  };
  Reply call(const std::string& method, const std::string& path, const std::string& body = "") {
    httplib::Client cli("127.0.0.1", port());
    cli.set_read_timeout(60);
    auto r =
        method == "GET" ? cli.Get(path.c_str()) : cli.Post(path.c_str(), body, "application/json");
    if (!r) return {};
    return {r->status, json::parse(r->body, nullptr, false), r->body};
  }
};

// stories260K with a real chat template (tests/data/chat_templates/<stem>.jinja) or `source`, in
// a folder named `name`, its context window widened to 4096 (a real template's tool prompts take
// more than 512 tokens of its tiny vocabulary; RoPE runs at any position, the text is noise
// anyway).
std::string model_with_template(const std::string& name, const std::string& stem,
                                const std::string& source = "") {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(kModel) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  json config = json::parse(std::ifstream(fs::path(kModel) / "config.json"));
  config["max_position_embeddings"] = 4096;
  std::ofstream(dir / "config.json") << config.dump(1);
  if (source.empty()) {
    fs::copy_file(std::string(BS_TEST_DATA) + "/chat_templates/" + stem + ".jinja",
                  dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
  } else {
    std::ofstream(dir / "chat_template.jinja") << source;
  }
  return dir.string();
}

// Runs `command` through the shell; its exit status and combined output.
std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// ---- the tool loop ----

// The second turn of the standard tool loop as the wire carries it: the assistant's call with
// content null and arguments as a JSON string, then the tool's result. Qwen3's template tests
// `'</think>' in message.content`, which failed on null ("argument of type 'NoneType' is not
// iterable", 400) before messages were normalised as vLLM does.
TEST(OpenAiCompat, ToolLoopSecondTurnIsAnswered) {
  Serving s(model_with_template("bs_qwen3_chat", "qwen3"));
  const auto r = s.call("POST", "/v1/chat/completions", R"({
      "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}],
      "tools": [{"type": "function", "function": {"name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
      "max_tokens": 4, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
}

// The same loop through the official client (npm openai 6.49.0, scripts/setup.sh fetches it):
// tests/e2e/openai_client_tool_loop.cjs runs three turns (the second whole and streamed) and
// models.retrieve for a known and an unknown id.
TEST(OpenAiCompat, OfficialNodeClientToolLoop) {
  const std::string modules = std::string(BS_SOURCE_DIR) + "/third_party/npm/node_modules";
  if (run("command -v node").first != 0) GTEST_SKIP() << "node is not installed";
  if (!fs::exists(modules + "/openai/package.json")) {
    GTEST_SKIP() << "the npm openai client is missing: run scripts/setup.sh";
  }
  Serving s(model_with_template("bs_qwen3_node", "qwen3"));
  const auto [status, out] =
      run("node " + std::string(BS_SOURCE_DIR) + "/tests/e2e/openai_client_tool_loop.cjs " +
          modules + " " + std::to_string(s.port()));
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos) << out;
}

// ---- routes ----

TEST(OpenAiCompat, ModelById) {
  Serving s(kModel);
  auto r = s.call("GET", "/v1/models/stories260K");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["id"], "stories260K");
  EXPECT_EQ(r.body["object"], "model");
  EXPECT_EQ(r.body, s.call("GET", "/v1/models").body["data"][0]);
  r = s.call("GET", "/v1/models/gpt-4o");
  EXPECT_EQ(r.status, 404) << r.raw;
  EXPECT_EQ(r.body["error"]["code"], "model_not_found");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("gpt-4o"), std::string::npos);
  EXPECT_EQ(s.call("GET", "/v1/models/org/stories260K").status, 404);
}

TEST(OpenAiCompat, Version) {
  Serving s(kModel);
  const auto r = s.call("GET", "/version");
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string v = r.body["version"];
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(v[0])) && v.find('.') != std::string::npos)
      << v;
}

// vLLM's chat form of /tokenize: the messages rendered by the template (with the generation
// prompt unless add_generation_prompt is false), encoded without special tokens unless asked.
TEST(OpenAiCompat, TokenizeMessages) {
  const std::string dir =
      model_with_template("bs_tok_chat", "",
                          "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}{{ extra }}");
  Serving s(dir);
  auto tokenizer = std::move(*Tokenizer::load(dir));
  const auto ids = [&](const std::string& text, bool special) {
    return json(tokenizer->encode(text, special));
  };
  auto r = s.call("POST", "/tokenize",
                  R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                   {"role": "assistant", "content": null}]})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["tokens"], ids("user: Hi\nassistant: \nassistant:", false));
  EXPECT_EQ(r.body["count"], r.body["tokens"].size());
  EXPECT_EQ(r.body["max_model_len"], 4096);
  r = s.call("POST", "/tokenize",
             R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false,
                 "add_special_tokens": true, "chat_template_kwargs": {"extra": "!"}})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["tokens"], ids("user: Hi\n!", true));
  // The text form is unchanged; neither form is a 400.
  r = s.call("POST", "/tokenize", R"({"prompt": "Tom had a red"})");
  EXPECT_EQ(r.body["tokens"], ids("Tom had a red", true));
  r = s.call("POST", "/tokenize", R"({"messages": "Hi"})");
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(s.call("POST", "/tokenize", R"({})").status, 400);
  // A model without a chat template: the chat form says so.
  Serving plain(kModel);
  r = plain.call("POST", "/tokenize", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_NE(r.raw.find("no chat template"), std::string::npos) << r.raw;
}

// ---- metrics ----

// One sample of the Prometheus text format (0.0.4).
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// A strict parser of the Prometheus text exposition format: every sample belongs to a family
// declared by `# TYPE` before it (a histogram's _bucket / _sum / _count, a counter's or gauge's
// own name), a family's samples are contiguous, no series repeats, label values are quoted with
// \\ \" \n escapes. Returns the samples and the declared types, or fails the test.
struct Exposition {
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram | ...
  std::vector<Sample> samples;
  std::vector<std::string> family_of;  // per sample
};

bool valid_name(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_' || s[0] == ':'))
    return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
  }
  return true;
}

double parse_value(const std::string& v) {
  if (v == "+Inf") return INFINITY;
  if (v == "-Inf") return -INFINITY;
  if (v == "NaN") return NAN;
  size_t used = 0;
  const double d = std::stod(v, &used);
  if (used != v.size()) throw std::invalid_argument("bad value " + v);
  return d;
}

Exposition parse_exposition(const std::string& text) {
  Exposition e;
  std::set<std::string> closed, series_seen;
  std::string current;  // the family whose samples come now
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + ": " + line;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream ls(line.substr(1));
      std::string kw, name, type;
      ls >> kw >> name;
      if (kw == "TYPE") {
        ls >> type;
        EXPECT_TRUE(valid_name(name)) << where;
        EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram" ||
                    type == "summary" || type == "untyped")
            << where;
        EXPECT_FALSE(e.types.count(name)) << "TYPE repeated, " << where;
        e.types[name] = type;
      } else if (kw == "HELP") {
        EXPECT_TRUE(valid_name(name)) << where;
      }
      continue;
    }
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    EXPECT_TRUE(valid_name(s.name)) << where;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          ADD_FAILURE() << "bad label, " << where;
          return e;
        }
        const std::string key = line.substr(i, eq - i);
        EXPECT_TRUE(valid_name(key) && key.find(':') == std::string::npos) << where;
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            const char c = j + 1 < line.size() ? line[++j] : '?';
            EXPECT_TRUE(c == '\\' || c == '"' || c == 'n') << "bad escape, " << where;
            value += c == 'n' ? '\n' : c;
          } else {
            value += line[j];
          }
        }
        EXPECT_LT(j, line.size()) << "unterminated label value, " << where;
        EXPECT_FALSE(s.labels.count(key)) << "label repeated, " << where;
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      EXPECT_LT(i, line.size()) << "unterminated labels, " << where;
      ++i;
    }
    EXPECT_TRUE(i < line.size() && line[i] == ' ') << where;
    std::istringstream rest(line.substr(i));
    std::string value, timestamp, extra;
    rest >> value >> timestamp >> extra;
    EXPECT_TRUE(extra.empty()) << where;
    try {
      s.value = parse_value(value);
    } catch (const std::exception&) {
      ADD_FAILURE() << "bad value, " << where;
    }
    // The family: the name itself, or a histogram's name without its suffix.
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sx = suffix;
      if (!e.types.count(family) && s.name.size() > sx.size() &&
          s.name.compare(s.name.size() - sx.size(), sx.size(), sx) == 0) {
        const std::string base = s.name.substr(0, s.name.size() - sx.size());
        if (e.types.count(base) && e.types[base] == "histogram") family = base;
      }
    }
    EXPECT_TRUE(e.types.count(family)) << "no # TYPE before the sample, " << where;
    if (family != current) {
      EXPECT_FALSE(closed.count(family)) << "family not contiguous, " << where;
      if (!current.empty()) closed.insert(current);
      current = family;
    }
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) key += "|" + k + "=" + v;
    EXPECT_TRUE(series_seen.insert(key).second) << "series repeated, " << where;
    e.family_of.push_back(family);
    e.samples.push_back(std::move(s));
  }
  return e;
}

// The samples of `family` with `model_name`; histogram series are checked for consistency:
// per label set, le ascending ending at +Inf, cumulative counts non-decreasing, +Inf = _count,
// a _sum.
std::vector<Sample> family_samples(const Exposition& e, const std::string& family,
                                   const std::string& model_name) {
  std::vector<Sample> out;
  for (size_t i = 0; i < e.samples.size(); ++i) {
    if (e.family_of[i] != family) continue;
    const Sample& s = e.samples[i];
    EXPECT_EQ(s.labels.count("model_name") ? s.labels.at("model_name") : "", model_name)
        << s.name << " lacks model_name";
    out.push_back(s);
  }
  if (e.types.count(family) && e.types.at(family) == "histogram") {
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // labels -> (le, n)
    std::map<std::string, double> counts, sums;
    for (const Sample& s : out) {
      std::string key;
      for (const auto& [k, v] : s.labels) {
        if (k != "le") key += k + "=" + v + ",";
      }
      if (s.name == family + "_bucket") {
        EXPECT_TRUE(s.labels.count("le")) << s.name;
        buckets[key].emplace_back(parse_value(s.labels.at("le")), s.value);
      } else if (s.name == family + "_count") {
        counts[key] = s.value;
      } else if (s.name == family + "_sum") {
        sums[key] = s.value;
      } else {
        ADD_FAILURE() << "unexpected series " << s.name << " in histogram " << family;
      }
    }
    EXPECT_FALSE(buckets.empty()) << family;
    for (const auto& [key, b] : buckets) {
      for (size_t k = 1; k < b.size(); ++k) {
        EXPECT_LT(b[k - 1].first, b[k].first) << family << ": le not ascending";
        EXPECT_LE(b[k - 1].second, b[k].second) << family << ": buckets not cumulative";
      }
      EXPECT_TRUE(std::isinf(b.back().first)) << family << ": no +Inf bucket";
      EXPECT_TRUE(counts.count(key) && sums.count(key)) << family << ": no _count / _sum";
      EXPECT_EQ(b.back().second, counts[key]) << family << ": +Inf bucket != _count";
    }
  }
  return out;
}

// Every metric vLLM's dashboard (examples/observability/prometheus_grafana/grafana.json, as of
// 2026-09) queries, by the series its panel expressions name, with the type each needs; then the
// names of older versions of the dashboard (time_per_output_token_seconds, gpu_cache_usage_perc)
// and the speculative-decoding counters of vLLM's spec-decode dashboard.
//   E2E Request Latency: vllm:e2e_request_latency_seconds_bucket / _sum / _count
//   Token Throughput: vllm:prompt_tokens_total, vllm:generation_tokens_total
//   Inter Token Latency: vllm:inter_token_latency_seconds_bucket / _sum / _count
//   Time Per Output Token (TPOT): vllm:request_time_per_output_token_seconds_bucket / _sum / _count
//   Scheduler State: vllm:num_requests_running, vllm:num_requests_waiting
//   Time To First Token Latency: vllm:time_to_first_token_seconds_bucket / _sum / _count
//   Cache Utilization: vllm:kv_cache_usage_perc
//   Request Prompt Length: vllm:request_prompt_tokens_bucket
//   Request Generation Length: vllm:request_generation_tokens_bucket
//   Finish Reason: vllm:request_success_total by finished_reason
//   Queue Time: vllm:request_queue_time_seconds_sum
//   Requests Prefill and Decode Time: vllm:request_prefill_time_seconds_sum,
//                                     vllm:request_decode_time_seconds_sum
//   Max Generation Token in Sequence Group: vllm:request_max_num_generation_tokens_sum
const std::vector<std::pair<std::string, std::string>> kDashboardFamilies = {
    {"vllm:e2e_request_latency_seconds", "histogram"},
    {"vllm:prompt_tokens_total", "counter"},
    {"vllm:generation_tokens_total", "counter"},
    {"vllm:inter_token_latency_seconds", "histogram"},
    {"vllm:request_time_per_output_token_seconds", "histogram"},
    {"vllm:num_requests_running", "gauge"},
    {"vllm:num_requests_waiting", "gauge"},
    {"vllm:time_to_first_token_seconds", "histogram"},
    {"vllm:kv_cache_usage_perc", "gauge"},
    {"vllm:request_prompt_tokens", "histogram"},
    {"vllm:request_generation_tokens", "histogram"},
    {"vllm:request_success_total", "counter"},
    {"vllm:request_queue_time_seconds", "histogram"},
    {"vllm:request_prefill_time_seconds", "histogram"},
    {"vllm:request_decode_time_seconds", "histogram"},
    {"vllm:request_max_num_generation_tokens", "histogram"},
    // Older dashboards.
    {"vllm:time_per_output_token_seconds", "histogram"},
    {"vllm:gpu_cache_usage_perc", "gauge"},
    // Further vLLM metrics.
    {"vllm:iteration_tokens_total", "histogram"},
    {"vllm:request_inference_time_seconds", "histogram"},
    {"vllm:request_params_n", "histogram"},
    {"vllm:request_params_max_tokens", "histogram"},
    {"vllm:spec_decode_num_drafts_total", "counter"},
    {"vllm:spec_decode_num_draft_tokens_total", "counter"},
    {"vllm:spec_decode_num_accepted_tokens_total", "counter"},
    {"vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter"},
};

double value_of(const Exposition& e, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& s : e.samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) match &= s.labels.count(k) && s.labels.at(k) == v;
    if (match) return s.value;
  }
  ADD_FAILURE() << "no sample " << name;
  return NAN;
}

TEST(OpenAiCompat, MetricsHaveEverySeriesVllmsDashboardQueries) {
  Serving s(kModel, /*drafter=*/true);
  // Before any request: every family is there (histograms empty, counters 0).
  Exposition e = parse_exposition(s.call("GET", "/metrics").raw);
  for (const auto& [family, type] : kDashboardFamilies) {
    ASSERT_TRUE(e.types.count(family)) << family << " has no # TYPE";
    EXPECT_EQ(e.types[family], type) << family;
    if (family != "vllm:spec_decode_num_accepted_tokens_per_pos_total") {
      EXPECT_FALSE(family_samples(e, family, "stories260K").empty()) << family;
    }
  }
  // vLLM's buckets (vllm/v1/metrics/loggers.py): token counts 1-2-5 up to max_model_len (512),
  // fixed ones for the latencies.
  const auto bounds = [&](const std::string& family) {
    std::vector<std::string> le;
    for (const Sample& x : family_samples(e, family, "stories260K")) {
      if (x.name == family + "_bucket") le.push_back(x.labels.at("le"));
    }
    return le;
  };
  using Bounds = std::vector<std::string>;
  EXPECT_EQ(
      bounds("vllm:request_prompt_tokens"),
      (Bounds{"1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "+Inf"}));
  EXPECT_EQ(bounds("vllm:request_params_n"), (Bounds{"1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"}));
  EXPECT_EQ(bounds("vllm:iteration_tokens_total").size(), 14u);
  EXPECT_EQ(bounds("vllm:time_to_first_token_seconds").front(), "0.001");
  EXPECT_EQ(bounds("vllm:time_to_first_token_seconds").size(), 23u);
  EXPECT_EQ(bounds("vllm:inter_token_latency_seconds").front(), "0.01");
  EXPECT_EQ(bounds("vllm:inter_token_latency_seconds").size(), 20u);
  EXPECT_EQ(bounds("vllm:e2e_request_latency_seconds").front(), "0.3");
  EXPECT_EQ(bounds("vllm:e2e_request_latency_seconds").at(20), "7680.0");
  // Two prompts x n = 2 (four requests, two groups), one streamed request, all greedy.
  auto r = s.call("POST", "/v1/completions",
                  R"({"prompt": ["Once upon a time", "The dog"], "n": 2, "max_tokens": 20,
                      "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  auto streamed = s.call("POST", "/v1/completions",
                         R"({"prompt": "Lily", "max_tokens": 7, "temperature": 0, "stream": true,
                             "stream_options": {"include_usage": true}})");
  ASSERT_EQ(streamed.status, 200);
  json last_usage;
  for (size_t at = 0; (at = streamed.raw.find("data: {", at)) != std::string::npos; ++at) {
    const json chunk =
        json::parse(streamed.raw.substr(at + 6, streamed.raw.find('\n', at) - at - 6));
    if (chunk.contains("usage") && !chunk["usage"].is_null()) last_usage = chunk["usage"];
  }
  ASSERT_FALSE(last_usage.is_null()) << streamed.raw;
  const int64_t prompt_tokens =
      r.body["usage"]["prompt_tokens"].get<int64_t>() * 2 +
      last_usage["prompt_tokens"].get<int64_t>();  // usage counts once per prompt
  const int64_t generated = r.body["usage"]["completion_tokens"].get<int64_t>() +
                            last_usage["completion_tokens"].get<int64_t>();
  // The engine worker records a step's iteration tokens after the step, which may end the
  // request the client saw: wait for the last one.
  for (int i = 0; i < 500; ++i) {
    e = parse_exposition(s.call("GET", "/metrics").raw);
    if (value_of(e, "vllm:iteration_tokens_total_sum") >= prompt_tokens + generated) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& [family, type] : kDashboardFamilies) {
    EXPECT_FALSE(family_samples(e, family, "stories260K").empty()) << family;
  }
  EXPECT_EQ(value_of(e, "vllm:prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(value_of(e, "vllm:generation_tokens_total"), generated);
  EXPECT_EQ(value_of(e, "vllm:request_success_total", {{"finished_reason", "length"}}) +
                value_of(e, "vllm:request_success_total", {{"finished_reason", "stop"}}),
            5);
  for (const char* h :
       {"vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
        "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds", "vllm:request_time_per_output_token_seconds",
        "vllm:request_params_max_tokens"}) {
    EXPECT_EQ(value_of(e, std::string(h) + "_count"), 5) << h;
  }
  EXPECT_EQ(value_of(e, "vllm:request_prompt_tokens_sum"), prompt_tokens);
  EXPECT_EQ(value_of(e, "vllm:request_generation_tokens_sum"), generated);
  EXPECT_EQ(value_of(e, "vllm:request_params_max_tokens_sum"), 4 * 20 + 7);
  // One observation per prompt's group of choices: 3 groups, n = 2, 2 and 1.
  EXPECT_EQ(value_of(e, "vllm:request_max_num_generation_tokens_count"), 3);
  EXPECT_EQ(value_of(e, "vllm:request_params_n_sum"), 5);
  EXPECT_GT(value_of(e, "vllm:request_decode_time_seconds_sum"), 0);
  // Inter-token latency: one per request and step that gave it tokens after its first token's
  // step, so at least one per request here (none ends at its first token).
  EXPECT_GE(value_of(e, "vllm:inter_token_latency_seconds_count"), 5);
  EXPECT_EQ(value_of(e, "vllm:inter_token_latency_seconds_count"),
            value_of(e, "vllm:time_per_output_token_seconds_count"));
  // Iteration tokens: every prompt and generated token counted in some step.
  EXPECT_EQ(value_of(e, "vllm:iteration_tokens_total_sum"), prompt_tokens + generated);
  EXPECT_GT(value_of(e, "vllm:spec_decode_num_drafts_total"), 0);
  EXPECT_GT(value_of(e, "vllm:spec_decode_num_accepted_tokens_per_pos_total", {{"position", "0"}}),
            0);
  EXPECT_EQ(value_of(e, "vllm:num_requests_running"), 0);
  EXPECT_EQ(value_of(e, "vllm:kv_cache_usage_perc"), 0);  // all freed
}

// KV cache usage while a request runs: the blocks it holds over the pool's.
TEST(OpenAiCompat, KvCacheUsageWhileARequestRuns) {
  Serving s(kModel, /*drafter=*/false, {.max_num_seqs = 1, .kv_cache_tokens = 1024});
  std::atomic<bool> done{false};
  std::thread client([&] {
    s.call("POST", "/v1/completions",
           R"({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": true})");
    done = true;
  });
  double seen = 0;
  while (!done && seen == 0) {
    const Exposition e = parse_exposition(s.call("GET", "/metrics").raw);
    if (value_of(e, "vllm:num_requests_running") == 1) {
      seen = value_of(e, "vllm:kv_cache_usage_perc");
      EXPECT_GT(seen, 0);
      EXPECT_LE(seen, 1);
    }
  }
  client.join();
  EXPECT_GT(seen, 0) << "the request ended before /metrics saw it running";
}

}  // namespace
}  // namespace bs::server
