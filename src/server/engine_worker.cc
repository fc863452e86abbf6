#include "server/engine_worker.h"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

#include "server/text_stream.h"

namespace bs::server {

namespace {

double seconds_since(Job::Clock::time_point t) {
  return std::chrono::duration<double>(Job::Clock::now() - t).count();
}

}  // namespace

bool Job::wait_text(std::string* text, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return ended_ || !text_.empty(); });
  *text += std::exchange(text_, {});
  return ended_;
}

void Job::wait(std::string* text) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return ended_; });
  *text += std::exchange(text_, {});
}

void Job::append(const std::string& text) {
  if (text.empty()) return;
  std::lock_guard lock(mutex_);
  text_ += text;
  cv_.notify_all();
}

void Job::end(Status status, std::string finish_reason) {
  std::lock_guard lock(mutex_);
  status_ = std::move(status);
  finish_reason_ = std::move(finish_reason);
  ended_ = true;
  cv_.notify_all();
}

EngineWorker::EngineWorker(ServedModel& model, Metrics& metrics, bool log)
    : model_(model), metrics_(metrics), log_(log), thread_([this] { loop(); }) {}

EngineWorker::~EngineWorker() {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    left.swap(queue_);
    if (running_) running_->cancel();
    cv_.notify_all();
  }
  for (auto& job : left) job->end(FailedPrecondition("the server is shutting down"), "abort");
  thread_.join();
}

void EngineWorker::submit(std::shared_ptr<Job> job) {
  std::lock_guard lock(mutex_);
  job->submitted_ = Job::Clock::now();
  if (stopping_) {
    job->end(FailedPrecondition("the server is shutting down"), "abort");
    return;
  }
  queue_.push_back(std::move(job));
  publish_queue(running_ ? 1 : 0);
  cv_.notify_all();
}

void EngineWorker::publish_queue(int64_t running) {
  metrics_.set_queue(running, static_cast<int64_t>(queue_.size()));
}

void EngineWorker::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job;
      publish_queue(1);
    }
    run(*job);
    std::lock_guard lock(mutex_);
    running_.reset();
    publish_queue(0);
  }
}

void EngineWorker::run(Job& job) {
  const double queue_seconds = seconds_since(job.submitted_);
  if (job.cancelled()) {
    job.end(Status::Ok(), "abort");
    return;
  }
  TextStream text(*model_.tokenizer, job.stop);
  double ttft = -1;
  const auto on_token = [&](int32_t id) {
    if (ttft < 0) ttft = seconds_since(job.submitted_);
    job.append(text.push(id));
    return !text.stopped() && !job.cancelled();
  };
  GenerateStats& st = job.stats_;
  auto out = model_.drafter
                 ? generate_speculative(*model_.target, *model_.drafter, job.prompt, job.options,
                                        on_token, &st)
                 : generate_plain(*model_.target, job.prompt, job.options, on_token, &st);
  if (!out.ok()) {
    metrics_.record({.stats = nullptr});
    if (log_) fmt::print(stderr, "[{}] error: {}\n", job.id, out.status().message());
    job.end(out.status(), "abort");
    return;
  }
  job.append(text.finish());
  std::string reason = "length";
  if (text.stopped() || st.finish == FinishReason::kStop) reason = "stop";
  if (!text.stopped() && st.finish == FinishReason::kCancelled) reason = "abort";
  const double e2e = seconds_since(job.submitted_);
  metrics_.record({.stats = &st,
                   .finished_reason = reason,
                   .queue_seconds = queue_seconds,
                   .ttft_seconds = ttft,
                   .e2e_seconds = e2e});
  if (log_) {
    const double tps =
        st.decode_seconds > 0 ? static_cast<double>(st.generated_tokens) / st.decode_seconds : 0;
    std::string spec;
    if (model_.drafter) spec = fmt::format(", acceptance length {:.2f}", st.acceptance_length());
    fmt::print(stderr, "[{}] {} prompt tokens, {} generated ({}), {:.1f} tok/s, {:.3f} s{}\n",
               job.id, st.prompt_tokens, st.generated_tokens, reason, tps, e2e, spec);
  }
  job.end(Status::Ok(), std::move(reason));
}

}  // namespace bs::server
