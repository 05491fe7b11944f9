// Scalar twin of kernels/memory_bandwidth.h: the obviously correct definition.
#pragma once

#include <cstddef>

namespace moeserve::kernels::ref {

// Sum of x[0..n), accumulated in double, returned as float.
float ReadSum(const float* x, size_t n);

}  // namespace moeserve::kernels::ref
