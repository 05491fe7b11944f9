// Scalar twins of kernels/norms.h (double accumulation).
#pragma once

#include <cstdint>

namespace moeserve::kernels::ref {

void RmsNorm(const float* x, const float* w, float eps, float* y, int64_t n);
void RmsNormGated(const float* x, const float* z, const float* w, float eps, float* y, int64_t n);
void L2Normalize(float* x, float eps, float scale, int64_t n);

}  // namespace moeserve::kernels::ref
