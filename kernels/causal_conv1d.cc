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

void CausalConv1dSiluStep(const float* x, float* state, const float* w, int64_t C, int64_t Kc,
                          float* out) {
  CHECK_GE(C, 0);
  CHECK_GE(Kc, 1);
  if (C == 0) return;
  const auto channels = static_cast<size_t>(C);
  const auto width = static_cast<size_t>(Kc);
  HWY_DYNAMIC_DISPATCH(CausalConv1dSiluStepImpl)(x, state, w, channels, width, out);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
