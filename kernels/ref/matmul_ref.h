// Scalar twin of kernels/matmul.h: the obviously correct definition (double accumulation).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moeserve::kernels::ref {

void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride);

}  // namespace moeserve::kernels::ref
