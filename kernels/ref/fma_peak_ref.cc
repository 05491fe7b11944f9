#include "kernels/ref/fma_peak_ref.h"

#include <cmath>

#include "kernels/fma_peak.h"

namespace moeserve::kernels::ref {

float FmaChains(float a, float b, size_t iterations, size_t lanes) {
  double total = 0.0;
  for (size_t c = 0; c < kFmaChains; ++c) {
    float x = static_cast<float>(c);
    for (size_t i = 0; i < iterations; ++i) x = std::fma(x, a, b);
    total += static_cast<double>(x) * static_cast<double>(lanes);
  }
  return static_cast<float>(total);
}

}  // namespace moeserve::kernels::ref
