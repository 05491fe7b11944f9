// Gated DeltaNet, the linear-attention mixer of Qwen3-Next / Qwen3.5 (docs/spec/model.md §3.c).
#pragma once

#include "model/cache.h"
#include "model/layer_context.h"
#include "model/weights.h"

namespace moeserve::model {

// Gated DeltaNet (docs/spec/model.md §3.c) over x [T, H] (already input-normed) of the batch's tokens; each
// sequence continues from its state slot in `cache` (layer ctx.layer): conv window and S,
// updated. Decode tokens take the recurrent step, prefill chunks the chunked form. out: [T, H],
// this rank's part (as for every sub-layer: the ranks' outputs sum to the layer's).
void GatedDeltaNet(const LayerContext& ctx, const GdnWeights& w, const TokenBatch& batch,
                   const float* x, ModelCache& cache, float* out);

}  // namespace moeserve::model
