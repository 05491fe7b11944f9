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

void SpecDecodeStats::AddStep(int64_t drafts, int64_t accepted) {
  ++num_drafts;
  num_draft_tokens += drafts;
  num_accepted_tokens += accepted;
  for (int64_t pos = 0; pos < accepted; ++pos) ++accepted_per_pos[pos];
}

}  // namespace moeserve::engine
