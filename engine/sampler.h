// Token selection from logits. Greedy only for now: the sampling issue adds vLLM's sampling
// parameters and logits processors.
#pragma once

#include <cstdint>

namespace moeserve::engine {

// argmax over logits [vocab]; ties go to the lowest id (as torch.argmax on CPU).
int32_t GreedyToken(const float* logits, int64_t vocab);

}  // namespace moeserve::engine
