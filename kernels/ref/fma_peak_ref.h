// Scalar twin of kernels/fma_peak.h: the obviously correct definition.
#pragma once

#include <cstddef>

namespace moeserve::kernels::ref {

// FmaChains on `lanes` lanes: kFmaChains chains x_c = c, `iterations` times x_c = fma(x_c, a, b)
// (one rounding each), summed over chains and lanes in double, returned as float.
float FmaChains(float a, float b, size_t iterations, size_t lanes);

}  // namespace moeserve::kernels::ref
