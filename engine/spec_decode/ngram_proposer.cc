#include "engine/spec_decode/ngram_proposer.h"

#include <algorithm>

namespace moeserve::engine {

int64_t NgramPropose(std::span<const int32_t> tokens, int64_t prompt_lookup_min,
                     int64_t prompt_lookup_max, int64_t max_drafts, int32_t* drafts) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0 || prompt_lookup_min < 1) return 0;
  // Longest n first; for each, the most recent earlier occurrence (start < len - n).
  for (int64_t n = std::min(prompt_lookup_max, len - 1); n >= prompt_lookup_min; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, tokens.data() + start)) continue;
      const int64_t follow = start + n;  // < len: the match ends before the suffix does
      const int64_t count = std::min(max_drafts, len - follow);
      std::copy(tokens.data() + follow, tokens.data() + follow + count, drafts);
      return count;
    }
  }
  return 0;
}

NgramProposer::NgramProposer(const SpecConfig& spec, const ProposerLimits& limits)
    : DraftProposer(spec, limits) {
  // A request's tokens stay within max_model_len; a verify step emits at most K + 1 more.
  history_.reserve(limits.max_model_len + spec.num_speculative_tokens + 1);
}

void NgramProposer::ProposeWithin(const SchedulerOutput& out, std::span<const int32_t> budget,
                                  StepOutput& step) {
  const int64_t num_seqs = static_cast<int64_t>(out.scheduled.size());
  for (int64_t i = 0; i < num_seqs; ++i) {
    if (budget[i] > 0) {
      // Prompt lookup over prompt + outputs + this step's tokens.
      const Request& r = *out.scheduled[i].request;
      const std::span<const int32_t> emitted = step.tokens_of(i);
      history_.assign(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
      history_.insert(history_.end(), r.output_token_ids.begin(), r.output_token_ids.end());
      history_.insert(history_.end(), emitted.begin(), emitted.end());
      const size_t start = step.drafts.size();
      step.drafts.resize(start + budget[i]);
      const int64_t n = NgramPropose(history_, spec().prompt_lookup_min, spec().prompt_lookup_max,
                                     budget[i], step.drafts.data() + start);
      step.drafts.resize(start + n);
    }
    step.draft_start[i + 1] = static_cast<int32_t>(step.drafts.size());
  }
}

}  // namespace moeserve::engine
