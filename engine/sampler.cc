#include "engine/sampler.h"

namespace moeserve::engine {

int32_t GreedyToken(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace moeserve::engine
