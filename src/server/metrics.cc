#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace bs::server {

namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.005, 0.01, 0.02, 0.05, 0.1,  0.25, 0.5,
                                            1.0,   2.5,   5.0,  10.0, 20.0, 40.0, 80.0};

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void series(std::string* out, const std::string& name, const char* type, const char* help,
            const std::string& labels, int64_t value) {
  header(out, name, type, help);
  *out += fmt::format("{}{{{}}} {}\n", name, labels, value);
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
    const std::string le = i < bounds_.size() ? fmt::format("{}", bounds_[i]) : "+Inf";
    *out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  *out +=
      fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

Metrics::Metrics(std::string model_name)
    : labels_(fmt::format("model_name=\"{}\"", escape_label(model_name))),
      ttft_(kLatencyBounds),
      e2e_(kLatencyBounds),
      queue_(kLatencyBounds) {}

void Metrics::set_queue(int64_t running, int64_t waiting) {
  std::lock_guard lock(mutex_);
  running_ = running;
  waiting_ = waiting;
}

void Metrics::record(const RequestRecord& r) {
  std::lock_guard lock(mutex_);
  if (!r.stats) {
    ++failures_;
    return;
  }
  const GenerateStats& st = *r.stats;
  prompt_tokens_ += st.prompt_tokens;
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
  queue_.observe(r.queue_seconds);
  if (r.ttft_seconds >= 0) ttft_.observe(r.ttft_seconds);
  e2e_.observe(r.e2e_seconds);
}

std::string Metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  const std::string& l = labels_;
  series(&out, "blockspec:num_requests_running", "gauge", "Requests being decoded.", l, running_);
  series(&out, "blockspec:num_requests_waiting", "gauge", "Requests queued for the engine.", l,
         waiting_);
  series(&out, "blockspec:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", l,
         prompt_tokens_);
  series(&out, "blockspec:generation_tokens_total", "counter", "Generated tokens.", l,
         generation_tokens_);
  header(&out, "blockspec:request_success_total", "counter",
         "Finished requests by finish reason (abort: the client went away).");
  for (const auto& [reason, n] : {std::pair<const char*, int64_t>{"stop", success_stop_},
                                  {"length", success_length_},
                                  {"abort", success_abort_}}) {
    out += fmt::format("blockspec:request_success_total{{{},finished_reason=\"{}\"}} {}\n", l,
                       reason, n);
  }
  series(&out, "blockspec:request_failure_total", "counter", "Requests the engine failed.", l,
         failures_);
  series(&out, "blockspec:spec_decode_num_drafts_total", "counter",
         "Speculative verify steps (one draft block each).", l, drafts_);
  series(&out, "blockspec:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
         l, draft_tokens_);
  series(&out, "blockspec:spec_decode_num_accepted_tokens_total", "counter",
         "Draft tokens accepted.", l, accepted_tokens_);
  header(&out, "blockspec:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Draft tokens accepted at each block offset.");
  for (size_t k = 0; k < accepted_per_pos_.size(); ++k) {
    out += fmt::format(
        "blockspec:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", l, k,
        accepted_per_pos_[k]);
  }
  header(&out, "blockspec:time_to_first_token_seconds", "histogram",
         "Time from arrival to the first generated token.");
  ttft_.render("blockspec:time_to_first_token_seconds", l, &out);
  header(&out, "blockspec:e2e_request_latency_seconds", "histogram",
         "Time from arrival to the last generated token.");
  e2e_.render("blockspec:e2e_request_latency_seconds", l, &out);
  header(&out, "blockspec:request_queue_time_seconds", "histogram",
         "Time from arrival to the start of decoding.");
  queue_.render("blockspec:request_queue_time_seconds", l, &out);
  return out;
}

}  // namespace bs::server
