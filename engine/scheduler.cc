#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "engine/spec_decode/spec_config.h"

namespace moeserve::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

template <typename Container>
void EraseOne(Container& c, const Request* r) {
  const auto it = std::find(c.begin(), c.end(), r);
  CHECK(it != c.end()) << "request " << r->id << " is not in the expected queue";
  c.erase(it);
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& cache)
    : config_(config), cache_(cache) {
  CHECK_GE(config.max_num_seqs, 1);
  CHECK_GE(config.max_num_batched_tokens, 1);
  CHECK_GE(config.max_model_len, 1);
  CHECK_GE(config.prefill_alignment, 1);
  CHECK_GE(config.long_prefill_token_threshold, 0);
  // An aligned chunk must fit an empty step, or a long prompt could never start.
  CHECK_GE(config.max_num_batched_tokens, config.prefill_alignment);
  CHECK(config.long_prefill_token_threshold == 0 ||
        config.long_prefill_token_threshold >= config.prefill_alignment)
      << "long_prefill_token_threshold " << config.long_prefill_token_threshold
      << " is below prefill_alignment " << config.prefill_alignment;
  CHECK_GE(cache.config().max_blocks_per_request * cache.config().block_size, config.max_model_len)
      << "max_blocks_per_request cannot cover max_model_len";

  // Everything a steady step touches is sized here, so steps do not allocate.
  const auto max_seqs = static_cast<size_t>(config.max_num_seqs);
  running_.reserve(max_seqs);
  output_.scheduled.reserve(max_seqs);
  output_.preempted_ids.reserve(max_seqs);
  output_.finished_ids.reserve(max_seqs);
  finished_since_schedule_.reserve(max_seqs);
  spec_stats_.accepted_per_pos.assign(config.num_speculative_tokens, 0);
  updated_.reserve(max_seqs);
}

Status Scheduler::AddRequest(std::unique_ptr<Request> request) {
  CHECK(request != nullptr);
  Request& r = *request;
  CHECK(r.status == RequestStatus::kWaiting && r.num_computed_tokens == 0 &&
        r.output_token_ids.empty() && r.block_ids.empty() && r.state_slot < 0)
      << "request " << r.id << " is not new";

  if (requests_.contains(r.id)) return InvalidArgument("request id {} is already in use", r.id);
  if (r.prompt_token_ids.empty()) return InvalidArgument("prompt is empty");
  const int64_t prompt_len = r.num_prompt_tokens();
  if (prompt_len > config_.max_model_len) {
    return InvalidArgument("The prompt ({} tokens) is longer than the maximum model length of {}",
                           prompt_len, config_.max_model_len);
  }
  if (r.stop.max_tokens < 1) {
    return InvalidArgument("max_tokens must be at least 1, got {}", r.stop.max_tokens);
  }
  if (r.stop.min_tokens < 0 || r.stop.min_tokens > r.stop.max_tokens) {
    return InvalidArgument("min_tokens must be between 0 and max_tokens ({}), got {}",
                           r.stop.max_tokens, r.stop.min_tokens);
  }
  // The most tokens the request can ever hold (written so a huge max_tokens cannot overflow).
  const int64_t max_output_len = std::min(r.stop.max_tokens, config_.max_model_len - prompt_len);
  const int64_t max_len = prompt_len + max_output_len;
  const KvCacheConfig& kv = cache_.config();
  const int64_t blocks_needed = CeilDiv(max_len, kv.block_size);
  if (blocks_needed > kv.num_blocks) {
    return InvalidArgument(
        "the KV cache is too small for this request: {} tokens need {} blocks of {} tokens, but "
        "the pool holds {} blocks",
        max_len, blocks_needed, kv.block_size, kv.num_blocks);
  }

  cache_.ReserveFor(r);
  r.output_token_ids.reserve(std::min(r.stop.max_tokens, config_.max_model_len));
  r.draft_token_ids.reserve(config_.num_speculative_tokens);
  r.spec.accepted_per_pos.assign(config_.num_speculative_tokens, 0);
  waiting_.push_back(&r);
  requests_.emplace(r.id, std::move(request));
  return OkStatus();
}

int64_t Scheduler::ChunkSize(const Request& r, int64_t budget) const {
  const int64_t first_pos = r.num_computed_tokens;
  // Drafts follow the last token (they exist only once it is the one token left to compute);
  // a budget that cuts into them verifies fewer.
  int64_t num_new = r.num_tokens() + static_cast<int64_t>(r.draft_token_ids.size()) - first_pos;
  if (config_.long_prefill_token_threshold > 0) {
    num_new = std::min(num_new, config_.long_prefill_token_threshold);
  }
  num_new = std::min(num_new, budget);
  num_new = std::min(num_new, config_.max_model_len - first_pos);

  // Batch invariance: a chunk that stops short of the request's tokens ends at an absolute
  // multiple of the alignment, however the budget happened to fall this step.
  const int64_t alignment = config_.prefill_alignment;
  int64_t end = first_pos + num_new;
  if (alignment > 1 && end < r.num_tokens()) end = end / alignment * alignment;
  // Hybrid prefix caching: a GDN state exists only at a chunk's end, so a chunk stops where a
  // checkpoint is to be taken (an aligned position: batch invariance holds).
  if (end > first_pos) end = cache_.CheckpointChunkEnd(r, first_pos, end);
  return std::max<int64_t>(end - first_pos, 0);
}

bool Scheduler::AllocateFor(Request& r, int64_t num_new) {
  const int64_t end = r.num_computed_tokens + num_new;
  const int64_t max_len =
      r.num_prompt_tokens() +
      std::min(r.stop.max_tokens, config_.max_model_len - r.num_prompt_tokens());
  const int64_t lookahead =
      std::max<int64_t>(0, std::min(end + config_.spec_lookahead, max_len) - end);
  return cache_.Allocate(r, num_new + lookahead);
}

void Scheduler::ScheduleChunk(Request& r, int64_t num_new, bool fresh, int64_t& budget) {
  const int64_t num_draft = std::max<int64_t>(0, r.num_computed_tokens + num_new - r.num_tokens());
  r.draft_token_ids.resize(num_draft);  // drafts past the budget are dropped, never verified
  output_.scheduled.push_back(ScheduledRequest{.request = &r,
                                               .first_pos = r.num_computed_tokens,
                                               .num_new_tokens = num_new,
                                               .fresh = fresh,
                                               .num_draft_tokens = num_draft});
  // Advanced now, as vLLM does, so a chunked prefill continues next step without waiting for
  // this step's outputs.
  r.num_computed_tokens += num_new;
  output_.total_num_scheduled_tokens += num_new;
  budget -= num_new;
}

Request* Scheduler::PreemptLastRunning(int64_t& budget) {
  Request* victim = running_.back();
  running_.pop_back();
  const auto it = std::find_if(output_.scheduled.begin(), output_.scheduled.end(),
                               [victim](const ScheduledRequest& s) { return s.request == victim; });
  if (it != output_.scheduled.end()) {
    // Scheduled earlier in this step: its tokens go back to the budget. (Never under FCFS,
    // where the victim comes at or after the request asking; kept for a priority policy.)
    budget += it->num_new_tokens;
    output_.total_num_scheduled_tokens -= it->num_new_tokens;
    output_.scheduled.erase(it);
  }
  // Recompute: drop everything (its full blocks stay in the prefix cache) and rejoin the head
  // of the queue.
  cache_.Free(*victim);
  victim->draft_token_ids.clear();
  victim->status = RequestStatus::kPreempted;
  victim->num_computed_tokens = 0;
  ++victim->num_preemptions;
  waiting_.push_front(victim);
  output_.preempted_ids.push_back(victim->id);
  return victim;
}

const SchedulerOutput& Scheduler::Schedule() {
  // The previous output no longer points anywhere: deferred releases can happen.
  for (const int64_t id : deferred_releases_) requests_.erase(id);
  deferred_releases_.clear();

  output_.scheduled.clear();
  output_.total_num_scheduled_tokens = 0;
  output_.preempted_ids.clear();
  output_.finished_ids.swap(finished_since_schedule_);
  finished_since_schedule_.clear();
  int64_t budget = config_.max_num_batched_tokens;

  // Pass 1: running requests, in order (decodes and the rest of chunked prefills). A request
  // with nothing to do this step is skipped, not a barrier.
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    const int64_t num_new = ChunkSize(r, budget);
    if (num_new == 0) continue;
    bool allocated = AllocateFor(r, num_new);
    while (!allocated) {
      // Victims come from the back, so running_[0, i) stays put; r itself may be the last.
      if (PreemptLastRunning(budget) == &r) break;
      allocated = AllocateFor(r, num_new);
    }
    if (allocated) ScheduleChunk(r, num_new, /*fresh=*/false, budget);
  }

  // Pass 2: waiting requests, FCFS -- the first that cannot start stops the pass. Skipped after a
  // preemption: memory is short, and a new request would only be preempted in turn.
  while (output_.preempted_ids.empty() && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs && budget > 0) {
    Request& r = *waiting_.front();
    const bool first_schedule = r.status == RequestStatus::kWaiting;
    const int64_t num_cached = cache_.TakeCachedPrefix(r);
    r.num_computed_tokens = num_cached;
    const int64_t num_new = ChunkSize(r, budget);
    if (num_new == 0 || !AllocateFor(r, num_new)) {
      cache_.Free(r);  // the prefix blocks it took; it keeps its place at the head
      r.num_computed_tokens = 0;
      break;
    }
    if (first_schedule) r.num_cached_tokens = num_cached;
    waiting_.pop_front();
    r.status = RequestStatus::kRunning;
    running_.push_back(&r);
    ScheduleChunk(r, num_new, /*fresh=*/true, budget);
  }

  CHECK_LE(output_.total_num_scheduled_tokens, config_.max_num_batched_tokens);
  CHECK_LE(static_cast<int64_t>(running_.size()), config_.max_num_seqs);
  return output_;
}

FinishReason Scheduler::CheckStop(const Request& r) const {
  // vLLM's check_stop order. One deviation: max_model_len is a hard limit even before
  // min_tokens is reached (vLLM's frontend caps max_tokens to the room left instead), so a
  // request never outgrows its KV reservation.
  const int64_t num_output = r.num_output_tokens();
  const int32_t last = r.output_token_ids.back();
  if (num_output >= r.stop.min_tokens) {
    if (!r.stop.ignore_eos && Contains(r.stop.eos_token_ids, last)) return FinishReason::kStop;
    if (Contains(r.stop.stop_token_ids, last)) return FinishReason::kStop;
    if (num_output >= r.stop.max_tokens) return FinishReason::kLength;
  }
  if (r.num_tokens() >= config_.max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

void Scheduler::Finish(Request& r, FinishReason reason) {
  if (r.status == RequestStatus::kRunning) {
    EraseOne(running_, &r);
  } else {
    EraseOne(waiting_, &r);
  }
  cache_.Free(r);  // nothing to free for a waiting request
  r.draft_token_ids.clear();
  r.status = RequestStatus::kFinished;
  r.finish_reason = reason;
  finished_since_schedule_.push_back(r.id);
}

const std::vector<Request*>& Scheduler::Update(const SchedulerOutput& out, const StepOutput& step) {
  updated_.clear();
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledRequest& s = out.scheduled[i];
    Request& r = *s.request;
    if (r.status != RequestStatus::kRunning) continue;  // aborted since Schedule()
    if (s.fresh) cache_.ReleaseRestore(r);              // its checkpoint was copied in this step
    const std::span<const int32_t> emitted = step.tokens_of(i);
    if (emitted.empty()) {
      cache_.CacheFullBlocks(r);  // a partial prefill chunk: nothing sampled
      cache_.MaybeCheckpoint(r, r.num_computed_tokens);
      continue;
    }
    // The drafts after the first rejection were computed in vain: their positions (KV slots,
    // state slots) are simply written again.
    const int64_t accepted = static_cast<int64_t>(emitted.size()) - 1;
    CHECK_LE(accepted, s.num_draft_tokens) << "request " << r.id;
    r.num_computed_tokens -= s.num_draft_tokens - accepted;
    CHECK_EQ(r.num_computed_tokens, r.num_tokens() + accepted)
        << "a token was sampled for a partial prefill chunk of request " << r.id;
    const int64_t state_pos = r.num_computed_tokens;  // what r's GDN state slot has absorbed
    if (s.num_draft_tokens > 0) {
      r.spec.AddStep(s.num_draft_tokens, accepted);
      spec_stats_.AddStep(s.num_draft_tokens, accepted);
      // The running acceptance of each position this step decided (adaptive drafting).
      constexpr float a = SpecConfig::kAcceptanceSmoothing;
      for (int64_t pos = 0; pos < accepted; ++pos) {
        r.draft_acceptance[pos] += a * (1.0f - r.draft_acceptance[pos]);
      }
      if (accepted < s.num_draft_tokens) r.draft_acceptance[accepted] *= 1.0f - a;
    }
    FinishReason reason = FinishReason::kNone;
    for (const int32_t token : emitted) {
      r.output_token_ids.push_back(token);
      reason = CheckStop(r);
      if (reason != FinishReason::kNone) break;
    }
    // A stop inside an accepted run: what follows it is dropped (its logprobs too).
    r.num_computed_tokens = std::min(r.num_computed_tokens, r.num_tokens());
    if (r.output_logprobs.size() > r.output_token_ids.size()) {
      r.output_logprobs.resize(r.output_token_ids.size());
    }
    cache_.CacheFullBlocks(r);
    // Before Finish frees the state slot: the copy runs before anything can write it again.
    // Accepted drafts may have run past a checkpoint position: the states after the last token
    // and each accepted draft but the last are in r's spec slots (ModelRunner swapped the last
    // one in), in order of position.
    for (int64_t q = state_pos - accepted; q < state_pos && !r.spec_state_slots.empty(); ++q) {
      const int64_t j = q == state_pos - accepted ? accepted - 1 : q - (state_pos - accepted) - 1;
      cache_.MaybeCheckpoint(r, q, r.spec_state_slots[j]);
    }
    cache_.MaybeCheckpoint(r, state_pos);
    if (reason != FinishReason::kNone) {
      Finish(r, reason);
    } else {
      const std::span<const int32_t> drafts = step.drafts_of(i);
      r.draft_token_ids.assign(drafts.begin(), drafts.end());
    }
    updated_.push_back(&r);
  }
  return updated_;
}

bool Scheduler::Abort(int64_t id, FinishReason reason) {
  const auto it = requests_.find(id);
  if (it == requests_.end() || it->second->finished()) return false;
  Finish(*it->second, reason);
  return true;
}

const Request* Scheduler::Find(int64_t id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::Release(int64_t id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const Request* r = it->second.get();
  CHECK(r->finished()) << "request " << id << " released before it finished";
  const bool in_current_output =
      std::any_of(output_.scheduled.begin(), output_.scheduled.end(),
                  [r](const ScheduledRequest& s) { return s.request == r; });
  if (in_current_output) {
    deferred_releases_.push_back(id);
  } else {
    requests_.erase(it);
  }
}

}  // namespace moeserve::engine
