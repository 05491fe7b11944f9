// The decoder layer: a mixer (Gated DeltaNet or full attention) and a feed-forward (sparse MoE or
// dense MLP), each pre-normed and added to the residual stream; under --tp / --ep the ranks'
// parts are reduced with the residual add and the next norm (ReduceAddNorm).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/cache.h"
#include "model/layer_context.h"
#include "model/moe.h"
#include "model/weights.h"

namespace moeserve::model {

// y[t] = RMSNorm(x[t]) * w for T rows of n (w already holds the 1 of a (1 + w) norm).
void RmsNormRows(const float* x, int64_t T, int64_t n, const std::vector<float>& w, float eps,
                 float* y);

// x [T, H] += the sum over ranks of delta; normed = RmsNorm(x) * norm. Fused
// (ctx.options.fused_allreduce_norm, no tap set): each row is added and normed as the
// communicator reduces it (Communicator::AllReduceRows), delta's reduced values never written;
// else all-reduce, add, norm as three passes (and the tap sees delta as delta_name). The same
// bits either way.
// `how`: delta as SparseMoe left it (its owned rows are gathered instead of summed, its shared
// expert added after the sum).
void ReduceAddNorm(const LayerContext& ctx, float* delta, std::string_view delta_name, float* x,
                   const std::vector<float>& norm, int64_t T, float* normed,
                   const MoeResult& how = {});

// One pre-norm decoder layer over the residual stream x [T, H] (updated in place):
// x += mixer(norm(x)); x += ffn(norm(x)). On entry `normed` holds input_norm(x); the layer ends
// with next_normed = next_norm(x) -- the next layer's input norm, or the final norm -- computed
// with its last reduction (ReduceAddNorm). next_normed may be `normed`. The mixer's cache is
// layer ctx.layer of `cache`. `next` is what the forward reads after this layer: the next
// layer's weights, or (after the last) lm_head; either may be null (ctx.warmer warms them).
struct NextWeights {
  const DecoderLayerWeights* layer = nullptr;
  const Tensor* lm_head = nullptr;
};
void DecoderLayer(const LayerContext& ctx, const DecoderLayerWeights& w, const TokenBatch& batch,
                  float* x, float* normed, const std::vector<float>& next_norm, float* next_normed,
                  ModelCache& cache, NextWeights next = {});

}  // namespace moeserve::model
