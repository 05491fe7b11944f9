// Per-target body of CausalConv1dSiluStep (kernels/causal_conv1d.h), for inclusion from
// foreach_target translation units: kernels/causal_conv1d.cc dispatches to it,
// kernels/causal_conv1d_test.cc calls it on every compiled target.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>

#include "hwy/highway.h"
#include "kernels/activations-inl.h"

#if defined(MOESERVE_KERNELS_CAUSAL_CONV1D_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_CAUSAL_CONV1D_INL_H_
#undef MOESERVE_KERNELS_CAUSAL_CONV1D_INL_H_
#else
#define MOESERVE_KERNELS_CAUSAL_CONV1D_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace vecops {

// One vector of channels [c, c + lanes) of the conv step; lanes = Lanes(d), or fewer (count) for
// the last partial vector, whose loads are padded and whose stores are cut to count.
// u = sum_{j < Kc-1} w[j] * state[j] + w[Kc-1] * x, accumulated with multiply-adds from the
// oldest input to the current one (the order of the definition); then state rows shift down by
// one (row j takes row j + 1, the last row takes x) and out = silu(u). Every load of a row
// precedes the store to it, and x is loaded before out is stored, so out may alias x.
template <class D>
HWY_INLINE void CausalConvSiluLanes(D d, const float* x, float* HWY_RESTRICT state,
                                    const float* HWY_RESTRICT w, size_t C, size_t Kc, size_t c,
                                    size_t count, float* out) {
  const bool full = count == hn::Lanes(d);
  auto load = [&](const float* p) { return full ? hn::LoadU(d, p) : LoadTail(d, p, count, 0.0f); };
  auto store = [&](hn::Vec<D> v, float* p) {
    if (full) {
      hn::StoreU(v, d, p);
    } else {
      StoreTail(d, v, count, p);
    }
  };
  const auto vx = load(x + c);
  auto acc = hn::Zero(d);
  for (size_t j = 0; j + 1 < Kc; ++j) {
    const auto s = load(state + j * C + c);
    acc = hn::MulAdd(load(w + j * C + c), s, acc);
    // Row j + 1 was not yet overwritten and row j - 1 was already read: s moves down one row.
    if (j > 0) store(s, state + (j - 1) * C + c);
  }
  acc = hn::MulAdd(load(w + (Kc - 1) * C + c), vx, acc);
  if (Kc > 1) store(vx, state + (Kc - 2) * C + c);
  store(Silu(d, acc), out + c);
}

}  // namespace vecops

// The per-target body of CausalConv1dSiluStep; arguments checked there (Kc >= 1). One pass over
// the channels, a vector at a time; the few rows (Kc <= 4 in the models) are walked per vector so
// that every element of x, w and state is touched once. Inline (not static) so that the copy in
// each including translation unit is the same entity.
// Channels [begin, end) only (of C: the row stride of state and w): each channel's arithmetic is
// its lane's, so the pieces of a split give the bits of the whole.
inline void CausalConv1dSiluStepRangeImpl(const float* x, float* HWY_RESTRICT state,
                                          const float* HWY_RESTRICT w, size_t C, size_t Kc,
                                          size_t begin, size_t end, float* out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t c = begin;
  for (; c + N <= end; c += N) vecops::CausalConvSiluLanes(d, x, state, w, C, Kc, c, N, out);
  if (c < end) vecops::CausalConvSiluLanes(d, x, state, w, C, Kc, c, end - c, out);
}

inline void CausalConv1dSiluStepImpl(const float* x, float* HWY_RESTRICT state,
                                     const float* HWY_RESTRICT w, size_t C, size_t Kc, float* out) {
  CausalConv1dSiluStepRangeImpl(x, state, w, C, Kc, 0, C, out);
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_CAUSAL_CONV1D_INL_H_
