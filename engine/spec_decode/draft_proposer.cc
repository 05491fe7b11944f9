#include "engine/spec_decode/draft_proposer.h"

#include <algorithm>

#include "core/check.h"

namespace moeserve::engine {

DraftProposer::DraftProposer(const SpecConfig& spec, const ProposerLimits& limits)
    : spec_(spec),
      limits_(limits),
      max_seqs_(std::min(limits.max_num_seqs, limits.max_num_batched_tokens)) {
  CHECK(spec.enabled()) << "a proposer for --spec none";
  CHECK_GT(max_seqs_, 0);
  budget_.resize(max_seqs_);
}

void DraftProposer::Propose(const SchedulerOutput& out, StepOutput& step) {
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  CHECK_LE(num_seqs, max_seqs_);
  // Drafting pauses while the batch is large enough to keep the cores busy by itself.
  if (spec_.disable_batch_size > 0 && num_seqs > spec_.disable_batch_size) return;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const std::span<const int32_t> emitted = step.tokens_of(i);
    budget_[i] =
        static_cast<int32_t>(DraftBudget(out.scheduled[i], static_cast<int64_t>(emitted.size())));
  }
  ProposeWithin(out, std::span<const int32_t>(budget_.data(), num_seqs), step);
}

int64_t DraftProposer::DraftBudget(const ScheduledRequest& s, int64_t num_emitted) {
  Request& r = *s.request;
  if (num_emitted == 0) return 0;
  const int64_t num_tokens = r.num_tokens() + num_emitted;
  const int64_t remaining = r.stop.max_tokens - (r.num_output_tokens() + num_emitted);
  // The next step emits at most drafts + 1 tokens and verifies positions up to
  // num_tokens - 1 + drafts, which must stay below max_model_len.
  const int64_t limit = std::max<int64_t>(0, std::min({spec_.num_speculative_tokens, remaining - 1,
                                                       limits_.max_model_len - num_tokens}));
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
