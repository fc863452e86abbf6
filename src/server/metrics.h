// Server metrics in the Prometheus text format (names under `blockspec:`, vLLM-style, each series
// labelled with model_name). Thread-safe: handler threads and the engine worker record, /metrics
// renders.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generate.h"

namespace bs::server {

// Cumulative histogram with fixed upper bounds (seconds).
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

// What the engine worker reports about one finished request.
struct RequestRecord {
  const GenerateStats* stats = nullptr;  // null when the engine failed
  std::string finished_reason;           // "stop", "length" or "abort"
  double queue_seconds = 0;              // submitted -> started
  double ttft_seconds = -1;              // submitted -> first token; < 0: no token
  double e2e_seconds = 0;                // submitted -> finished
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void set_queue(int64_t running, int64_t waiting);
  void record(const RequestRecord& r);
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::string labels_;  // model_name="..."
  int64_t running_ = 0, waiting_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t success_stop_ = 0, success_length_ = 0, success_abort_ = 0, failures_ = 0;
  int64_t drafts_ = 0, draft_tokens_ = 0, accepted_tokens_ = 0;
  std::vector<int64_t> accepted_per_pos_;  // [k]: accepted drafts at offset k
  Histogram ttft_, e2e_, queue_;
};

}  // namespace bs::server
