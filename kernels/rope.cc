// RoPE: cos/sin tables in plain C++ (double angles), the rotation via Highway dynamic dispatch
// (body in rope-inl.h).

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// rope-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/rope-inl.h"

#if HWY_ONCE

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "kernels/rope.h"

namespace moeserve::kernels {

HWY_EXPORT(ApplyRopeImpl);

void RopeCosSin(int64_t position, double theta, int64_t rotary_dim, float* cos, float* sin) {
  CHECK_GT(theta, 0.0);
  CHECK_GE(rotary_dim, 0);
  CHECK_EQ(rotary_dim % 2, 0) << "rotary_dim must be even";
  // All in double, rounded to float at the end: at position 1e5 the angle of the fastest pair
  // (inv_freq 1) is 1e5 rad, where f32 angles would already be off by ~4e-3 rad; double keeps
  // the error near 1e-11. The exponent -2j / rotary_dim is formed in double too.
  const double pos = static_cast<double>(position);
  for (int64_t j = 0; j < rotary_dim / 2; ++j) {
    const double inv_freq =
        std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(rotary_dim));
    const double angle = pos * inv_freq;
    cos[j] = static_cast<float>(std::cos(angle));
    sin[j] = static_cast<float>(std::sin(angle));
  }
}

void ApplyRope(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary_dim, const float* cos,
               const float* sin) {
  CHECK_GE(num_heads, 0);
  CHECK_GE(rotary_dim, 0);
  CHECK_LE(rotary_dim, head_dim);
  CHECK_EQ(rotary_dim % 2, 0) << "rotary_dim must be even";
  if (num_heads == 0 || rotary_dim == 0) return;
  const auto heads = static_cast<size_t>(num_heads);
  const auto dim = static_cast<size_t>(head_dim);
  const auto rotary = static_cast<size_t>(rotary_dim);
  HWY_DYNAMIC_DISPATCH(ApplyRopeImpl)(x, heads, dim, rotary, cos, sin);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
