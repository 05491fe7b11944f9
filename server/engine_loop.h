// EngineLoop: the one thread that owns the Engine (which is single-threaded). HTTP handler
// threads submit requests and aborts through a queue and read each request's tokens from its
// own Channel, so no handler blocks the loop or another handler. The loop sleeps while there is
// no work and steps the engine while there is.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "server/metrics.h"

namespace moeserve::server {

// What a choice produced since the last Channel::Wait.
struct ChoiceUpdate {
  // The prompt's logprobs (one per prompt token after the first), once, when prompt_logprobs
  // were asked: with the first tokens, or at the end.
  std::vector<engine::SampledToken> prompt_logprobs;
  bool has_prompt_logprobs = false;
  std::vector<int32_t> tokens;
  std::vector<engine::SampledToken> logprobs;  // one per token when logprobs were asked
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  int64_t num_cached_tokens = -1;  // once scheduled: prompt tokens the prefix cache supplied
};

// One engine request of an HTTP request -- a choice of one of its prompts -- made on the
// handler's thread (PrepareChoices), so that the loop only queues it; or why it could not be
// made (Submit then fails the request's channel with it, before anything is queued).
struct ChoiceInput {
  Result<std::unique_ptr<engine::Request>> request;
};

// The engine requests of one API request, made on the caller's thread: n choices per prompt in
// vLLM's order (choice p * n + j is prompt p's j-th, seeded seed + j), all sharing `params`
// (Engine::PrepareParams). Unseeded choices get seeds drawn here. Whatever a request costs to
// prepare -- its samplers' [vocab] arrays, its prompts' checks -- is paid by the caller.
std::vector<ChoiceInput> PrepareChoices(const engine::Engine& engine,
                                        const std::shared_ptr<const engine::PreparedParams>& params,
                                        std::span<const std::vector<int32_t>> prompts);

// The outputs of one HTTP request: its choices (n per prompt), written by the loop, read by the
// handler thread.
class Channel {
 public:
  // `on_news`, when given, is called after every Publish, PublishPromptLogprobs and Fail, outside
  // the channel's lock, on the thread that published (the loop's, or Submit's caller for a
  // refusal): an event-driven reader's wake-up, which must not block.
  explicit Channel(size_t num_choices, std::function<void()> on_news = {})
      : choices_(num_choices), on_news_(std::move(on_news)) {}

  // Waits up to `timeout` for news, then moves it into *updates (one per choice; empty ones
  // when nothing happened). Returns the request's error, if the engine refused or failed it.
  Status Wait(std::chrono::milliseconds timeout, std::vector<ChoiceUpdate>* updates);

  // Loop side.
  // New tokens of a choice and, when they end it, the reason (in one update, so that a reader
  // sees the last token together with the end).
  // `num_cached_tokens`: the prompt tokens the prefix cache supplied (-1: not known yet).
  void Publish(size_t choice, std::span<const int32_t> tokens,
               std::span<const engine::SampledToken> logprobs,
               engine::FinishReason finish = engine::FinishReason::kNone,
               int64_t num_cached_tokens = -1);
  void PublishPromptLogprobs(size_t choice, std::span<const engine::SampledToken> logprobs);
  void Fail(const Status& status);
  // The request's error so far (OK while none).
  Status error() const {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  void Notify();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ChoiceUpdate> choices_;  // news per choice since the last Wait
  const std::function<void()> on_news_;
  Status error_;
  bool news_ = false;
};

class EngineLoop {
 public:
  // Starts the loop thread.
  explicit EngineLoop(std::unique_ptr<engine::Engine> engine);
  ~EngineLoop();  // Stop()

  // Queues a request: one engine request per element of `choices` (PrepareChoices'). A choice
  // that could not be prepared fails the channel at once; the engine's refusal (AddPrepared's
  // error) arrives on it later. With max_waiting > 0, a request whose choices would make more
  // than max_waiting engine requests wait (queued here or in the scheduler's waiting queue) is
  // refused at once: its channel fails Unavailable (a 503).
  // `on_news`: the channel's wake-up (Channel's constructor).
  std::shared_ptr<Channel> Submit(std::vector<ChoiceInput> choices, int64_t max_waiting = 0,
                                  std::function<void()> on_news = {});
  // Ends every unfinished choice of the channel's request (a client gone: kAbort; a stop string
  // found: kStop). Harmless when they have finished.
  void Abort(const std::shared_ptr<Channel>& channel,
             engine::FinishReason reason = engine::FinishReason::kAbort);
  void AbortChoice(const std::shared_ptr<Channel>& channel, size_t choice,
                   engine::FinishReason reason);

  // Graceful shutdown, first half: later submissions fail at once (503), what is in flight goes
  // on. Then WaitUntilIdle waits up to `timeout` for it to finish (true when it did).
  void StopAccepting();
  bool WaitUntilIdle(std::chrono::milliseconds timeout);

  // Aborts everything in flight and joins the thread; later submissions fail at once.
  void Stop();

  // False after an engine step failed: the engine is dead, as vLLM's EngineDeadError.
  bool healthy() const { return healthy_.load(); }
  const engine::EngineLayout& layout() const { return engine_->layout(); }
  // The engine, for handler threads to prepare requests with (PrepareChoices): from there only
  // PrepareParams, PrepareRequest, layout and model, which read nothing the loop changes.
  const engine::Engine& engine() const { return *engine_; }
  // GET /metrics' numbers, recorded by the loop thread (thread-safe to render).
  const Metrics& metrics() const { return metrics_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Submission {
    std::shared_ptr<Channel> channel;
    Clock::time_point arrival;
    std::vector<ChoiceInput> choices;
  };
  struct AbortOrder {
    std::shared_ptr<Channel> channel;
    int64_t choice;  // -1: all
    engine::FinishReason reason;
  };
  // An engine request: which channel and choice it feeds, and how many tokens went out.
  struct Live {
    std::shared_ptr<Channel> channel;
    size_t choice = 0;
    size_t sent = 0;
    Clock::time_point arrival;     // the HTTP handler's Submit
    Clock::time_point last_token;  // when the latest tokens went out
    bool scheduled = false;        // first scheduled yet (queue time recorded)
    bool prompt_logprobs_sent = false;
  };

  void Run();
  void AddSubmission(Submission& s);
  void ApplyAbort(const AbortOrder& a);
  // Publishes the new tokens of request `id`; on its end, finishes the choice and releases it.
  void Publish(int64_t id);
  void FailAll(const Status& status);
  // Samples the engine's gauges and prefix-cache counters into metrics_.
  void SampleGauges();

  std::unique_ptr<engine::Engine> engine_;
  std::atomic<bool> healthy_{true};
  Metrics metrics_;

  std::mutex mu_;  // guards the queues and stop_
  std::condition_variable cv_;
  std::deque<Submission> submissions_;
  int64_t queued_choices_ = 0;  // the choices of submissions_
  // The scheduler's waiting requests, as the loop last saw them (for Submit's bound).
  std::atomic<int64_t> engine_waiting_{0};
  std::vector<AbortOrder> aborts_;
  bool stop_ = false;
  bool accepting_ = true;
  // Engine requests in flight (live_), as the loop last saw them (for WaitUntilIdle).
  std::atomic<int64_t> num_live_{0};

  // Loop thread only.
  std::unordered_map<int64_t, Live> live_;                           // engine id -> its channel
  std::unordered_map<const Channel*, std::vector<int64_t>> ids_of_;  // channel -> ids per choice

  std::thread thread_;
};

}  // namespace moeserve::server
