// Scalar twins of kernels/gated_delta_rule.h: the recurrent rule, literally (double accumulation
// where it sums), and the chunked form exactly as HF's torch_chunk_gated_delta_rule writes it.
#pragma once

#include <cstdint>

namespace moeserve::kernels::ref {

void GatedDeltaRuleStep(float* S, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* out);
void GatedDeltaRuleChunk(float* S, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t T, int64_t dk, int64_t dv, float* out, int64_t out_stride);

}  // namespace moeserve::kernels::ref
