// Normalizations via Highway dynamic dispatch; the per-target bodies are in norms-inl.h.

// foreach_target.h re-includes this file once per SIMD target; the kernel bodies live in
// norms-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/norms.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/norms-inl.h"

#if HWY_ONCE

#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "kernels/norms.h"

namespace moeserve::kernels {

HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(RmsNormGatedImpl);
HWY_EXPORT(L2NormalizeImpl);

// n == 0 is a no-op (the mean of nothing is undefined, and there is nothing to write).

void RmsNorm(const float* x, const float* w, float eps, float* y, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, w, eps, y, static_cast<size_t>(n));
}

void RmsNormGated(const float* x, const float* z, const float* w, float eps, float* y, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(RmsNormGatedImpl)(x, z, w, eps, y, static_cast<size_t>(n));
}

void L2Normalize(float* x, float eps, float scale, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(L2NormalizeImpl)(x, eps, scale, static_cast<size_t>(n));
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
