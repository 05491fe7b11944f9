// Rotary position embedding, NeoX (rotate_half) style, on the first rotary_dim dims of a head.
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// cos/sin for one position: cos[j] = cos(pos * inv_freq[j]), j < rotary_dim / 2, with
// inv_freq[j] = theta^(-2j / rotary_dim), angles computed in f64 and rounded to f32.
void RopeCosSin(int64_t position, double theta, int64_t rotary_dim, float* cos, float* sin);

// For each of num_heads heads of head_dim floats at x + h * head_dim, and j < rotary_dim / 2:
//   x'[j]        = x[j] * cos[j] - x[j + half] * sin[j]
//   x'[j + half] = x[j + half] * cos[j] + x[j] * sin[j]
// dims [rotary_dim, head_dim) pass through.
void ApplyRope(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
               const float* cos, const float* sin);

}  // namespace moeserve::kernels
