// Server metrics in the Prometheus text format under vLLM's names, types, label names and histogram
// buckets (vllm/v1/metrics/loggers.py), so vLLM's Grafana dashboard and alerts work unchanged:
// every series is labelled model_name="<served name>",engine="0"; docs/SERVER.md lists them.
// Thread-safe: handler threads and the engine worker record, /metrics renders.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/generate.h"

namespace bs::server {

// Cumulative histogram with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket / _sum / _count series of `name` with `labels` (`key="v"` pairs).
  void render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds_.size() + 1]: per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
std::vector<double> buckets_1_2_5(int64_t max_value);

// What the engine worker reports about one finished request (one choice).
struct RequestRecord {
  const GenerateStats* stats = nullptr;  // null when the engine failed
  std::string finished_reason;           // "stop", "length" or "abort"
  double queue_seconds = 0;              // submitted -> started
  double ttft_seconds = -1;              // submitted -> first token; < 0: no token
  double e2e_seconds = 0;                // submitted -> finished
  int64_t max_tokens = 0;                // the request's max_tokens (0: not counted)
};

class Metrics {
 public:
  // `max_model_len` bounds the token-count histograms' buckets (as vLLM's).
  explicit Metrics(std::string model_name, int64_t max_model_len = 1 << 20);

  void set_queue(int64_t running, int64_t waiting);
  void set_kv_cache_usage(double fraction);  // used / all KV blocks, 0..1
  // One engine step: the prompt tokens of requests that got their first token in it plus the
  // tokens it committed (vllm:iteration_tokens_total).
  void record_iteration(int64_t tokens);
  // A request's time since its previous output (vllm:inter_token_latency_seconds): once per step
  // that committed tokens to it, its first token's step excepted.
  void record_inter_token(double seconds);
  // A step's worth of them (and its iteration tokens when > 0) under one lock.
  void record_step(std::span<const double> inter_token_seconds, int64_t iteration_tokens);
  void record(const RequestRecord& r);
  // The n choices of one prompt have all finished: n, and the most tokens one generated.
  void record_group(int n, int64_t max_generated);
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::string labels_;  // model_name="...",engine="0"
  int64_t running_ = 0, waiting_ = 0;
  double kv_usage_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;  // prompt tokens served from the prefix cache
  int64_t success_stop_ = 0, success_length_ = 0, success_abort_ = 0, failures_ = 0;
  int64_t drafts_ = 0, draft_tokens_ = 0, accepted_tokens_ = 0;
  std::vector<int64_t> accepted_per_pos_;  // [k]: accepted drafts at offset k
  Histogram iteration_tokens_, prompt_len_, generation_len_, max_generation_, max_tokens_, n_;
  Histogram ttft_, inter_token_, request_tpot_;
  Histogram e2e_, queue_, inference_, prefill_, decode_;
};

}  // namespace bs::server
