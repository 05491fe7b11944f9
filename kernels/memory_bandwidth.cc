// Read-bandwidth probe: ReadSum via Highway dynamic dispatch, MeasureReadBandwidth on a pool.

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// memory_bandwidth-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/memory_bandwidth.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/memory_bandwidth-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "kernels/memory_bandwidth.h"

namespace moeserve::kernels {

HWY_EXPORT(ReadSumImpl);

float ReadSum(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(ReadSumImpl)(x, n); }

namespace {

constexpr size_t kCacheLine = 64;
constexpr size_t kFloatsPerLine = kCacheLine / sizeof(float);

// Keeps every sum alive: the compiler must assume a volatile store is observed, so it cannot drop
// the loads that feed it.
volatile float g_sink = 0.0f;

}  // namespace

BandwidthResult MeasureReadBandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  CHECK_GE(repeats, 1);
  // Whole cache lines, at least one: each thread's slice then starts on a line boundary and no
  // line is shared between threads.
  const size_t lines = std::max<size_t>(1, (bytes + kCacheLine - 1) / kCacheLine);
  const size_t total_bytes = lines * kCacheLine;
  const size_t n = total_bytes / sizeof(float);

  // TensorStorage is 64-byte aligned and zero-filled, so every page is faulted in before timing
  // starts; writing small values touches each page once more and keeps the sums finite.
  TensorStorage storage(total_bytes);
  float* x = reinterpret_cast<float*>(storage.data());
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i & 7);

  const size_t num_tasks = pool.num_threads();
  // Task t reads lines [t * lines / num_tasks, (t + 1) * lines / num_tasks): contiguous slices
  // that differ by at most one line.
  auto slice_begin = [&](size_t t) { return t * lines / num_tasks * kFloatsPerLine; };
  // One slot per cache line so that the tasks' final stores do not contend.
  std::vector<float> sums(num_tasks * kFloatsPerLine);

  double best_seconds = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const Stopwatch watch;
    pool.ParallelFor(num_tasks, [&](size_t t, size_t) {
      const size_t begin = slice_begin(t);
      sums[t * kFloatsPerLine] = ReadSum(x + begin, slice_begin(t + 1) - begin);
    });
    best_seconds = std::min(best_seconds, watch.ElapsedSeconds());
    float total = 0.0f;
    for (size_t t = 0; t < num_tasks; ++t) total += sums[t * kFloatsPerLine];
    g_sink = g_sink + total;
  }

  BandwidthResult result;
  // The clock counts nanoseconds: a repeat can take no less than one.
  result.gb_per_s = static_cast<double>(total_bytes) / std::max(best_seconds, 1e-9) * 1e-9;
  result.bytes_read = total_bytes;
  result.repeats = repeats;
  return result;
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
