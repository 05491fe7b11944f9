#include "server/engine_loop.h"

#include <algorithm>
#include <random>
#include <utility>

#include "core/log.h"

namespace moeserve::server {

// ---- Channel ----

Status Channel::Wait(std::chrono::milliseconds timeout, std::vector<ChoiceUpdate>* updates) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return news_ || !error_.ok(); });
  *updates = std::move(choices_);
  choices_.assign(updates->size(), ChoiceUpdate{});
  news_ = false;
  return error_;
}

void Channel::Publish(size_t choice, std::span<const int32_t> tokens,
                      std::span<const engine::SampledToken> logprobs, engine::FinishReason finish,
                      int64_t num_cached_tokens) {
  {
    std::lock_guard lock(mu_);
    ChoiceUpdate& u = choices_[choice];
    if (num_cached_tokens >= 0) u.num_cached_tokens = num_cached_tokens;
    u.tokens.insert(u.tokens.end(), tokens.begin(), tokens.end());
    u.logprobs.insert(u.logprobs.end(), logprobs.begin(), logprobs.end());
    if (finish != engine::FinishReason::kNone) {
      u.finished = true;
      u.finish_reason = finish;
    }
    news_ = true;
  }
  Notify();
}

void Channel::PublishPromptLogprobs(size_t choice, std::span<const engine::SampledToken> logprobs) {
  {
    std::lock_guard lock(mu_);
    choices_[choice].prompt_logprobs.assign(logprobs.begin(), logprobs.end());
    choices_[choice].has_prompt_logprobs = true;
    news_ = true;
  }
  Notify();
}

void Channel::Notify() {
  cv_.notify_all();
  if (on_news_) on_news_();
}

void Channel::Fail(const Status& status) {
  {
    std::lock_guard lock(mu_);
    if (error_.ok()) error_ = status;
    news_ = true;
  }
  Notify();
}

// ---- PrepareChoices ----

std::vector<ChoiceInput> PrepareChoices(const engine::Engine& engine,
                                        const std::shared_ptr<const engine::PreparedParams>& params,
                                        std::span<const std::vector<int32_t>> prompts) {
  thread_local std::mt19937_64 unseeded(std::random_device{}());
  const int64_t n = std::max<int64_t>(params->params.n, 1);
  std::vector<ChoiceInput> choices;
  choices.reserve(prompts.size() * n);
  for (const std::vector<int32_t>& prompt : prompts) {
    for (int64_t j = 0; j < n; ++j) {
      choices.push_back({engine.PrepareRequest(prompt, params, j, unseeded())});
    }
  }
  return choices;
}

// ---- EngineLoop ----

EngineLoop::EngineLoop(std::unique_ptr<engine::Engine> engine)
    : engine_(std::move(engine)), thread_([this] { Run(); }) {}

EngineLoop::~EngineLoop() { Stop(); }

std::shared_ptr<Channel> EngineLoop::Submit(std::vector<ChoiceInput> choices, int64_t max_waiting,
                                            std::function<void()> on_news) {
  auto channel = std::make_shared<Channel>(choices.size(), std::move(on_news));
  for (const ChoiceInput& choice : choices) {
    if (!choice.request.ok()) {
      channel->Fail(choice.request.status());
      return channel;
    }
  }
  {
    std::lock_guard lock(mu_);
    if (stop_ || !accepting_ || !healthy_) {
      channel->Fail(Unavailable("the server is shutting down or its engine failed"));
      return channel;
    }
    const int64_t waiting = queued_choices_ + engine_waiting_.load();
    if (max_waiting > 0 && waiting + static_cast<int64_t>(choices.size()) > max_waiting) {
      channel->Fail(Unavailable(
          "the server is overloaded: {} requests are waiting, at most {} may "
          "(--max-waiting-requests); retry later",
          waiting, max_waiting));
      return channel;
    }
    queued_choices_ += static_cast<int64_t>(choices.size());
    submissions_.push_back({channel, Clock::now(), std::move(choices)});
  }
  cv_.notify_one();
  return channel;
}

void EngineLoop::Abort(const std::shared_ptr<Channel>& channel, engine::FinishReason reason) {
  {
    std::lock_guard lock(mu_);
    aborts_.push_back({channel, -1, reason});
  }
  cv_.notify_one();
}

void EngineLoop::AbortChoice(const std::shared_ptr<Channel>& channel, size_t choice,
                             engine::FinishReason reason) {
  {
    std::lock_guard lock(mu_);
    aborts_.push_back({channel, static_cast<int64_t>(choice), reason});
  }
  cv_.notify_one();
}

void EngineLoop::StopAccepting() {
  std::lock_guard lock(mu_);
  accepting_ = false;
}

bool EngineLoop::WaitUntilIdle(std::chrono::milliseconds timeout) {
  const Clock::time_point until = Clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (submissions_.empty() && num_live_.load() == 0) return true;
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void EngineLoop::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::Run() {
  for (;;) {
    std::deque<Submission> submissions;
    std::vector<AbortOrder> aborts;
    bool stop = false;
    {
      std::unique_lock lock(mu_);
      // Idle: sleep until a handler brings work. Busy: take what arrived and step again.
      const bool busy = healthy_ && engine_->HasUnfinished();
      cv_.wait(lock, [&] { return busy || stop_ || !submissions_.empty() || !aborts_.empty(); });
      std::swap(submissions, submissions_);
      std::swap(aborts, aborts_);
      num_live_ += queued_choices_;  // in flight from here on, for WaitUntilIdle
      queued_choices_ = 0;
      stop = stop_;
    }
    for (Submission& s : submissions) AddSubmission(s);
    for (const AbortOrder& a : aborts) ApplyAbort(a);
    if (!submissions.empty() || !aborts.empty()) SampleGauges();
    num_live_ = static_cast<int64_t>(live_.size());
    if (stop) {
      // Graceful shutdown: every request in flight ends as aborted, its handler returns.
      std::vector<int64_t> ids;
      for (const auto& [id, live] : live_) ids.push_back(id);
      for (int64_t id : ids) {
        engine_->Abort(id);
        Publish(id);
      }
      FailAll(Unavailable("the server is shutting down"));
      return;
    }
    if (!healthy_ || !engine_->HasUnfinished()) continue;

    // Queue time ends when a request is first scheduled: at the start of that step.
    const Clock::time_point step_start = Clock::now();
    const std::vector<engine::Request*>& updated = engine_->Step();
    const engine::SchedulerOutput& out = engine_->last_schedule();
    if (out.scheduled.empty() && out.preempted_ids.empty()) {
      // Stepping on would spin forever: the engine is dead (503 on /health from now on).
      LogError("engine: a step scheduled nothing with {} running and {} waiting",
               engine_->num_running(), engine_->num_waiting());
      healthy_ = false;
      FailAll(Internal("the engine failed"));
      continue;
    }
    metrics_.AddPreemptions(static_cast<int64_t>(out.preempted_ids.size()));
    for (const engine::ScheduledRequest& sr : out.scheduled) {
      auto it = live_.find(sr.request->id);
      if (it == live_.end() || it->second.scheduled) continue;
      it->second.scheduled = true;
      metrics_.ObserveQueueTime(
          std::chrono::duration<double>(step_start - it->second.arrival).count());
    }
    std::vector<int64_t> ids;
    ids.reserve(updated.size());
    for (const engine::Request* r : updated) ids.push_back(r->id);
    for (int64_t id : ids) Publish(id);
    SampleGauges();
    num_live_ = static_cast<int64_t>(live_.size());
  }
}

void EngineLoop::SampleGauges() {
  engine_waiting_ = engine_->num_waiting();
  const engine::KvCacheManager& cache = engine_->cache_manager();
  metrics_.SetGauges(engine_->num_running(), engine_->num_waiting(), engine_->kv_cache_usage(),
                     cache.prefix_cache_queries(), cache.prefix_cache_hits());
  metrics_.SetSpecStats(engine_->spec_stats());
}

void EngineLoop::AddSubmission(Submission& s) {
  std::vector<int64_t>& ids = ids_of_[s.channel.get()];
  for (size_t c = 0; c < s.choices.size(); ++c) {
    // Prepared on the handler's thread: adding is constant time.
    Result<int64_t> id = engine_->AddPrepared(std::move(*s.choices[c].request));
    if (!id.ok()) {
      // The handler validated already; whatever is left is the engine's word. Choices added
      // before this one are aborted with it.
      for (int64_t added : ids) {
        engine_->Abort(added);
        engine_->Release(added);
        live_.erase(added);
      }
      ids_of_.erase(s.channel.get());
      s.channel->Fail(id.status());
      return;
    }
    ids.push_back(*id);
    live_[*id] =
        Live{.channel = s.channel, .choice = c, .arrival = s.arrival, .last_token = s.arrival};
  }
}

void EngineLoop::ApplyAbort(const AbortOrder& a) {
  auto it = ids_of_.find(a.channel.get());
  if (it == ids_of_.end()) return;  // finished already
  const std::vector<int64_t> ids = it->second;
  for (size_t c = 0; c < ids.size(); ++c) {
    if (a.choice >= 0 && static_cast<int64_t>(c) != a.choice) continue;
    if (!live_.count(ids[c])) continue;
    engine_->Abort(ids[c], a.reason);
    Publish(ids[c]);
  }
}

void EngineLoop::Publish(int64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& live = it->second;
  const engine::Request* r = engine_->Find(id);
  // The prompt's logprobs are complete once the prompt has been computed: with the first token.
  if (r != nullptr && r->params().prompt_logprobs && !live.prompt_logprobs_sent &&
      (!r->output_token_ids.empty() || r->finished())) {
    live.channel->PublishPromptLogprobs(live.choice, r->prompt_logprobs);
    live.prompt_logprobs_sent = true;
  }
  const bool finished = r == nullptr || r->finished();
  const engine::FinishReason reason =
      r == nullptr ? engine::FinishReason::kAbort
                   : (finished ? r->finish_reason : engine::FinishReason::kNone);
  const size_t total = r != nullptr ? r->output_token_ids.size() : live.sent;
  if (total > live.sent) {
    const Clock::time_point now = Clock::now();
    const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    if (live.sent == 0) {
      metrics_.ObserveFirstToken(seconds(now - live.arrival),
                                 static_cast<int64_t>(r->prompt_token_ids.size()));
    } else {
      metrics_.ObserveInterToken(seconds(now - live.last_token));
    }
    metrics_.AddGenerationTokens(static_cast<int64_t>(total - live.sent));
    live.last_token = now;
  }
  if (total > live.sent || finished) {
    std::span<const int32_t> tokens;
    std::span<const engine::SampledToken> logprobs;
    if (r != nullptr) {
      tokens = std::span(r->output_token_ids).subspan(live.sent, total - live.sent);
      if (r->output_logprobs.size() >= total) {
        logprobs = std::span(r->output_logprobs).subspan(live.sent, total - live.sent);
      }
    }
    live.channel->Publish(live.choice, tokens, logprobs, reason,
                          r != nullptr ? r->num_cached_tokens : -1);
    live.sent = total;
  }
  if (!finished) return;
  metrics_.ObserveFinished(reason,
                           std::chrono::duration<double>(Clock::now() - live.arrival).count());
  // The channel's bookkeeping goes with its last request.
  auto ids = ids_of_.find(live.channel.get());
  if (ids != ids_of_.end()) {
    bool any_live = false;
    for (int64_t other : ids->second) any_live |= other != id && live_.count(other) > 0;
    if (!any_live) ids_of_.erase(ids);
  }
  live_.erase(it);
  if (r != nullptr) engine_->Release(id);
}

void EngineLoop::FailAll(const Status& status) {
  for (auto& [id, live] : live_) {
    live.channel->Fail(status);
    engine_->Abort(id);
    engine_->Release(id);
  }
  live_.clear();
  ids_of_.clear();
  num_live_ = 0;
  std::lock_guard lock(mu_);
  for (Submission& s : submissions_) s.channel->Fail(status);
  submissions_.clear();
  queued_choices_ = 0;
}

}  // namespace moeserve::server
