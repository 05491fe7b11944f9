// The gated delta rule of Gated DeltaNet (docs/spec/model.md §3.c.5 / §3.c.6), one value head at a
// time, with an f32 state S of [dk][dv] (row i over the key dim, column j over the value dim).
//
// Inputs are already prepared by the layer: q and k l2-normalized (q also scaled by 1/sqrt(dk)),
// g = -exp(A_log) * softplus(a + dt_bias) (log of the decay), beta = sigmoid(b).
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// One token (the decode path and the semantic definition):
//   S = exp(g) * S;  m = S^T k;  delta = beta * (v - m);  S += k (x) delta;  out = S^T q.
// q, k: [dk]; v, out: [dv].
void GatedDeltaRuleStep(float* S, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* out);

// T <= 64 consecutive tokens in the chunked (WY) form, for prefill. Equals T calls of
// GatedDeltaRuleStep up to rounding. Row t of q/k is at q + t * qk_stride, of v at
// v + t * v_stride, of out at out + t * out_stride; g and beta are [T].
void GatedDeltaRuleChunk(float* S, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t T, int64_t dk, int64_t dv, float* out, int64_t out_stride);

inline constexpr int64_t kGdnChunkSize = 64;

}  // namespace moeserve::kernels
