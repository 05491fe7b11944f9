// Per-target bodies of the normalizations of kernels/norms.h, for inclusion from foreach_target
// translation units: kernels/norms.cc dispatches to them, kernels/norms_test.cc calls them on
// every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cmath>
#include <cstddef>

#include "hwy/highway.h"
#include "kernels/activations-inl.h"

#if defined(MOESERVE_KERNELS_NORMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_NORMS_INL_H_
#undef MOESERVE_KERNELS_NORMS_INL_H_
#else
#define MOESERVE_KERNELS_NORMS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace vecops {

// sum_i x[i]^2 over x[0, n) in f32. Four accumulators, each fed by its own vector, hide the
// latency of the fused multiply-adds; the order is fixed for a given n and target, so the result
// is deterministic. The partial last vector is zero-padded, which adds nothing.
template <class D>
HWY_INLINE float SumOfSquares(D d, const float* HWY_RESTRICT x, size_t n) {
  const size_t N = hn::Lanes(d);
  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  auto sum2 = hn::Zero(d);
  auto sum3 = hn::Zero(d);
  size_t i = 0;
  if (n >= 4 * N) {
    for (; i <= n - 4 * N; i += 4 * N) {
      const auto v0 = hn::LoadU(d, x + i);
      const auto v1 = hn::LoadU(d, x + i + N);
      const auto v2 = hn::LoadU(d, x + i + 2 * N);
      const auto v3 = hn::LoadU(d, x + i + 3 * N);
      sum0 = hn::MulAdd(v0, v0, sum0);
      sum1 = hn::MulAdd(v1, v1, sum1);
      sum2 = hn::MulAdd(v2, v2, sum2);
      sum3 = hn::MulAdd(v3, v3, sum3);
    }
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    sum0 = hn::MulAdd(v, v, sum0);
  }
  if (i < n) {
    const auto v = LoadTail(d, x + i, n - i, 0.0f);
    sum1 = hn::MulAdd(v, v, sum1);
  }
  const auto total = hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3));
  return hn::GetLane(hn::SumOfLanes(d, total));
}

}  // namespace vecops

// The *Impl functions are the per-target bodies of the functions of the same name without the
// suffix in kernels/norms.h; n >= 1 was checked there. The scale factor is a scalar computed once
// in double from the f32 sum (cheaper than per-lane and one rounding fewer). y may alias x: the
// second pass reads each vector before it writes it. Inline (not static) so that the copy in each
// including translation unit is the same entity.

// y = x * rsqrt(mean(x^2) + eps) * w, as (x * r) * w like the f32 torch code.
inline void RmsNormImpl(const float* x, const float* HWY_RESTRICT w, float eps, float* y,
                        size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const double mean_sq = static_cast<double>(vecops::SumOfSquares(d, x, n)) / n;
  const auto r = hn::Set(d, static_cast<float>(1.0 / std::sqrt(mean_sq + eps)));
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), r), hn::LoadU(d, w + i)), d, y + i);
  }
  if (i < n) {
    const auto vx = vecops::LoadTail(d, x + i, n - i, 0.0f);
    const auto vw = vecops::LoadTail(d, w + i, n - i, 0.0f);
    vecops::StoreTail(d, hn::Mul(hn::Mul(vx, r), vw), n - i, y + i);
  }
}

// y = x * rsqrt(mean(x^2) + eps) * w * silu(z), in FLA's fused order ((x * r) * w) * silu(z).
inline void RmsNormGatedImpl(const float* x, const float* z, const float* HWY_RESTRICT w, float eps,
                             float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const double mean_sq = static_cast<double>(vecops::SumOfSquares(d, x, n)) / n;
  const auto r = hn::Set(d, static_cast<float>(1.0 / std::sqrt(mean_sq + eps)));
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto normed = hn::Mul(hn::Mul(hn::LoadU(d, x + i), r), hn::LoadU(d, w + i));
    hn::StoreU(hn::Mul(normed, vecops::Silu(d, hn::LoadU(d, z + i))), d, y + i);
  }
  if (i < n) {
    const auto vx = vecops::LoadTail(d, x + i, n - i, 0.0f);
    const auto vw = vecops::LoadTail(d, w + i, n - i, 0.0f);
    const auto vz = vecops::LoadTail(d, z + i, n - i, 0.0f);
    vecops::StoreTail(d, hn::Mul(hn::Mul(hn::Mul(vx, r), vw), vecops::Silu(d, vz)), n - i, y + i);
  }
}

// x *= scale / sqrt(sum(x^2) + eps): one multiply per element by the combined factor.
inline void L2NormalizeImpl(float* HWY_RESTRICT x, float eps, float scale, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const double sum_sq = vecops::SumOfSquares(d, x, n);
  const auto f = hn::Set(d, static_cast<float>(scale / std::sqrt(sum_sq + eps)));
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), f), d, x + i);
  if (i < n) {
    vecops::StoreTail(d, hn::Mul(vecops::LoadTail(d, x + i, n - i, 0.0f), f), n - i, x + i);
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_NORMS_INL_H_
