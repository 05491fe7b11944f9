// Scheduler: vLLM's continuous-batching loop (docs/spec/serving.md §2). Each step it gives every
// request tokens to catch its computed count up with its token count, under a token budget
// (max_num_batched_tokens) and a cap on running requests (max_num_seqs): running requests first
// (decodes and the rest of chunked prefills), then waiting ones FCFS. When blocks run out it
// preempts the last running request (recompute: it frees everything and rejoins the head of the
// waiting queue with num_computed_tokens = 0).
//
// Batch invariance (docs/design.md principle 2): with prefill_alignment > 1 (hybrid models: the GDN
// chunk, 64) a prefill chunk that does not reach the end of the request's tokens ends at a
// multiple of prefill_alignment in absolute position, so how the scheduler splits a prompt never
// changes the request's arithmetic. A request whose next aligned chunk does not fit the
// remaining budget waits for the next step.
//
// A steady decode step allocates nothing: the output vectors are members reused across steps.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/kv_cache_manager.h"
#include "engine/request.h"

namespace moeserve::engine {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 4096;
  int64_t prefill_alignment = 1;             // 64 for hybrid models (model::PrefillAlignment)
  int64_t long_prefill_token_threshold = 0;  // 0: off; else cap on a prefill chunk
  // Speculative decoding: drafts per step (0: off), and the KV positions the drafter writes past
  // a request's scheduled tokens (SpecConfig::lookahead), allocated with them.
  int64_t num_speculative_tokens = 0;
  int64_t spec_lookahead = 0;
};

// One request's share of a step.
struct ScheduledRequest {
  Request* request = nullptr;
  int64_t first_pos = 0;       // r.num_computed_tokens before this step
  int64_t num_new_tokens = 0;  // positions [first_pos, first_pos + num_new_tokens)
  bool fresh = false;          // first schedule since admission or preemption: the runner
                               // (re)builds its row and zeroes its state slot
  // Speculative decoding: the last num_draft_tokens of the scheduled positions are the
  // request's drafts (draft_token_ids), verified after its last token.
  int64_t num_draft_tokens = 0;
};

// What a step gave each scheduled request: the tokens it emits -- none for a partial prefill
// chunk; with drafts, the accepted drafts then the recovered or bonus token -- and the drafts
// proposed for its next step. Filled by the model runner (tokens) and the engine's DraftProposer
// (drafts), read by Scheduler::Update.
struct StepOutput {
  std::vector<int32_t> token_start;  // [num_scheduled + 1]: tokens of i in [start[i], start[i+1])
  std::vector<int32_t> tokens;
  std::vector<int32_t> draft_start;  // [num_scheduled + 1], likewise
  std::vector<int32_t> drafts;

  std::span<const int32_t> tokens_of(size_t i) const {
    return {tokens.data() + token_start[i], tokens.data() + token_start[i + 1]};
  }
  std::span<const int32_t> drafts_of(size_t i) const {
    return {drafts.data() + draft_start[i], drafts.data() + draft_start[i + 1]};
  }
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;  // running order
  int64_t total_num_scheduled_tokens = 0;
  std::vector<int64_t> preempted_ids;  // preempted during this Schedule()
  std::vector<int64_t> finished_ids;   // finished or aborted since the previous Schedule()
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager& cache);

  const SchedulerConfig& config() const { return config_; }

  // Queues a request (status kWaiting, id must be new). Rejects -- InvalidArgument naming the
  // problem -- an empty prompt, a prompt longer than max_model_len, or one that could never fit
  // the KV pool. Reserves the request's vectors.
  Status AddRequest(std::unique_ptr<Request> request);

  // Picks this step's work; advances num_computed_tokens of every scheduled request. The
  // returned reference stays valid until the next Schedule().
  const SchedulerOutput& Schedule();

  // After the forward: step.tokens_of(i) are the tokens out.scheduled[i] emits (none for a
  // partial prefill). Rejected drafts' positions go back to uncomputed; tokens are appended one
  // at a time with vLLM's stop check after each (min_tokens, EOS unless ignore_eos,
  // stop_token_ids, max_tokens, max_model_len), so nothing after a stop is kept; full blocks are
  // published to the prefix cache; the next drafts are stored; finished requests are freed.
  // Returns the requests that received a token (finished ones too), in scheduled order, valid
  // until the next call.
  const std::vector<Request*>& Update(const SchedulerOutput& out, const StepOutput& step);

  // Speculative decoding counts over every request so far (vLLM's spec_decode counters).
  const SpecDecodeStats& spec_stats() const { return spec_stats_; }

  // Ends a request in any state, freeing what it holds, with `reason` (kAbort by default; kStop
  // when the frontend's detokenizer matched a stop string). Returns false if the id is unknown
  // or already finished.
  bool Abort(int64_t id, FinishReason reason = FinishReason::kAbort);

  // Finished requests are kept (so callers can read their outputs) until released. Releasing a
  // request the current SchedulerOutput still points to (aborted between Schedule() and
  // Update()) takes effect at the next Schedule().
  const Request* Find(int64_t id) const;
  void Release(int64_t id);

  bool HasUnfinished() const { return !running_.empty() || !waiting_.empty(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }

 private:
  // Tokens r may compute this step: the rest of its tokens and its drafts, clipped by the
  // long-prefill threshold, the remaining budget and max_model_len, then aligned (may be 0).
  int64_t ChunkSize(const Request& r, int64_t budget) const;
  // Allocate(r, num_new) plus the drafter's lookahead, within what r can ever hold.
  bool AllocateFor(Request& r, int64_t num_new);
  // Adds r's next num_new tokens to output_ and advances its computed count.
  void ScheduleChunk(Request& r, int64_t num_new, bool fresh, int64_t& budget);
  // Preempts running_.back() (recompute), returning its tokens to the budget if it was
  // scheduled this step. Returns the victim.
  Request* PreemptLastRunning(int64_t& budget);
  FinishReason CheckStop(const Request& r) const;
  // Marks a running or waiting request finished, freeing what it holds.
  void Finish(Request& r, FinishReason reason);

  SchedulerConfig config_;
  KvCacheManager& cache_;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> running_;  // reserved to max_num_seqs
  std::deque<Request*> waiting_;
  SchedulerOutput output_;
  std::vector<Request*> updated_;
  std::vector<int64_t> finished_since_schedule_;  // moved into output_.finished_ids by Schedule
  std::vector<int64_t> deferred_releases_;        // see Release
  SpecDecodeStats spec_stats_;
};

}  // namespace moeserve::engine
