// Per-target body of ApplyRope (kernels/rope.h), for inclusion from foreach_target translation
// units: kernels/rope.cc dispatches to it, kernels/rope_test.cc calls it on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>

#include "hwy/highway.h"
#include "kernels/activations-inl.h"

#if defined(MOESERVE_KERNELS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_ROPE_INL_H_
#undef MOESERVE_KERNELS_ROPE_INL_H_
#else
#define MOESERVE_KERNELS_ROPE_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// NeoX rotation of the first rotary_dim (even) dims of each of num_heads heads of head_dim floats,
// in place; cos and sin: [rotary_dim / 2]. The two halves [0, half) and [half, rotary_dim) are
// loaded a vector at a time and both are read before either is written. Dims past rotary_dim are
// never touched. Checked arguments: rotary_dim even, 0 <= rotary_dim <= head_dim.
//
// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes the address, which forces an out-of-line definition per target.
inline void ApplyRopeImpl(float* HWY_RESTRICT x, size_t num_heads, size_t head_dim,
                          size_t rotary_dim, const float* HWY_RESTRICT cos,
                          const float* HWY_RESTRICT sin) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t half = rotary_dim / 2;
  for (size_t h = 0; h < num_heads; ++h) {
    float* lo = x + h * head_dim;
    float* hi = lo + half;
    size_t j = 0;
    //   lo' = lo * cos - hi * sin;  hi' = hi * cos + lo * sin.
    for (; j + N <= half; j += N) {
      const auto c = hn::LoadU(d, cos + j);
      const auto s = hn::LoadU(d, sin + j);
      const auto a = hn::LoadU(d, lo + j);
      const auto b = hn::LoadU(d, hi + j);
      hn::StoreU(hn::NegMulAdd(b, s, hn::Mul(a, c)), d, lo + j);
      hn::StoreU(hn::MulAdd(a, s, hn::Mul(b, c)), d, hi + j);
    }
    if (j < half) {
      const size_t count = half - j;
      const auto c = vecops::LoadTail(d, cos + j, count, 0.0f);
      const auto s = vecops::LoadTail(d, sin + j, count, 0.0f);
      const auto a = vecops::LoadTail(d, lo + j, count, 0.0f);
      const auto b = vecops::LoadTail(d, hi + j, count, 0.0f);
      vecops::StoreTail(d, hn::NegMulAdd(b, s, hn::Mul(a, c)), count, lo + j);
      vecops::StoreTail(d, hn::MulAdd(a, s, hn::Mul(b, c)), count, hi + j);
    }
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_ROPE_INL_H_
