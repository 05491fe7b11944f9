#include "kernels/ref/causal_conv1d_ref.h"

#include <cmath>
#include <cstdint>

#include "core/check.h"

namespace moeserve::kernels::ref {

void CausalConv1dSiluStep(const float* x, float* state, const float* w, int64_t C, int64_t Kc,
                          float* out) {
  CHECK_GE(C, 0);
  CHECK_GE(Kc, 1);
  for (int64_t c = 0; c < C; ++c) {
    // The dot product in double, oldest input first.
    const float xc = x[c];
    double u = 0.0;
    for (int64_t j = 0; j + 1 < Kc; ++j) u += static_cast<double>(w[j * C + c]) * state[j * C + c];
    u += static_cast<double>(w[(Kc - 1) * C + c]) * xc;
    // Shift the window: row j takes row j + 1, the newest row takes x.
    for (int64_t j = 0; j + 2 < Kc; ++j) state[j * C + c] = state[(j + 1) * C + c];
    if (Kc > 1) state[(Kc - 2) * C + c] = xc;
    // silu through exp(-|u|), which cannot overflow. x[c] was read above, so out may alias x.
    const double e = std::exp(-std::fabs(u));
    out[c] = static_cast<float>(u * (u >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e)));
  }
}

}  // namespace moeserve::kernels::ref
