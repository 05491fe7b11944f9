// Monotonic time for measurements (never wall-clock time, which can jump).
#pragma once

#include <chrono>
#include <cstdint>

namespace moeserve {

inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Measures elapsed time since construction or the last Reset().
class Stopwatch {
 public:
  Stopwatch() : start_(MonotonicNanos()) {}
  void Reset() { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const { return MonotonicNanos() - start_; }
  double ElapsedSeconds() const { return static_cast<double>(ElapsedNanos()) * 1e-9; }
  double ElapsedMillis() const { return static_cast<double>(ElapsedNanos()) * 1e-6; }

 private:
  int64_t start_;
};

}  // namespace moeserve
