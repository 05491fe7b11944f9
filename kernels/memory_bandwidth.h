// Read-bandwidth probe: the denominator of every roofline number moeserve prints.
//
// Decoding a token reads every active weight once, so tokens/s can be no higher than
// (read bandwidth) / (weight bytes per token). ReadSum streams a buffer through SIMD loads the
// way a GEMV streams weights; MeasureReadBandwidth times it over a buffer far larger than the
// caches, on every thread of a pool.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace moeserve::kernels {

// Sum of x[0..n) in f32 (SIMD, dynamic dispatch). The summation order differs from the scalar
// twin ref::ReadSum, so results agree to rounding, not bit for bit.
float ReadSum(const float* x, size_t n);

struct BandwidthResult {
  double gb_per_s;     // best of the repeats, 1e9 bytes per second
  size_t bytes_read;   // per repeat
  int repeats;
};

// Reads a buffer of `bytes` (rounded to whole cache lines) `repeats` times, split over all
// threads of `pool`, and reports the best rate. The buffer is allocated and touched first so that
// page faults are not timed.
BandwidthResult MeasureReadBandwidth(ThreadPool& pool, size_t bytes = size_t{512} << 20,
                                     int repeats = 5);

}  // namespace moeserve::kernels
