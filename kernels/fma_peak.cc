// FMA-peak probe: FmaChains via Highway dynamic dispatch, MeasureFmaPeak on a pool.

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// fma_peak-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/fma_peak-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/timer.h"
#include "kernels/fma_peak.h"

namespace moeserve::kernels {

HWY_EXPORT(FmaChainsImpl);
HWY_EXPORT(FloatLanesImpl);

float FmaChains(float a, float b, size_t iterations) {
  return HWY_DYNAMIC_DISPATCH(FmaChainsImpl)(a, b, iterations);
}

size_t FloatLanes() { return HWY_DYNAMIC_DISPATCH(FloatLanesImpl)(); }

namespace {
// Keeps every result alive (see memory_bandwidth.cc).
volatile float g_sink = 0.0f;
// x -> x / 2 + 1 converges to 2 and stays finite and normal: no denormal or overflow slows it.
constexpr float kA = 0.5f, kB = 1.0f;
}  // namespace

FmaPeakResult MeasureFmaPeak(ThreadPool& pool, double seconds, int repeats) {
  CHECK_GE(repeats, 1);
  // Iterations for about `seconds` on one thread, from a short calibration run.
  size_t iterations = 1 << 14;
  for (;;) {
    const Stopwatch watch;
    g_sink = g_sink + FmaChains(kA, kB, iterations);
    const double elapsed = watch.ElapsedSeconds();
    if (elapsed >= seconds / 8 || iterations >= (size_t{1} << 34)) {
      iterations = static_cast<size_t>(static_cast<double>(iterations) * seconds /
                                       std::max(elapsed, 1e-9)) + 1;
      break;
    }
    iterations *= 4;
  }
  const size_t threads = pool.num_threads();
  std::vector<float> sums(threads * 16);  // a cache line per thread's result
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const Stopwatch watch;
    pool.ParallelFor(threads, [&](size_t t, size_t) { sums[t * 16] = FmaChains(kA, kB, iterations); });
    best = std::min(best, watch.ElapsedSeconds());
    for (size_t t = 0; t < threads; ++t) g_sink = g_sink + sums[t * 16];
  }
  const double flops = 2.0 * static_cast<double>(threads) * static_cast<double>(iterations) *
                       static_cast<double>(kFmaChains * FloatLanes());
  return {flops / std::max(best, 1e-9) * 1e-9, static_cast<int>(threads)};
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
