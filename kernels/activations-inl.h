// Per-target bodies of the elementwise activations and the softmax of kernels/activations.h, for
// inclusion from foreach_target translation units: kernels/activations.cc dispatches to them,
// kernels/activations_test.cc calls them on every compiled target, and the other kernels of this
// family (norms, causal conv1d, rope) include this file for the vector helpers in `vecops`.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>
#include <cstring>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#if defined(MOESERVE_KERNELS_ACTIVATIONS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_ACTIVATIONS_INL_H_
#undef MOESERVE_KERNELS_ACTIVATIONS_INL_H_
#else
#define MOESERVE_KERNELS_ACTIVATIONS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Vector helpers shared by the norm, activation, rope and conv kernels. A namespace of their own
// keeps these generic names apart from other kernels' per-target helpers (all per-target code of
// the library shares moeserve::kernels::HWY_NAMESPACE, and two different inline functions with the
// same name and signature there would silently violate the ODR).
namespace vecops {

// Floats in the widest vector of any target: the size of the tail buffers below.
inline constexpr size_t kMaxLanesF32 = HWY_MAX_BYTES / sizeof(float);

// A vector holding p[0, count) in its first lanes and `fill` in the others, for the last partial
// vector of a row (count < Lanes(d)). Never reads memory at or past p[count): SafeCopyN uses a
// masked load where masked-off lanes cannot fault and a scalar copy elsewhere.
template <class D>
HWY_INLINE hn::Vec<D> LoadTail(D d, const float* HWY_RESTRICT p, size_t count, float fill) {
  HWY_ALIGN float buf[kMaxLanesF32];
  hn::Store(hn::Set(d, fill), d, buf);
  hn::SafeCopyN(count, d, p, buf);
  return hn::Load(d, buf);
}

// Writes the first `count` (< Lanes(d)) lanes of v to p[0, count) and nothing else.
template <class D>
HWY_INLINE void StoreTail(D d, hn::Vec<D> v, size_t count, float* HWY_RESTRICT p) {
  HWY_ALIGN float buf[kMaxLanesF32];
  hn::Store(v, d, buf);
  // The bound is for the compiler, which cannot see count < Lanes(d) at every call and would
  // otherwise warn about reading past buf.
  std::memcpy(p, buf, HWY_MIN(count, kMaxLanesF32) * sizeof(float));
}

// sigmoid(x) = 1 / (1 + exp(-x)), evaluated through e = exp(-|x|) in (0, 1] so that exp never
// overflows: sigmoid(|x|) = 1 / (1 + e) and sigmoid(-|x|) = e / (1 + e) (not 1 - sigmoid(|x|),
// which would cancel to 0 long before the true value underflows). In [0, 1] for every non-NaN x,
// +-inf included (1 and 0): hn::Exp returns 0 below its range instead of overflowing.
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V e = hn::Exp(d, hn::Neg(hn::Abs(x)));
  const V r = hn::Div(one, hn::Add(one, e));
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Mul(e, r), r);
}

// silu(x) = x * sigmoid(x).
template <class D, class V>
HWY_INLINE V Silu(D d, V x) {
  return hn::Mul(x, Sigmoid(d, x));
}

}  // namespace vecops

// The *Impl functions below are the per-target bodies of the functions of the same name without
// the suffix in kernels/activations.h; the arguments were checked there. Pointers that the
// interface lets alias are not HWY_RESTRICT. Each vector is loaded in full before the store to
// the same lanes, so elementwise in-place use is safe.
//
// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes the address, which forces an out-of-line definition per target.

// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
inline void SwiGluImpl(const float* gate, const float* up, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(d, gate + i);
    hn::StoreU(hn::Mul(vecops::Silu(d, g), hn::LoadU(d, up + i)), d, out + i);
  }
  if (i < n) {
    const auto g = vecops::LoadTail(d, gate + i, n - i, 0.0f);
    const auto u = vecops::LoadTail(d, up + i, n - i, 0.0f);
    vecops::StoreTail(d, hn::Mul(vecops::Silu(d, g), u), n - i, out + i);
  }
}

// x[i] = silu(x[i]).
inline void SiluImpl(float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(vecops::Silu(d, hn::LoadU(d, x + i)), d, x + i);
  if (i < n) {
    vecops::StoreTail(d, vecops::Silu(d, vecops::LoadTail(d, x + i, n - i, 0.0f)), n - i, x + i);
  }
}

// x[i] *= sigmoid(gate[i]).
inline void MulSigmoidImpl(float* x, const float* gate, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto s = vecops::Sigmoid(d, hn::LoadU(d, gate + i));
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), s), d, x + i);
  }
  if (i < n) {
    const auto s = vecops::Sigmoid(d, vecops::LoadTail(d, gate + i, n - i, 0.0f));
    vecops::StoreTail(d, hn::Mul(vecops::LoadTail(d, x + i, n - i, 0.0f), s), n - i, x + i);
  }
}

// y[i] += a * x[i] with hn::MulAdd (fused, one rounding, on targets with FMA). x may alias y.
inline void AxpyImpl(float a, const float* x, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto va = hn::Set(d, a);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
  if (i < n) {
    const auto vx = vecops::LoadTail(d, x + i, n - i, 0.0f);
    const auto vy = vecops::LoadTail(d, y + i, n - i, 0.0f);
    vecops::StoreTail(d, hn::MulAdd(va, vx, vy), n - i, y + i);
  }
}

// In place: x = exp(x - max) / sum(exp(x - max)) over x[0, n), n >= 1. Three passes: the max; the
// exponentials, written back and summed; the scaling. -inf entries (masked scores) give exactly 0
// as long as one entry is finite: then max is finite, x - max = -inf and hn::Exp returns 0 below
// its range. The sum is in f32 with four accumulators in a fixed order (deterministic for a given
// n and target); it is at least 1 (the max contributes exp(0)), so its inverse is finite.
inline void SoftmaxImpl(float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const float kNegInf = -std::numeric_limits<float>::infinity();

  // Max is exact in any order; two accumulators hide the latency of the compare.
  auto max0 = hn::Set(d, kNegInf);
  auto max1 = max0;
  size_t i = 0;
  if (n >= 2 * N) {
    for (; i <= n - 2 * N; i += 2 * N) {
      max0 = hn::Max(max0, hn::LoadU(d, x + i));
      max1 = hn::Max(max1, hn::LoadU(d, x + i + N));
    }
  }
  for (; i + N <= n; i += N) max0 = hn::Max(max0, hn::LoadU(d, x + i));
  // Padding lanes with -inf leaves the max unchanged.
  if (i < n) max1 = hn::Max(max1, vecops::LoadTail(d, x + i, n - i, kNegInf));
  const auto vmax = hn::MaxOfLanes(d, hn::Max(max0, max1));

  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  auto sum2 = hn::Zero(d);
  auto sum3 = hn::Zero(d);
  auto exp_store = [&](size_t at, decltype(sum0)& sum) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + at), vmax));
    hn::StoreU(e, d, x + at);
    sum = hn::Add(sum, e);
  };
  i = 0;
  if (n >= 4 * N) {
    for (; i <= n - 4 * N; i += 4 * N) {
      exp_store(i, sum0);
      exp_store(i + N, sum1);
      exp_store(i + 2 * N, sum2);
      exp_store(i + 3 * N, sum3);
    }
  }
  for (; i + N <= n; i += N) exp_store(i, sum0);
  if (i < n) {
    // -inf padding: exp(-inf - max) = 0 adds nothing to the sum.
    const auto e = hn::Exp(d, hn::Sub(vecops::LoadTail(d, x + i, n - i, kNegInf), vmax));
    vecops::StoreTail(d, e, n - i, x + i);
    sum1 = hn::Add(sum1, e);
  }
  const auto total = hn::SumOfLanes(d, hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3)));
  const auto inv = hn::Div(hn::Set(d, 1.0f), total);

  i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), inv), d, x + i);
  if (i < n) {
    vecops::StoreTail(d, hn::Mul(vecops::LoadTail(d, x + i, n - i, 0.0f), inv), n - i, x + i);
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_ACTIVATIONS_INL_H_
