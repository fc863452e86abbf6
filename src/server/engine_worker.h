// The engine worker: one thread that owns the served model's target, drafter and backend and
// drives a continuous-batching Scheduler (engine/scheduler.h): between steps it hands newly
// submitted jobs to the scheduler and cancels those whose client left, then runs one step for
// every running job. HTTP handler threads submit a Job and wait on it (whole response) or drain
// its text as it is committed (streaming).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "server/metrics.h"
#include "server/served_model.h"
#include "server/text_stream.h"

namespace bs::server {

// A committed token's logprobs with the token strings of it and its alternatives (TokenTexts).
struct LogprobsEntry {
  TokenLogprobs logprobs;
  bool scored = true;  // false: the prompt's first token (echo), which has no logprob
  std::string text;
  std::vector<std::string> top_texts;  // per logprobs.top
};

// The n choices of one prompt: the last of them to end reports the group to the metrics
// (vllm:request_params_n, vllm:request_max_num_generation_tokens). Engine worker thread only.
struct ChoiceGroup {
  explicit ChoiceGroup(int n) : n(n), left(n) {}
  const int n;
  int left;
  int64_t max_generated = 0;
};

// One generation request. The submitter fills the inputs, then only reads through the methods.
class Job {
 public:
  using Clock = std::chrono::steady_clock;

  // Inputs (set before submit).
  std::string id;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  std::vector<std::string> stop;
  bool include_stop = false;  // the matched stop string stays in the text
  bool skip_special_tokens = true;
  // Echo (completions): the reply starts with `echo_text` (the prompt) and, with logprobs, the
  // prompt tokens' logprobs (engine/prompt_logprobs.h); options.max_tokens may then be 0.
  bool echo = false;
  std::string echo_text;
  // n of the request this job is a choice of (usage counts a prompt once for its n choices).
  int choices_per_prompt = 1;
  std::shared_ptr<ChoiceGroup> group;  // shared by those choices; null: a group of its own

  // The client went away: the worker skips the job or stops generating at the next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Blocks until new text or logprobs are committed, the job ends, or `timeout` passes; appends
  // the new text to *text. True once the job has ended (its text all taken).
  bool wait_text(std::string* text, std::chrono::milliseconds timeout);
  // Blocks until the end; appends all remaining text.
  void wait(std::string* text);
  // Blocks until the end or `timeout`; appends the text committed so far. True once ended (all
  // text taken).
  bool wait_until_ended(std::string* text, std::chrono::milliseconds timeout);
  // Appends the committed tokens' logprobs (options.logprobs >= 0) not yet taken, in order. They
  // may run ahead of the text (held back for stop strings); once the job has ended all are there.
  void take_logprobs(std::vector<LogprobsEntry>* logprobs);

  // Results, valid once ended.
  const Status& status() const { return status_; }
  const GenerateStats& stats() const { return stats_; }
  const std::string& finish_reason() const { return finish_reason_; }  // stop | length | abort

 private:
  friend class EngineWorker;
  void append(const std::string& text);
  void append_logprobs(LogprobsEntry entry);
  // Text and logprobs of one engine step at once: one lock, one wake-up of the waiting handler.
  void deliver(const std::string& text, std::vector<LogprobsEntry>& logprobs);
  void end(Status status, std::string finish_reason);

  std::atomic<bool> cancelled_{false};
  Clock::time_point submitted_ = Clock::now();  // set by submit
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string text_;                     // committed, not yet taken
  std::vector<LogprobsEntry> logprobs_;  // committed, not yet taken
  bool ended_ = false;
  Status status_;
  GenerateStats stats_;
  std::string finish_reason_;
};

class EngineWorker {
 public:
  // `model` and `metrics` must outlive the worker; `scheduling`: max_num_seqs and the KV pool
  // (allocated now); log: one line per request on stderr.
  EngineWorker(ServedModel& model, Metrics& metrics, const SchedulerOptions& scheduling, bool log);
  // Ends queued jobs with an error, ends the running ones (cancelled), joins.
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  void submit(std::shared_ptr<Job> job);

 private:
  // A job in the scheduler, with its text stream (worker thread only).
  struct Active {
    std::shared_ptr<Job> job;
    std::unique_ptr<TextStream> text;
    std::unique_ptr<TokenTexts> token_texts;  // with logprobs
    double ttft = -1;                         // submitted -> first token
    double queued_before = 0;                 // submitted -> handed to the scheduler
    Job::Clock::time_point last_output;       // when the last step that gave it tokens did
    uint64_t last_step = 0;                   // that step's number (steps_ then)
    // Committed in the current step, handed to the job once after it (deliver_step_output).
    std::string out;
    std::vector<LogprobsEntry> out_logprobs;
    bool touched = false;  // listed in touched_
  };

  // A job's output of one step, and/or its end, for the delivery thread (which applies them in
  // the order the engine thread posted them).
  struct Delivery {
    std::shared_ptr<Job> job;
    std::string text;
    std::vector<LogprobsEntry> logprobs;
    bool end = false;
    Status status;
    std::string finish_reason;
  };

  // Seconds of the engine thread's host work by phase (BLOCKSPEC_PROFILE_HOST=1): printed to
  // stderr each time the engine goes idle after work, then reset. Worker thread only.
  struct HostProfile {
    bool enabled = false;
    int64_t steps = 0, tokens = 0;
    double intake = 0;        // taking submitted jobs: TextStream set-up, Scheduler::add, cancels
    double callbacks = 0;     // on_token / on_logprobs / on_done inside the step (detokenization)
    double deliver = 0;       // the step's text to the jobs (locks, wake-ups)
    double publish = 0;       // counts and iteration metrics
    double loop = 0;          // whole loop iterations that ran a step (busy time)
    SchedulerTimes at_start;  // the scheduler's phase times when this window began
  };

  void loop();
  // Posts each job's text and logprobs of this step, then hands the step's posts to the delivery
  // thread at once (flush_posts).
  void deliver_step_output();
  // The job's pending output (`a` is its Active) as a Delivery.
  static Delivery take_output(Active& a);
  void flush_posts();
  void delivery_loop();  // the delivery thread: jobs' locks and handlers' wake-ups
  void print_profile();  // BLOCKSPEC_PROFILE_HOST: the window's figures to stderr, then reset
  void start(std::shared_ptr<Job> job);  // hands a job to the scheduler
  // Echo: the prompt's text and logprobs into the job; false when the job ended (an error, or
  // max_tokens 0).
  bool echo_prompt(Job& job);
  void finish(RequestId id, Completion result);  // the scheduler ended it
  void fail(Job& job, const Status& status);     // metrics and log; the caller ends the job

  void end_choice(const Job& job);  // the job's ChoiceGroup to the metrics when it was the last
  void publish_counts();            // the scheduler's counts to the metrics (worker thread)
  void publish_queue();             // under mutex_

  ServedModel& model_;
  Metrics& metrics_;
  bool log_;
  Scheduler scheduler_;                 // worker thread only
  std::map<RequestId, Active> active_;  // worker thread only
  RequestId next_id_ = 0;               // worker thread only
  uint64_t steps_ = 0;                  // scheduler steps begun (worker thread only)
  int64_t step_tokens_ = 0;             // this step's vllm:iteration_tokens_total (worker thread)
  std::vector<RequestId> touched_;      // jobs with output in this step (worker thread)
  std::vector<double> step_itls_;       // this step's inter-token latencies (worker thread)
  HostProfile profile_;                 // worker thread only
  std::vector<Delivery> posts_;         // this step's (worker thread)
  std::mutex out_mutex_;                // guards out_queue_, out_stopping_
  std::condition_variable out_cv_;
  std::vector<Delivery> out_queue_;  // posted, not yet delivered
  bool out_stopping_ = false;
  std::thread out_thread_;  // delivery_loop
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;       // submitted, not yet in the scheduler
  int64_t running_ = 0, scheduled_waiting_ = 0;  // the scheduler's counts after the last step
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace bs::server
