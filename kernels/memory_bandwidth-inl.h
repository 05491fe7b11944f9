// Per-target body of the read-bandwidth kernel (kernels/memory_bandwidth.h), for inclusion from
// foreach_target translation units: kernels/memory_bandwidth.cc dispatches to it, and
// kernels/memory_bandwidth_test.cc calls it on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>

#include "hwy/highway.h"

#if defined(MOESERVE_KERNELS_MEMORY_BANDWIDTH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MEMORY_BANDWIDTH_INL_H_
#undef MOESERVE_KERNELS_MEMORY_BANDWIDTH_INL_H_
#else
#define MOESERVE_KERNELS_MEMORY_BANDWIDTH_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Sum of x[0..n) in f32. Four independent accumulators, each fed by its own load per iteration,
// keep four loads in flight and hide the latency of the adds, so the loop is limited by memory,
// not by the dependency chain of a single accumulator. x needs no alignment.
//
// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes its address, which forces an out-of-line definition per target.
inline float ReadSumImpl(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  auto sum2 = hn::Zero(d);
  auto sum3 = hn::Zero(d);
  size_t i = 0;
  if (n >= 4 * N) {
    for (; i <= n - 4 * N; i += 4 * N) {
      sum0 = hn::Add(sum0, hn::LoadU(d, x + i));
      sum1 = hn::Add(sum1, hn::LoadU(d, x + i + N));
      sum2 = hn::Add(sum2, hn::LoadU(d, x + i + 2 * N));
      sum3 = hn::Add(sum3, hn::LoadU(d, x + i + 3 * N));
    }
  }
  // At most three whole vectors remain.
  for (; i + N <= n; i += N) sum0 = hn::Add(sum0, hn::LoadU(d, x + i));
  // Fewer than N lanes remain: copy them into a zero vector. SafeCopyN never touches memory past
  // x[n) (masked load where that cannot fault, a scalar copy elsewhere).
  if (i < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    hn::SafeCopyN(n - i, d, x + i, tail);
    sum1 = hn::Add(sum1, hn::Load(d, tail));
  }
  const auto total = hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3));
  return hn::GetLane(hn::SumOfLanes(d, total));
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MEMORY_BANDWIDTH_INL_H_
