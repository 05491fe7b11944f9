// Scalar twins of kernels/activations.h.
#pragma once

#include <cstdint>

namespace moeserve::kernels::ref {

void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
void Silu(float* x, int64_t n);
void MulSigmoid(float* x, const float* gate, int64_t n);
void Axpy(float a, const float* x, float* y, int64_t n);
void Softmax(float* x, int64_t n);
void TopK(const float* x, int64_t n, int64_t k, int32_t* indices, float* values);

}  // namespace moeserve::kernels::ref
