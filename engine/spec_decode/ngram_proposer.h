// Prompt lookup (vLLM's "ngram" drafter, docs/spec/serving.md §4): a request's drafts are the
// tokens that followed the latest earlier occurrence of its own last few tokens. No model runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/spec_decode/draft_proposer.h"

namespace moeserve::engine {

// Prompt lookup: finds the longest n-gram (prompt_lookup_min <= n <= prompt_lookup_max) that
// ends `tokens` and occurred earlier in it -- the most recent such occurrence -- and writes up
// to max_drafts of the tokens that followed it to drafts. Returns how many (0: no match).
// O(len(tokens) * prompt_lookup_max); allocates nothing.
int64_t NgramPropose(std::span<const int32_t> tokens, int64_t prompt_lookup_min,
                     int64_t prompt_lookup_max, int64_t max_drafts, int32_t* drafts);

// NgramPropose over each drafting request's prompt, outputs and this step's tokens.
class NgramProposer final : public DraftProposer {
 public:
  NgramProposer(const SpecConfig& spec, const ProposerLimits& limits);

 private:
  void ProposeWithin(const SchedulerOutput& out, std::span<const int32_t> budget,
                     StepOutput& step) override;

  std::vector<int32_t> history_;  // a request's prompt + outputs + this step's tokens
};

}  // namespace moeserve::engine
