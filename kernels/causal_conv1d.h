// The causal depthwise conv1d + SiLU of a Gated DeltaNet layer, one token at a time.
#pragma once

#include <cstdint>

namespace moeserve::kernels {

// C channels, kernel width Kc.
// x:     [C] this token's conv inputs (the projected q|k|v, before the conv).
// state: [Kc-1][C], the previous Kc-1 inputs, oldest first (zeros at sequence start); updated:
//        shifted by one with x appended.
// w:     [Kc][C], w[j][c] = conv1d.weight[c, 0, j] (transposed at load); w[Kc-1] multiplies x.
// out:   [C] = silu(sum_{j<Kc-1} w[j][c] * state[j][c] + w[Kc-1][c] * x[c]). May alias x.
void CausalConv1dSiluStep(const float* x, float* state, const float* w, int64_t C, int64_t Kc,
                          float* out);

// Channels [begin, end) of the step above, 0 <= begin <= end <= C (pointers as above, for all
// C channels): those channels' outputs and state rows, bit for bit what the whole step gives
// them; the others untouched. A GDN layer's fused decode step convolves one key head's channels.
void CausalConv1dSiluStepRange(const float* x, float* state, const float* w, int64_t C,
                               int64_t Kc, int64_t begin, int64_t end, float* out);

}  // namespace moeserve::kernels
