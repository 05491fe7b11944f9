// The GDN causal conv1d + SiLU decode step via Highway dynamic dispatch; the per-target body is
// in causal_conv1d-inl.h.

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// causal_conv1d-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/causal_conv1d.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/causal_conv1d-inl.h"

#if HWY_ONCE

#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "kernels/causal_conv1d.h"

namespace moeserve::kernels {

HWY_EXPORT(CausalConv1dSiluStepImpl);
HWY_EXPORT(CausalConv1dSiluStepRangeImpl);

void CausalConv1dSiluStep(const float* x, float* state, const float* w, int64_t C, int64_t Kc,
                          float* out) {
  CHECK_GE(C, 0);
  CHECK_GE(Kc, 1);
  if (C == 0) return;
  const auto channels = static_cast<size_t>(C);
  const auto width = static_cast<size_t>(Kc);
  HWY_DYNAMIC_DISPATCH(CausalConv1dSiluStepImpl)(x, state, w, channels, width, out);
}

void CausalConv1dSiluStepRange(const float* x, float* state, const float* w, int64_t C,
                               int64_t Kc, int64_t begin, int64_t end, float* out) {
  CHECK_GE(Kc, 1);
  CHECK_GE(begin, 0);
  CHECK_LE(begin, end);
  CHECK_LE(end, C);
  if (begin == end) return;
  HWY_DYNAMIC_DISPATCH(CausalConv1dSiluStepRangeImpl)(x, state, w, static_cast<size_t>(C),
                                                      static_cast<size_t>(Kc),
                                                      static_cast<size_t>(begin),
                                                      static_cast<size_t>(end), out);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
