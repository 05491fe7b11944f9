// Scalar twin of kernels/causal_conv1d.h.
#pragma once

#include <cstdint>

namespace moeserve::kernels::ref {

void CausalConv1dSiluStep(const float* x, float* state, const float* w, int64_t C, int64_t Kc,
                          float* out);

}  // namespace moeserve::kernels::ref
