#include "engine/spec_decode/draft_proposer.h"

#include <algorithm>

#include "core/check.h"
#include "core/timer.h"

namespace moeserve::engine {

DraftProposer::DraftProposer(const SpecConfig& spec, const ProposerLimits& limits)
    : spec_(spec),
      limits_(limits),
      max_seqs_(std::min(limits.max_num_seqs, limits.max_num_batched_tokens)) {
  CHECK(spec.enabled()) << "a proposer for --spec none";
  CHECK_GT(max_seqs_, 0);
  budget_.resize(max_seqs_);
  if (spec.sized_by_cost) {
    policy_.emplace(/*stop_idle_requests=*/spec.method == SpecMethod::kMtp);
    requests_.resize(max_seqs_);
    limit_.resize(max_seqs_);
  }
}

void DraftProposer::Propose(const SchedulerOutput& out, StepOutput& step) {
  const int64_t begin = MonotonicNanos();
  propose_nanos_ = propose_passes_ = 0;
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  CHECK_LE(num_seqs, max_seqs_);
  // Drafting pauses while the batch is large enough to keep the cores busy by itself.
  if (spec_.disable_batch_size > 0 && num_seqs > spec_.disable_batch_size) return;
  const std::span<int32_t> budget(budget_.data(), num_seqs);
  if (policy_) {
    for (int64_t i = 0; i < num_seqs; ++i) {
      const ScheduledRequest& s = out.scheduled[i];
      const auto emitted = static_cast<int64_t>(step.tokens_of(i).size());
      if (s.num_draft_tokens > 0 && emitted > 0) {
        policy_->RecordVerify(s.num_draft_tokens, emitted - 1);
      }
      requests_[i] = s.request;
      limit_[i] = static_cast<int32_t>(DraftLimit(s, emitted));
    }
    policy_->Choose(std::span<Request* const>(requests_.data(), num_seqs),
                    std::span<const int32_t>(limit_.data(), num_seqs), budget);
  } else {
    for (int64_t i = 0; i < num_seqs; ++i) {
      budget[i] = static_cast<int32_t>(
          DraftBudget(out.scheduled[i], static_cast<int64_t>(step.tokens_of(i).size())));
    }
  }
  ProposeWithin(out, budget, step);
  propose_nanos_ = MonotonicNanos() - begin;
  propose_passes_ = num_seqs > 0 ? *std::max_element(budget.begin(), budget.end()) : 0;
}

void DraftProposer::RecordStep(const SchedulerOutput& out, int64_t nanos) {
  if (!policy_ || out.scheduled.empty()) return;
  // Decode steps only: every request one token after its drafts (a prefill chunk's cost, or an
  // MTP pass over it, is not what a draft adds).
  int64_t tokens = 0;
  for (const ScheduledRequest& s : out.scheduled) {
    if (s.num_new_tokens != 1 + s.num_draft_tokens) return;
    tokens += s.num_new_tokens;
  }
  policy_->RecordForward(tokens, nanos - propose_nanos_);
  policy_->RecordPropose(propose_passes_, propose_nanos_);
}

int64_t DraftProposer::DraftLimit(const ScheduledRequest& s, int64_t num_emitted) const {
  const Request& r = *s.request;
  if (num_emitted == 0 || r.drafts_stopped) return 0;
  if (limits_.drafts_need_state_slots && r.spec_state_slots.empty()) return 0;
  const int64_t num_tokens = r.num_tokens() + num_emitted;
  const int64_t remaining = r.stop.max_tokens - (r.num_output_tokens() + num_emitted);
  // The next step emits at most drafts + 1 tokens and verifies positions up to
  // num_tokens - 1 + drafts, which must stay below max_model_len.
  return std::max<int64_t>(0, std::min({spec_.num_speculative_tokens, remaining - 1,
                                        limits_.max_model_len - num_tokens}));
}

int64_t DraftProposer::DraftBudget(const ScheduledRequest& s, int64_t num_emitted) {
  Request& r = *s.request;
  const int64_t limit = DraftLimit(s, num_emitted);
  if (spec_.min_acceptance <= 0 || limit == 0) return limit;
  int64_t n = 0;
  for (double reach = 1; n < limit; ++n) {
    reach *= r.draft_acceptance[n];
    if (reach < spec_.min_acceptance) break;
  }
  if (n > 0) {
    r.steps_without_drafts = 0;
  } else if (++r.steps_without_drafts >= SpecConfig::kProbeInterval) {
    r.steps_without_drafts = 0;
    n = 1;  // a probe: the model may have come to agree again
  }
  return n;
}

}  // namespace moeserve::engine
