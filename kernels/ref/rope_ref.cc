#include "kernels/ref/rope_ref.h"

#include <cstdint>

#include "core/check.h"

namespace moeserve::kernels::ref {

void ApplyRope(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary_dim, const float* cos,
               const float* sin) {
  CHECK_GE(num_heads, 0);
  CHECK_GE(rotary_dim, 0);
  CHECK_LE(rotary_dim, head_dim);
  CHECK_EQ(rotary_dim % 2, 0);
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* lo = x + h * head_dim;
    float* hi = lo + half;
    for (int64_t j = 0; j < half; ++j) {
      // Products and difference in double (exact products), one rounding to float.
      const double a = lo[j];
      const double b = hi[j];
      lo[j] = static_cast<float>(a * cos[j] - b * sin[j]);
      hi[j] = static_cast<float>(b * cos[j] + a * sin[j]);
    }
  }
}

}  // namespace moeserve::kernels::ref
