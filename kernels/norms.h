// Normalizations over one vector of n floats (call once per row / head). In-place use (y == x)
// is allowed.
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// y = x * rsqrt(mean(x^2) + eps) * w. For the (1 + w) RMSNorm of the hybrid models the caller
// passes w with the 1 already added (done once at load).
void RmsNorm(const float* x, const float* w, float eps, float* y, int64_t n);

// Gated RMSNorm of the GDN output (docs/spec/model.md §3.b, FLA's fused form in f32):
// y = x * rsqrt(mean(x^2) + eps) * w * silu(z).
void RmsNormGated(const float* x, const float* z, const float* w, float eps, float* y, int64_t n);

// x = x * rsqrt(sum(x^2) + eps) * scale (the GDN l2norm of q and k; eps inside the sqrt of the
// sum, docs/spec/model.md §4.2; scale = 1/sqrt(dk) for q, 1 for k).
void L2Normalize(float* x, float eps, float scale, int64_t n);

}  // namespace moeserve::kernels
