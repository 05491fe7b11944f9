// Elementwise activations and small reductions over vectors of n floats.
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// out = silu(gate) * up, silu(x) = x * sigmoid(x). out may alias gate or up.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
// x = silu(x).
void Silu(float* x, int64_t n);
// x = x * sigmoid(gate) (the attention output gate).
void MulSigmoid(float* x, const float* gate, int64_t n);
// y += a * x.
void Axpy(float a, const float* x, float* y, int64_t n);
// In place: x = exp(x - max) / sum(exp(x - max)).
void Softmax(float* x, int64_t n);

// The k largest values of x[0, n) and their indices, sorted by value descending; among equal
// values the lower index comes first. k <= n.
void TopK(const float* x, int64_t n, int64_t k, int32_t* indices, float* values);

}  // namespace moeserve::kernels
