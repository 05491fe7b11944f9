// Elementwise activations and softmax via Highway dynamic dispatch (bodies in activations-inl.h);
// TopK in plain C++.

// foreach_target.h re-includes this file once per SIMD target; the kernel bodies live in
// activations-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activations.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/activations-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/check.h"
#include "kernels/activations.h"

namespace moeserve::kernels {

HWY_EXPORT(SwiGluImpl);
HWY_EXPORT(SiluImpl);
HWY_EXPORT(MulSigmoidImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(SoftmaxImpl);

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  CHECK_GE(n, 0);
  HWY_DYNAMIC_DISPATCH(SwiGluImpl)(gate, up, out, static_cast<size_t>(n));
}

void Silu(float* x, int64_t n) {
  CHECK_GE(n, 0);
  HWY_DYNAMIC_DISPATCH(SiluImpl)(x, static_cast<size_t>(n));
}

void MulSigmoid(float* x, const float* gate, int64_t n) {
  CHECK_GE(n, 0);
  HWY_DYNAMIC_DISPATCH(MulSigmoidImpl)(x, gate, static_cast<size_t>(n));
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  CHECK_GE(n, 0);
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(a, x, y, static_cast<size_t>(n));
}

void Softmax(float* x, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, static_cast<size_t>(n));
}

namespace {

// The ranking of TopK: a before b if a is larger. NaN ranks after every number (-inf included)
// so that one NaN cannot break the ordering the selection relies on; NaNs tie among themselves.
inline bool RanksBefore(float a, float b) { return a > b || (std::isnan(b) && !std::isnan(a)); }

}  // namespace

void TopK(const float* x, int64_t n, int64_t k, int32_t* indices, float* values) {
  CHECK_GE(k, 0);
  CHECK_LE(k, n);
  CHECK_LE(n, int64_t{std::numeric_limits<int32_t>::max()}) << "indices are int32";
  if (k == 0) return;
  CHECK(x != nullptr && indices != nullptr && values != nullptr);

  // values[0, count) / indices[0, count) hold the best `count` entries seen so far, in output
  // order. Scanning i upwards and inserting a new entry after all entries that rank the same
  // keeps equal values in index order. An entry that does not beat the current k-th is rejected
  // with one compare, so for the router (n <= 512, k ~ 10) and for top-k sampling over a
  // vocabulary the cost is one pass over x plus a few short insertions; the worst case (input
  // ascending) is O(n * k).
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (count == k && !RanksBefore(v, values[k - 1])) continue;
    // The first slot that v ranks before.
    const int64_t pos = std::upper_bound(values, values + count, v, RanksBefore) - values;
    // When full, the last entry falls off.
    const int64_t end = count < k ? count : k - 1;
    std::copy_backward(values + pos, values + end, values + end + 1);
    std::copy_backward(indices + pos, indices + end, indices + end + 1);
    values[pos] = v;
    indices[pos] = static_cast<int32_t>(i);
    if (count < k) ++count;
  }
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
