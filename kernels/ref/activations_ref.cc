#include "kernels/ref/activations_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace moeserve::kernels::ref {

namespace {

// sigmoid in double without overflow: exp of -|x| only.
double Sigmoid(double x) {
  const double e = std::exp(-std::fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

double Silu(double x) { return x * Sigmoid(x); }

// Same ranking as kernels::TopK: larger first, NaN after every number.
bool RanksBefore(float a, float b) { return a > b || (std::isnan(b) && !std::isnan(a)); }

}  // namespace

// Elementwise in double, rounded once to float; each element is read before it is written, so
// the aliasing the interface allows is safe here too.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  CHECK_GE(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(Silu(gate[i]) * static_cast<double>(up[i]));
  }
}

void Silu(float* x, int64_t n) {
  CHECK_GE(n, 0);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(Silu(x[i]));
}

void MulSigmoid(float* x, const float* gate, int64_t n) {
  CHECK_GE(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(static_cast<double>(x[i]) * Sigmoid(gate[i]));
  }
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  CHECK_GE(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>(static_cast<double>(a) * x[i] + static_cast<double>(y[i]));
  }
}

void Softmax(float* x, int64_t n) {
  CHECK_GE(n, 0);
  if (n == 0) return;
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, static_cast<double>(x[i]));
  // The exponentials are kept in double until the division, so the only rounding to float is
  // the last one.
  std::vector<double> e(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = std::exp(static_cast<double>(x[i]) - max);
    sum += e[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[i] / sum);
}

void TopK(const float* x, int64_t n, int64_t k, int32_t* indices, float* values) {
  CHECK_GE(k, 0);
  CHECK_LE(k, n);
  CHECK_LE(n, int64_t{std::numeric_limits<int32_t>::max()});
  // A full stable sort of the indices by rank: stability keeps equal values in index order.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [x](int32_t a, int32_t b) { return RanksBefore(x[a], x[b]); });
  for (int64_t i = 0; i < k; ++i) {
    indices[i] = order[i];
    values[i] = x[order[i]];
  }
}

}  // namespace moeserve::kernels::ref
