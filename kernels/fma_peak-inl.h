// Per-target body of the FMA-peak probe (kernels/fma_peak.h), for inclusion from foreach_target
// translation units: kernels/fma_peak.cc dispatches to it, and kernels/fma_peak_test.cc calls it
// on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>

#include "hwy/highway.h"
#include "kernels/fma_peak.h"

#if defined(MOESERVE_KERNELS_FMA_PEAK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_FMA_PEAK_INL_H_
#undef MOESERVE_KERNELS_FMA_PEAK_INL_H_
#else
#define MOESERVE_KERNELS_FMA_PEAK_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Inline (not static): see memory_bandwidth-inl.h.
inline float FmaChainsImpl(float a, float b, size_t iterations) {
  const hn::ScalableTag<float> d;
  const auto va = hn::Set(d, a);
  const auto vb = hn::Set(d, b);
  hn::Vec<decltype(d)> x[kFmaChains];
  for (size_t c = 0; c < kFmaChains; ++c) x[c] = hn::Set(d, static_cast<float>(c));
  for (size_t i = 0; i < iterations; ++i) {
    for (size_t c = 0; c < kFmaChains; ++c) x[c] = hn::MulAdd(x[c], va, vb);
  }
  float total = 0.0f;
  for (size_t c = 0; c < kFmaChains; ++c) total += hn::GetLane(hn::SumOfLanes(d, x[c]));
  return total;
}

inline size_t FloatLanesImpl() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_FMA_PEAK_INL_H_
