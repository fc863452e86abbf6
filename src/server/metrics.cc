#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace bs::server {

namespace {

// Bucket bounds of vllm/v1/metrics/loggers.py.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                         0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                         20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kInterTokenBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                               0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                               7.5,  10.0,  20.0, 40.0,  80.0};
const std::vector<double> kRequestLatencyBounds = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kIterationTokenBounds = {1,   8,    16,   32,   64,   128,  256,
                                                   512, 1024, 2048, 4096, 8192, 16384};
const std::vector<double> kNBounds = {1, 2, 5, 10, 20};

// A number as Python's repr of a float writes it (prometheus_client's le labels): 1.0, 0.25.
std::string float_text(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void series(std::string* out, const std::string& name, const char* type, const char* help,
            const std::string& labels, T value) {
  header(out, name, type, help);
  *out += fmt::format("{}{{{}}} {}\n", name, labels, value);
}

void histogram(std::string* out, const std::string& name, const char* help,
               const std::string& labels, const Histogram& h) {
  header(out, name, "histogram", help);
  h.render(name, labels, out);
}

// Prometheus label values escape backslash, quote and newline.
std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<double> buckets_1_2_5(int64_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1;; scale *= 10) {
    for (const int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return out;
      out.push_back(static_cast<double>(m * scale));
    }
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? float_text(bounds_[i]) : "+Inf";
    *out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  *out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, float_text(sum_), name,
                      labels, count_);
}

Metrics::Metrics(std::string model_name, int64_t max_model_len)
    : labels_(fmt::format("model_name=\"{}\",engine=\"0\"", escape_label(model_name))),
      iteration_tokens_(kIterationTokenBounds),
      prompt_len_(buckets_1_2_5(max_model_len)),
      generation_len_(buckets_1_2_5(max_model_len)),
      max_generation_(buckets_1_2_5(max_model_len)),
      max_tokens_(buckets_1_2_5(max_model_len)),
      n_(kNBounds),
      ttft_(kTtftBounds),
      inter_token_(kInterTokenBounds),
      request_tpot_(kInterTokenBounds),
      e2e_(kRequestLatencyBounds),
      queue_(kRequestLatencyBounds),
      inference_(kRequestLatencyBounds),
      prefill_(kRequestLatencyBounds),
      decode_(kRequestLatencyBounds) {}

void Metrics::set_queue(int64_t running, int64_t waiting) {
  std::lock_guard lock(mutex_);
  running_ = running;
  waiting_ = waiting;
}

void Metrics::set_kv_cache_usage(double fraction) {
  std::lock_guard lock(mutex_);
  kv_usage_ = fraction;
}

void Metrics::record_iteration(int64_t tokens) {
  std::lock_guard lock(mutex_);
  iteration_tokens_.observe(static_cast<double>(tokens));
}

void Metrics::record_inter_token(double seconds) {
  std::lock_guard lock(mutex_);
  inter_token_.observe(seconds);
}

void Metrics::record_step(std::span<const double> inter_token_seconds, int64_t iteration_tokens) {
  std::lock_guard lock(mutex_);
  for (const double s : inter_token_seconds) inter_token_.observe(s);
  if (iteration_tokens > 0) iteration_tokens_.observe(static_cast<double>(iteration_tokens));
}

void Metrics::record_group(int n, int64_t max_generated) {
  std::lock_guard lock(mutex_);
  n_.observe(n);
  max_generation_.observe(static_cast<double>(max_generated));
}

void Metrics::record(const RequestRecord& r) {
  std::lock_guard lock(mutex_);
  if (!r.stats) {
    ++failures_;
    return;
  }
  const GenerateStats& st = *r.stats;
  prompt_tokens_ += st.prompt_tokens;
  cached_prompt_tokens_ += st.cached_tokens;
  generation_tokens_ += st.generated_tokens;
  if (r.finished_reason == "stop") ++success_stop_;
  if (r.finished_reason == "length") ++success_length_;
  if (r.finished_reason == "abort") ++success_abort_;
  drafts_ += st.steps;
  draft_tokens_ += st.drafted;
  accepted_tokens_ += st.accepted;
  if (accepted_per_pos_.size() < st.position_accepted.size()) {
    accepted_per_pos_.resize(st.position_accepted.size(), 0);
  }
  for (size_t k = 0; k < st.position_accepted.size(); ++k) {
    accepted_per_pos_[k] += st.position_accepted[k];
  }
  prompt_len_.observe(static_cast<double>(st.prompt_tokens));
  generation_len_.observe(static_cast<double>(st.generated_tokens));
  if (r.max_tokens > 0) max_tokens_.observe(static_cast<double>(r.max_tokens));
  queue_.observe(r.queue_seconds);
  if (r.ttft_seconds >= 0) ttft_.observe(r.ttft_seconds);
  e2e_.observe(r.e2e_seconds);
  // vLLM's per-request TPOT: the time after the first token over the tokens after it (0 for one).
  request_tpot_.observe(r.ttft_seconds >= 0 && st.generated_tokens > 1
                            ? (r.e2e_seconds - r.ttft_seconds) /
                                  static_cast<double>(st.generated_tokens - 1)
                            : 0.0);
  prefill_.observe(st.prefill_seconds);
  decode_.observe(st.decode_seconds);
  inference_.observe(st.prefill_seconds + st.decode_seconds);
}

std::string Metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  const std::string& l = labels_;
  series(&out, "vllm:num_requests_running", "gauge",
         "Requests admitted to the engine (prefilling or decoding).", l, running_);
  series(&out, "vllm:num_requests_waiting", "gauge", "Requests queued, not admitted yet.", l,
         waiting_);
  series(&out, "vllm:kv_cache_usage_perc", "gauge",
         "Fraction of the KV cache blocks held by running requests (1: all).", l,
         float_text(kv_usage_));
  series(&out, "vllm:gpu_cache_usage_perc", "gauge",
         "Same as vllm:kv_cache_usage_perc (the name of older vLLM versions).", l,
         float_text(kv_usage_));
  series(&out, "vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", l,
         prompt_tokens_);
  series(&out, "vllm:generation_tokens_total", "counter", "Generated tokens of finished requests.",
         l, generation_tokens_);
  series(&out, "vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache (those of finished requests).", l,
         prompt_tokens_);
  series(&out, "vllm:prefix_cache_hits_total", "counter",
         "Prompt tokens found in the prefix cache (0 with --no-enable-prefix-caching).", l,
         cached_prompt_tokens_);
  header(&out, "vllm:request_success_total", "counter",
         "Finished requests by finish reason (abort: the client went away).");
  for (const auto& [reason, n] : {std::pair<const char*, int64_t>{"stop", success_stop_},
                                  {"length", success_length_},
                                  {"abort", success_abort_}}) {
    out +=
        fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", l, reason, n);
  }
  series(&out, "blockspec:request_failure_total", "counter", "Requests the engine failed.", l,
         failures_);
  series(&out, "vllm:spec_decode_num_drafts_total", "counter",
         "Speculative verify steps (one draft block each).", l, drafts_);
  series(&out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", l,
         draft_tokens_);
  series(&out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", l,
         accepted_tokens_);
  header(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Draft tokens accepted at each block offset.");
  for (size_t k = 0; k < accepted_per_pos_.size(); ++k) {
    out +=
        fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n",
                    l, k, accepted_per_pos_[k]);
  }
  histogram(&out, "vllm:iteration_tokens_total",
            "Tokens per engine step (prompts whose first token came in it, plus committed tokens).",
            l, iteration_tokens_);
  histogram(&out, "vllm:request_prompt_tokens", "Prompt tokens of finished requests.", l,
            prompt_len_);
  histogram(&out, "vllm:request_generation_tokens", "Generated tokens of finished requests.", l,
            generation_len_);
  histogram(&out, "vllm:request_max_num_generation_tokens",
            "Most tokens generated by one of the n choices of a prompt.", l, max_generation_);
  histogram(&out, "vllm:request_params_n", "Choices per prompt (n) of finished prompts.", l, n_);
  histogram(&out, "vllm:request_params_max_tokens", "max_tokens of finished requests.", l,
            max_tokens_);
  histogram(&out, "vllm:time_to_first_token_seconds", "Arrival to first generated token, seconds.",
            l, ttft_);
  histogram(&out, "vllm:inter_token_latency_seconds",
            "Time between a request's consecutive steps that gave it tokens, seconds.", l,
            inter_token_);
  histogram(&out, "vllm:time_per_output_token_seconds",
            "Same observations as vllm:inter_token_latency_seconds (older vLLM name).", l,
            inter_token_);
  histogram(&out, "vllm:request_time_per_output_token_seconds",
            "Per request: time after the first token over the tokens after it, seconds.", l,
            request_tpot_);
  histogram(&out, "vllm:e2e_request_latency_seconds", "Arrival to the end of the request, seconds.",
            l, e2e_);
  histogram(&out, "vllm:request_queue_time_seconds",
            "Arrival to admission by the scheduler, seconds.", l, queue_);
  histogram(&out, "vllm:request_inference_time_seconds",
            "Prefill plus decode time of the request, seconds.", l, inference_);
  histogram(&out, "vllm:request_prefill_time_seconds",
            "Prefill time of the request (all its chunks), seconds.", l, prefill_);
  histogram(&out, "vllm:request_decode_time_seconds",
            "Decode time of the request (after its prefill), seconds.", l, decode_);
  return out;
}

}  // namespace bs::server
