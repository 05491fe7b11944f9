#include "kernels/ref/memory_bandwidth_ref.h"

namespace moeserve::kernels::ref {

float ReadSum(const float* x, size_t n) {
  // In order, in double: 29 more bits than f32 make it exact for integer-valued data and far more
  // accurate than any f32 summation order, so it is what the SIMD kernel is checked against.
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  return static_cast<float>(sum);
}

}  // namespace moeserve::kernels::ref
