// The gated delta rule (kernels/gated_delta_rule.h) through Highway dynamic dispatch.

// foreach_target.h re-includes this file once per SIMD target; the kernel bodies live in
// gated_delta_rule-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gated_delta_rule.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gated_delta_rule-inl.h"

#if HWY_ONCE

#include <cstdint>

#include "kernels/gated_delta_rule.h"

namespace moeserve::kernels {

HWY_EXPORT(GatedDeltaRuleStepImpl);
HWY_EXPORT(GatedDeltaRuleChunkImpl);

void GatedDeltaRuleStep(float* S, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* out) {
  HWY_DYNAMIC_DISPATCH(GatedDeltaRuleStepImpl)(S, q, k, v, g, beta, dk, dv, out);
}

void GatedDeltaRuleChunk(float* S, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t T, int64_t dk, int64_t dv, float* out, int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(GatedDeltaRuleChunkImpl)
  (S, q, k, qk_stride, v, v_stride, g, beta, T, dk, dv, out, out_stride);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
