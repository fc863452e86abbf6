// The engine worker: one thread that owns the served model's target, drafter and backend and runs
// generation requests one at a time, first come first served. HTTP handler threads submit a Job
// and wait on it (whole response) or drain its text as it is committed (streaming).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/generate.h"
#include "server/metrics.h"
#include "server/served_model.h"

namespace bs::server {

// One generation request. The submitter fills the inputs, then only reads through the methods.
class Job {
 public:
  using Clock = std::chrono::steady_clock;

  // Inputs (set before submit).
  std::string id;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  std::vector<std::string> stop;

  // The client went away: the worker skips the job or stops generating at the next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Blocks until new text is committed, the job ends, or `timeout` passes; appends the new text
  // to *text. True once the job has ended (its text all taken).
  bool wait_text(std::string* text, std::chrono::milliseconds timeout);
  // Blocks until the end; appends all remaining text.
  void wait(std::string* text);

  // Results, valid once ended.
  const Status& status() const { return status_; }
  const GenerateStats& stats() const { return stats_; }
  const std::string& finish_reason() const { return finish_reason_; }  // stop | length | abort

 private:
  friend class EngineWorker;
  void append(const std::string& text);
  void end(Status status, std::string finish_reason);

  std::atomic<bool> cancelled_{false};
  Clock::time_point submitted_ = Clock::now();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string text_;  // committed, not yet taken
  bool ended_ = false;
  Status status_;
  GenerateStats stats_;
  std::string finish_reason_;
};

class EngineWorker {
 public:
  // `model` and `metrics` must outlive the worker; log: one line per request on stderr.
  EngineWorker(ServedModel& model, Metrics& metrics, bool log);
  // Ends queued jobs with an error, finishes the running one (cancelled), joins.
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  void submit(std::shared_ptr<Job> job);

 private:
  void loop();
  void run(Job& job);
  void publish_queue(int64_t running);  // under mutex_

  ServedModel& model_;
  Metrics& metrics_;
  bool log_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace bs::server
