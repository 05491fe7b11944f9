// The dense feed-forward of the layers that are not MoE: a SwiGLU MLP.
#pragma once

#include <cstdint>

#include "model/layer_context.h"
#include "model/weights.h"

namespace moeserve::model {

// Dense SwiGLU MLP: out = down(silu(gate x) * up x). out: [T, H].
void SwiGluMlp(const LayerContext& ctx, const SwiGluWeights& w, const float* x, int64_t T,
               float* out);

}  // namespace moeserve::model
