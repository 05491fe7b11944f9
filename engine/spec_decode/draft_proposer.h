// DraftProposer: what the engine asks of speculative decoding after each step -- the drafts the
// running requests carry into their next step's verify run (docs/spec/serving.md §4-5). Two
// drafters implement it: prompt lookup in a request's own tokens (NgramProposer, ngram_proposer.h)
// and the model's MTP head chained K times (MtpProposer, mtp_proposer.h); the engine makes the one
// its SpecConfig names.
//
// Shared by both: drafting pauses while more requests run than SpecConfig::disable_batch_size,
// and each request drafts at most its budget: K cut by its running acceptance (DraftBudget
// below), or under "auto" what DraftPolicy (draft_policy.h) finds pays, from the step times the
// engine reports (RecordStep). Every buffer is sized at construction, so proposing allocates
// nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/spec_decode/draft_policy.h"
#include "engine/spec_decode/spec_config.h"

namespace moeserve::engine {

// The engine's sizes a proposer plans its buffers for.
struct ProposerLimits {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;
  // A hybrid model verifies drafts into a request's draft state slots: a request holding none
  // (KvCacheManager hands out a set while one is free) drafts nothing.
  bool drafts_need_state_slots = false;
};

class DraftProposer {
 public:
  virtual ~DraftProposer() = default;
  DraftProposer(const DraftProposer&) = delete;
  DraftProposer& operator=(const DraftProposer&) = delete;

  // The drafts of the requests of `out` after the step `step` holds the emitted tokens of
  // (step.tokens_of(i) for out.scheduled[i]): appended to step.drafts, with step.draft_start,
  // which the runner left at no drafts, marking each request's. A request that emitted nothing
  // drafts nothing.
  void Propose(const SchedulerOutput& out, StepOutput& step);
  // The step `out` took `nanos`, this step's Propose included (drafts sized by cost measure
  // their steps; other proposers ignore it).
  void RecordStep(const SchedulerOutput& out, int64_t nanos);

  const SpecConfig& spec() const { return spec_; }
  const DraftPolicy* policy() const { return policy_ ? &*policy_ : nullptr; }

 protected:
  DraftProposer(const SpecConfig& spec, const ProposerLimits& limits);

  // Drafts for out.scheduled[i], at most budget[i] of them (0: none), appended to step.drafts;
  // step.draft_start[i + 1] set after each request.
  virtual void ProposeWithin(const SchedulerOutput& out, std::span<const int32_t> budget,
                             StepOutput& step) = 0;

  // A step has at most one sequence per token and per running request.
  int64_t max_seqs() const { return max_seqs_; }
  const ProposerLimits& limits() const { return limits_; }

 private:
  // Drafts request s may propose at most: K, capped so the next verify stays within max_tokens
  // and max_model_len. 0 when it emitted nothing or stopped drafting.
  int64_t DraftLimit(const ScheduledRequest& s, int64_t num_emitted) const;
  // DraftLimit cut by the request's running acceptance (SpecConfig::min_acceptance).
  int64_t DraftBudget(const ScheduledRequest& s, int64_t num_emitted);

  SpecConfig spec_;
  ProposerLimits limits_;
  int64_t max_seqs_ = 0;
  std::vector<int32_t> budget_;  // [seqs]
  // Drafts sized by cost only: the policy, its inputs, and this step's drafting time.
  std::optional<DraftPolicy> policy_;
  std::vector<Request*> requests_;                  // [seqs]
  std::vector<int32_t> limit_;                      // [seqs]
  int64_t propose_nanos_ = 0, propose_passes_ = 0;  // this step's drafting: time, deepest draft
};

}  // namespace moeserve::engine
