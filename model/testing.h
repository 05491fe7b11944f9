// Helpers of the model tests: how far a row of logits is from a reference, and its argmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moeserve::model::testing {

// max_i |a_i - b_i| / max_i |b_i| over one row (the goldens' definition).
inline double RowRelError(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// The first index of the maximum.
inline int32_t Argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

}  // namespace moeserve::model::testing
