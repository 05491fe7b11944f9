// f32 FMA-peak probe: the compute ceiling beside the read-bandwidth roofline
// (kernels/memory_bandwidth.h). Prefill of many tokens is compute-bound, so its rate is judged
// against what the cores can do at all: independent chains of fused multiply-adds on full
// vectors, with no memory traffic, on every thread of a pool.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace moeserve::kernels {

// kFmaChains independent chains, each on every lane: x_c = c, then `iterations` times
// x_c = x_c * a + b (one MulAdd: fused where the target has FMA). Returns the sum over chains and
// lanes (SIMD, dynamic dispatch). Enough chains to keep two FMA pipes of 4-cycle latency busy;
// few enough to stay in AVX2's 16 registers with a and b.
inline constexpr size_t kFmaChains = 12;
float FmaChains(float a, float b, size_t iterations);

// f32 lanes of a vector on the dispatched target.
size_t FloatLanes();

struct FmaPeakResult {
  double gflops;  // best of the repeats: 2 flops per lane per MulAdd, all threads
  int threads;
};

// Runs FmaChains on every thread of `pool` for about `seconds` per repeat, `repeats` times, and
// reports the best rate.
FmaPeakResult MeasureFmaPeak(ThreadPool& pool, double seconds = 0.02, int repeats = 3);

}  // namespace moeserve::kernels
