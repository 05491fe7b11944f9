#include "engine/request.h"

namespace moeserve::engine {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "none";
}

void SpecDecodeStats::Add(const SpecDecodeStats& other) {
  num_drafts += other.num_drafts;
  num_draft_tokens += other.num_draft_tokens;
  num_accepted_tokens += other.num_accepted_tokens;
  if (accepted_per_pos.size() < other.accepted_per_pos.size()) {
    accepted_per_pos.resize(other.accepted_per_pos.size(), 0);
  }
  for (size_t i = 0; i < other.accepted_per_pos.size(); ++i) {
    accepted_per_pos[i] += other.accepted_per_pos[i];
  }
}

}  // namespace moeserve::engine
