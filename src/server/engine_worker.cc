#include "server/engine_worker.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "engine/prompt_logprobs.h"

namespace bs::server {

namespace {

double seconds_since(Job::Clock::time_point t) {
  return std::chrono::duration<double>(Job::Clock::now() - t).count();
}

// `lp` with the texts of its token and alternatives after the tokens `texts` holds; commits the
// token to `texts`.
LogprobsEntry entry_of(const TokenLogprobs& lp, bool scored, TokenTexts& texts) {
  LogprobsEntry e{.logprobs = lp, .scored = scored, .text = texts.text(lp.token)};
  for (const TopLogprob& t : lp.top) e.top_texts.push_back(texts.text(t.token));
  texts.commit(lp.token);
  return e;
}

// BLOCKSPEC_MIXED_STEPS=0 / BLOCKSPEC_OVERLAP=0 turn the scheduler's mixed / overlapped steps off
// (for comparisons, docs/SERVER.md).
SchedulerOptions with_env(SchedulerOptions o) {
  const auto off = [](const char* name) {
    const char* env = std::getenv(name);
    return env && std::string(env) == "0";
  };
  if (off("BLOCKSPEC_MIXED_STEPS")) o.mixed_steps = false;
  if (off("BLOCKSPEC_OVERLAP")) o.overlap = false;
  return o;
}

}  // namespace

bool Job::wait_text(std::string* text, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return ended_ || !text_.empty() || !logprobs_.empty(); });
  *text += std::exchange(text_, {});
  return ended_;
}

void Job::wait(std::string* text) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return ended_; });
  *text += std::exchange(text_, {});
}

bool Job::wait_until_ended(std::string* text, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return ended_; });
  *text += std::exchange(text_, {});
  return ended_;
}

void Job::take_logprobs(std::vector<LogprobsEntry>* logprobs) {
  std::lock_guard lock(mutex_);
  std::move(logprobs_.begin(), logprobs_.end(), std::back_inserter(*logprobs));
  logprobs_.clear();
}

void Job::append_logprobs(LogprobsEntry entry) {
  std::lock_guard lock(mutex_);
  logprobs_.push_back(std::move(entry));
  cv_.notify_all();
}

void Job::append(const std::string& text) {
  if (text.empty()) return;
  std::lock_guard lock(mutex_);
  text_ += text;
  cv_.notify_all();
}

void Job::deliver(const std::string& text, std::vector<LogprobsEntry>& logprobs) {
  if (text.empty() && logprobs.empty()) return;
  {
    std::lock_guard lock(mutex_);
    text_ += text;
    std::move(logprobs.begin(), logprobs.end(), std::back_inserter(logprobs_));
  }
  cv_.notify_all();  // outside the lock: the woken handler does not block on it at once
}

void Job::end(Status status, std::string finish_reason) {
  std::lock_guard lock(mutex_);
  status_ = std::move(status);
  finish_reason_ = std::move(finish_reason);
  ended_ = true;
  cv_.notify_all();
}

EngineWorker::EngineWorker(ServedModel& model, Metrics& metrics, const SchedulerOptions& scheduling,
                           bool log)
    : model_(model),
      metrics_(metrics),
      log_(log),
      scheduler_(*model.target, model.drafter.get(), with_env(scheduling)),
      thread_() {
  const char* env = std::getenv("BLOCKSPEC_PROFILE_HOST");
  profile_.enabled = env && *env && std::string(env) != "0";
  // Named for profilers (perf, top -H): bs-engine runs the model, bs-deliver wakes the handlers.
  out_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bs-deliver");
    delivery_loop();
  });
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bs-engine");
    loop();
  });
}

EngineWorker::~EngineWorker() {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    left.swap(queue_);
    cv_.notify_all();
  }
  for (auto& job : left) job->end(FailedPrecondition("the server is shutting down"), "abort");
  thread_.join();  // its last posts are flushed
  {
    std::lock_guard lock(out_mutex_);
    out_stopping_ = true;
  }
  out_cv_.notify_all();
  out_thread_.join();  // after delivering everything posted
}

void EngineWorker::submit(std::shared_ptr<Job> job) {
  std::lock_guard lock(mutex_);
  job->submitted_ = Job::Clock::now();
  if (stopping_) {
    job->end(FailedPrecondition("the server is shutting down"), "abort");
    return;
  }
  queue_.push_back(std::move(job));
  publish_queue();
  cv_.notify_all();
}

void EngineWorker::publish_counts() {
  std::lock_guard lock(mutex_);
  running_ = scheduler_.num_running();
  scheduled_waiting_ = scheduler_.num_waiting();
  publish_queue();
  metrics_.set_kv_cache_usage(
      static_cast<double>(scheduler_.num_kv_blocks_used()) /
      static_cast<double>(std::max<int64_t>(1, scheduler_.num_kv_blocks())));
}

void EngineWorker::publish_queue() {
  metrics_.set_queue(running_, scheduled_waiting_ + static_cast<int64_t>(queue_.size()));
}

void EngineWorker::loop() {
  using Clock = Job::Clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  for (;;) {
    std::deque<std::shared_ptr<Job>> arrived;
    {
      std::unique_lock lock(mutex_);
      if (profile_.enabled && profile_.steps > 0 && queue_.empty() && scheduler_.idle()) {
        print_profile();
      }
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !scheduler_.idle(); });
      if (stopping_) break;
      arrived.swap(queue_);
    }
    const auto t0 = Clock::now();
    for (auto& job : arrived) start(std::move(job));
    for (const auto& [id, active] : active_) {
      if (active.job->cancelled()) scheduler_.cancel(id);  // the client went away
    }
    const auto t1 = Clock::now();
    ++steps_;
    step_tokens_ = 0;
    if (Status s = scheduler_.step(); !s.ok() && log_) {
      fmt::print(stderr, "engine step failed: {}\n", s.message());
    }
    const auto t2 = Clock::now();
    deliver_step_output();
    const auto t3 = Clock::now();
    metrics_.record_step(step_itls_, step_tokens_);
    step_itls_.clear();
    publish_counts();
    if (profile_.enabled) {
      profile_.intake += std::chrono::duration<double>(t1 - t0).count();
      profile_.deliver += std::chrono::duration<double>(t3 - t2).count();
      profile_.publish += since(t3);
      profile_.loop += since(t0);
      profile_.steps += 1;
    }
  }
  // Shutting down: the scheduler ends every job it holds (cancelled) without running the model.
  for (const auto& [id, active] : active_) scheduler_.cancel(id);
  while (!scheduler_.idle()) {
    if (!scheduler_.step().ok()) break;
  }
  deliver_step_output();
}

EngineWorker::Delivery EngineWorker::take_output(Active& a) {
  a.touched = false;
  Delivery d{.job = a.job, .text = std::move(a.out), .logprobs = std::move(a.out_logprobs)};
  a.out.clear();
  a.out_logprobs.clear();
  return d;
}

void EngineWorker::deliver_step_output() {
  for (const RequestId id : touched_) {
    const auto it = active_.find(id);
    if (it != active_.end()) posts_.push_back(take_output(it->second));  // else finish() took it
  }
  touched_.clear();
  flush_posts();
}

void EngineWorker::flush_posts() {
  if (posts_.empty()) return;
  {
    std::lock_guard lock(out_mutex_);
    if (out_queue_.empty()) {
      out_queue_.swap(posts_);
    } else {
      std::move(posts_.begin(), posts_.end(), std::back_inserter(out_queue_));
    }
  }
  posts_.clear();
  out_cv_.notify_one();
}

void EngineWorker::delivery_loop() {
  std::vector<Delivery> batch;
  for (;;) {
    {
      std::unique_lock lock(out_mutex_);
      out_cv_.wait(lock, [&] { return out_stopping_ || !out_queue_.empty(); });
      if (out_queue_.empty()) return;  // stopping, all delivered
      batch.swap(out_queue_);
    }
    for (Delivery& d : batch) {
      d.job->deliver(d.text, d.logprobs);
      if (d.end) d.job->end(std::move(d.status), std::move(d.finish_reason));
    }
    batch.clear();
  }
}

void EngineWorker::print_profile() {
  HostProfile& p = profile_;
  const SchedulerTimes& now = scheduler_.times();
  const SchedulerTimes& was = p.at_start;
  const double steps = static_cast<double>(std::max<int64_t>(1, p.steps));
  const auto ms = [&](double seconds) { return 1e3 * seconds / steps; };
  const double batch = now.batch - was.batch;
  fmt::print(stderr,
             "host profile: {} steps, {} tokens, {:.3f} s busy; per step ms: loop {:.3f} = "
             "intake {:.3f} + scheduler admit/prefill {:.3f} + batched step {:.3f} (of which "
             "token callbacks {:.3f}) + next {:.3f} + deliver {:.3f} + publish {:.3f}; mixed "
             "steps {}, overlapped steps {}\n",
             p.steps, p.tokens, p.loop, ms(p.loop), ms(p.intake),
             ms(now.admit_prefill - was.admit_prefill), ms(batch), ms(p.callbacks),
             ms(now.next - was.next), ms(p.deliver), ms(p.publish),
             now.mixed_steps - was.mixed_steps, now.overlapped_steps - was.overlapped_steps);
  p = HostProfile{.enabled = true, .at_start = now};
}

bool EngineWorker::echo_prompt(Job& job) {
  job.append(job.echo_text);
  if (job.options.logprobs >= 0) {
    auto scored = prompt_logprobs(*model_.target, job.prompt, job.options.logprobs);
    if (!scored.ok()) {
      fail(job, scored.status());
      job.end(scored.status(), "abort");  // nothing of it is posted: it may end at once
      return false;
    }
    TokenTexts texts(*model_.tokenizer);
    job.append_logprobs(entry_of({.token = job.prompt[0]}, /*scored=*/false, texts));
    for (const TokenLogprobs& lp : *scored) job.append_logprobs(entry_of(lp, true, texts));
  }
  if (job.options.max_tokens > 0) return true;
  job.stats_.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  const double e2e = seconds_since(job.submitted_);
  metrics_.record({.stats = &job.stats_, .finished_reason = "length", .e2e_seconds = e2e});
  end_choice(job);
  if (log_) {
    fmt::print(stderr, "[{}] {} prompt tokens echoed, {:.3f} s\n", job.id, job.stats_.prompt_tokens,
               e2e);
  }
  job.end(Status::Ok(), "length");
  return false;
}

void EngineWorker::start(std::shared_ptr<Job> job) {
  if (job->cancelled()) {
    job->end(Status::Ok(), "abort");
    return;
  }
  if (job->echo && !echo_prompt(*job)) return;
  const RequestId id = next_id_++;
  Active& a = active_[id];
  a.job = job;
  // The generated tokens' text continues the prompt's (echoed or not), as a decode of the
  // whole sequence reads: e.g. " ball" after "Tom had a red", where a decode of the reply alone
  // would strip its leading space.
  a.text = std::make_unique<TextStream>(
      *model_.tokenizer, job->stop, job->prompt,
      TextStreamOptions{.include_stop = job->include_stop,
                        .skip_special_tokens = job->skip_special_tokens,
                        .min_tokens = job->options.sampling.min_tokens});
  if (job->options.logprobs >= 0) {
    a.token_texts = std::make_unique<TokenTexts>(*model_.tokenizer, job->prompt);
  }
  a.queued_before = seconds_since(job->submitted_);
  // Text and logprobs collect in the Active during a step and go to the job once after it
  // (deliver_step_output): one lock and one wake-up of its handler per step, not per token.
  const auto on_token = [this, id](int32_t token) {
    const auto t = profile_.enabled ? Job::Clock::now() : Job::Clock::time_point{};
    Active& a = active_.at(id);
    // vLLM's iteration tokens (a prompt counts in the step of its first token) and inter-token
    // latency (once per step, from the previous step that gave this request tokens).
    const auto now = Job::Clock::now();
    ++step_tokens_;
    if (a.ttft < 0) {
      a.ttft = seconds_since(a.job->submitted_);
      step_tokens_ += static_cast<int64_t>(a.job->prompt.size());
    } else if (a.last_step != steps_) {
      step_itls_.push_back(std::chrono::duration<double>(now - a.last_output).count());
    }
    const bool first = a.last_step == 0;
    a.last_output = now;
    a.last_step = steps_;
    a.out += a.text->push(token);
    if (first) {
      // The first token goes out at once (its prefill ends the step's admission phase; the batched
      // step that follows would delay it by a step).
      posts_.push_back(take_output(a));
      flush_posts();
    } else if (!a.touched) {
      a.touched = true;
      touched_.push_back(id);
    }
    if (profile_.enabled) {
      ++profile_.tokens;
      profile_.callbacks += seconds_since(t);
    }
    return !a.text->stopped() && !a.job->cancelled();
  };
  const auto on_done = [this, id](Completion c) {
    const auto t = profile_.enabled ? Job::Clock::now() : Job::Clock::time_point{};
    finish(id, std::move(c));
    if (profile_.enabled) profile_.callbacks += seconds_since(t);
  };
  // Tokens past a matched stop string are not committed (on_token ends the request), so every
  // logprobs entry belongs to a token of the reply.
  const auto on_logprobs = [this, id](const TokenLogprobs& lp) {
    Active& a = active_.at(id);
    a.out_logprobs.push_back(entry_of(lp, /*scored=*/true, *a.token_texts));
    if (!a.touched) {
      a.touched = true;
      touched_.push_back(id);
    }
  };
  if (Status s = scheduler_.add(id, job->prompt, job->options, on_token, on_done, on_logprobs);
      !s.ok()) {
    active_.erase(id);
    fail(*job, s);
    job->end(s, "abort");  // nothing of it is posted: it may end at once
  }
}

void EngineWorker::end_choice(const Job& job) {
  int n = 1;
  int64_t max_generated = job.stats_.generated_tokens;
  if (job.group) {
    ChoiceGroup& g = *job.group;
    g.max_generated = std::max(g.max_generated, max_generated);
    if (--g.left > 0) return;
    n = g.n;
    max_generated = g.max_generated;
  }
  metrics_.record_group(n, max_generated);
}

void EngineWorker::fail(Job& job, const Status& status) {
  metrics_.record({.stats = nullptr});
  end_choice(job);
  if (log_) fmt::print(stderr, "[{}] error: {}\n", job.id, status.message());
}

void EngineWorker::finish(RequestId id, Completion result) {
  const auto it = active_.find(id);
  Active a = std::move(it->second);
  active_.erase(it);
  publish_counts();  // before the client can see the end
  // What this step committed before it ended, then the end, in one delivery.
  Delivery d = take_output(a);
  d.end = true;
  Job& job = *a.job;
  job.stats_ = std::move(result.stats);
  if (!result.status.ok()) {
    fail(job, result.status);
    d.status = result.status;
    d.finish_reason = "abort";
    posts_.push_back(std::move(d));
    return;
  }
  const GenerateStats& st = job.stats_;
  d.text += a.text->finish();
  std::string reason = "length";
  if (a.text->stopped() || st.finish == FinishReason::kStop) reason = "stop";
  if (!a.text->stopped() && st.finish == FinishReason::kCancelled) reason = "abort";
  const double e2e = seconds_since(job.submitted_);
  metrics_.record({.stats = &st,
                   .finished_reason = reason,
                   .queue_seconds = a.queued_before + result.queue_seconds,
                   .ttft_seconds = a.ttft,
                   .e2e_seconds = e2e,
                   .max_tokens = job.options.max_tokens});
  end_choice(job);
  if (log_) {
    const double tps =
        st.decode_seconds > 0 ? static_cast<double>(st.generated_tokens) / st.decode_seconds : 0;
    std::string spec;
    if (model_.drafter) spec = fmt::format(", acceptance length {:.2f}", st.acceptance_length());
    fmt::print(stderr, "[{}] {} prompt tokens, {} generated ({}), {:.1f} tok/s, {:.3f} s{}\n",
               job.id, st.prompt_tokens, st.generated_tokens, reason, tps, e2e, spec);
  }
  d.status = Status::Ok();
  d.finish_reason = std::move(reason);
  posts_.push_back(std::move(d));
}

}  // namespace bs::server
