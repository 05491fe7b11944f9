// Sparse MoE: the router, the routed experts grouped by expert, the shared expert, and under --ep
// the combine of the ranks' parts (all-gather, or the all-to-all to the tokens' owners).
#pragma once

#include <cstdint>

#include "model/layer_context.h"
#include "model/weights.h"

namespace moeserve::model {

// What SparseMoe leaves in `out`: by default this rank's part of every row (the ranks' outputs
// sum to the layer's).
struct MoeResult {
  bool owned_rows = false;  // instead the finished rows of the tokens this rank owns (--ep)
  // --ep's all-gather path: each row, once summed, takes + shared_gates[t] * shared_out[t]
  // ([T] and [T, H]); null otherwise.
  const float* shared_out = nullptr;
  const float* shared_gates = nullptr;
};

// Sparse MoE (docs/spec/model.md §3.e): f32 softmax router, top-k, renormalization, SwiGLU experts summed per
// token in ascending expert order, plus the shared expert x sigmoid(shared_expert_gate).
// out: [T, H], as the return value says (see ForwardOptions for --ep's paths; every path gives
// a token the same bits).
MoeResult SparseMoe(const LayerContext& ctx, const MoeWeights& w, const float* x, int64_t T,
                    float* out);

}  // namespace moeserve::model
