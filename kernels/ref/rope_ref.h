// Scalar twin of kernels/rope.h.
#pragma once

#include <cstdint>

namespace moeserve::kernels::ref {

void ApplyRope(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
               const float* cos, const float* sin);

}  // namespace moeserve::kernels::ref
