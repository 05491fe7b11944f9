#include "kernels/ref/norms_ref.h"

#include <cmath>
#include <cstdint>

#include "core/check.h"

namespace moeserve::kernels::ref {

namespace {

// sum_i x[i]^2 in double, in order.
double SumOfSquares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

double Silu(double x) {
  // sigmoid through exp(-|x|), which cannot overflow.
  const double e = std::exp(-std::fabs(x));
  return x * (x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e));
}

}  // namespace

// All in double, each output rounded to float once. Each x[i] is read before y[i] is written, so
// y == x works.

void RmsNorm(const float* x, const float* w, float eps, float* y, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  const double r = 1.0 / std::sqrt(SumOfSquares(x, n) / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * r * w[i]);
}

void RmsNormGated(const float* x, const float* z, const float* w, float eps, float* y, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  const double r = 1.0 / std::sqrt(SumOfSquares(x, n) / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * r * w[i] * Silu(z[i]));
}

void L2Normalize(float* x, float eps, float scale, int64_t n) {
  CHECK_GE(n, 0);
  const double f = 1.0 / std::sqrt(SumOfSquares(x, n) + eps) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * f);
}

}  // namespace moeserve::kernels::ref
