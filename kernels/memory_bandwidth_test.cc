// ReadSum on every compiled SIMD target against the scalar twin, and a smoke test of
// MeasureReadBandwidth.

#include "kernels/memory_bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ref/memory_bandwidth_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's ReadSumImpl from memory_bandwidth-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/memory_bandwidth_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/memory_bandwidth-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

// Offsets (in floats) of the start pointer from a 64-byte boundary: aligned, and every
// misalignment a 16-float (AVX-512) vector can see.
constexpr size_t kMaxOffset = 16;

// Integers in [-8, 8]. Any partial sum of up to 2^20 of them is an integer of magnitude below
// 2^24, so f32 sums them exactly in every order and the SIMD result must equal the reference.
void FillSmallIntegers(float* x, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(dist(rng));
}

// Sum of |x|: the scale of the rounding error of any summation order.
double AbsSum(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(x[i]));
  return s;
}

HWY_NOINLINE void TestReadSumSmallSizesAllOffsets() {
  constexpr size_t kMaxN = 300;
  auto buf = hwy::AllocateAligned<float>(kMaxN + kMaxOffset);
  FillSmallIntegers(buf.get(), kMaxN + kMaxOffset, 1);
  for (size_t offset = 0; offset < kMaxOffset; ++offset) {
    const float* x = buf.get() + offset;
    for (size_t n = 0; n <= kMaxN; ++n) {
      ASSERT_EQ(ReadSumImpl(x, n), ref::ReadSum(x, n))
          << hwy::TargetName(HWY_TARGET) << " n=" << n << " offset=" << offset;
    }
  }
}

HWY_NOINLINE void TestReadSumLargeOddSizes() {
  for (size_t n : {4099, 65537, 99991, 1000003}) {
    auto buf = hwy::AllocateAligned<float>(n + kMaxOffset);
    FillSmallIntegers(buf.get(), n + kMaxOffset, static_cast<uint32_t>(n));
    for (size_t offset : {0, 1, 3, 7, 15}) {
      const float* x = buf.get() + offset;
      EXPECT_EQ(ReadSumImpl(x, n), ref::ReadSum(x, n))
          << hwy::TargetName(HWY_TARGET) << " n=" << n << " offset=" << offset;
    }
  }
}

HWY_NOINLINE void TestReadSumRealValues() {
  // Non-integers: the orders differ, so the results agree to rounding, relative to sum |x|.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t n : {1, 2, 5, 17, 31, 64, 127, 300, 1001, 65537, 1000003}) {
    std::vector<float> v(n + 1);
    for (float& f : v) f = dist(rng);
    const float* x = v.data() + 1;  // deliberately not vector-aligned
    const double want = ref::ReadSum(x, n);
    const double got = ReadSumImpl(x, n);
    EXPECT_NEAR(got, want, 1e-5 * AbsSum(x, n)) << hwy::TargetName(HWY_TARGET) << " n=" << n;
  }
}

HWY_NOINLINE void TestReadSumStaysInBounds() {
  // `exact` is as long as the data, so a load past x[n) falls outside the allocation, which
  // AddressSanitizer reports in the asan build. `padded` has huge values after x[n), so an
  // over-read also changes the sum, which the release build sees.
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<float> exact(n);
    FillSmallIntegers(exact.data(), n, static_cast<uint32_t>(n) + 100);
    EXPECT_EQ(ReadSumImpl(exact.data(), n), ref::ReadSum(exact.data(), n))
        << hwy::TargetName(HWY_TARGET) << " n=" << n;

    std::vector<float> padded(n + kMaxOffset, 1e30f);
    FillSmallIntegers(padded.data(), n, static_cast<uint32_t>(n) + 200);
    EXPECT_EQ(ReadSumImpl(padded.data(), n), ref::ReadSum(padded.data(), n))
        << hwy::TargetName(HWY_TARGET) << " n=" << n;
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(ReadSumTargetTest);
HWY_EXPORT_AND_TEST_P(ReadSumTargetTest, TestReadSumSmallSizesAllOffsets);
HWY_EXPORT_AND_TEST_P(ReadSumTargetTest, TestReadSumLargeOddSizes);
HWY_EXPORT_AND_TEST_P(ReadSumTargetTest, TestReadSumRealValues);
HWY_EXPORT_AND_TEST_P(ReadSumTargetTest, TestReadSumStaysInBounds);

TEST(ReadSumTest, DispatchedMatchesReference) {
  // The public entry point, on whatever target the machine picks.
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 5) - 2.0f;
  for (size_t n : {0, 1, 7, 8, 9, 33, 999, 1000}) {
    EXPECT_EQ(ReadSum(x.data(), n), ref::ReadSum(x.data(), n)) << n;
  }
}

TEST(RefReadSumTest, SmallCases) {
  const float x[] = {1.5f, -2.0f, 0.25f, 1e8f, -1e8f};
  EXPECT_EQ(ref::ReadSum(x, 0), 0.0f);
  EXPECT_EQ(ref::ReadSum(x, 1), 1.5f);
  EXPECT_EQ(ref::ReadSum(x, 3), -0.25f);
  // Double accumulation keeps the small terms that an f32 running sum would lose to 1e8.
  EXPECT_EQ(ref::ReadSum(x, 5), -0.25f);
}

TEST(MeasureReadBandwidthTest, SmallBufferGivesPositiveFiniteRate) {
  for (size_t threads : {1, 2}) {
    ThreadPool pool(threads);
    const size_t bytes = size_t{8} << 20;
    const BandwidthResult r = MeasureReadBandwidth(pool, bytes, 2);
    EXPECT_GT(r.gb_per_s, 0.0) << threads;
    EXPECT_TRUE(std::isfinite(r.gb_per_s)) << threads;
    EXPECT_EQ(r.bytes_read, bytes);
    EXPECT_EQ(r.repeats, 2);
  }
}

TEST(MeasureReadBandwidthTest, RoundsToWholeCacheLines) {
  ThreadPool pool(2);
  EXPECT_EQ(MeasureReadBandwidth(pool, 100, 1).bytes_read, 128u);
  EXPECT_EQ(MeasureReadBandwidth(pool, 64, 1).bytes_read, 64u);
  // One line between two threads: one of them gets an empty slice.
  EXPECT_EQ(MeasureReadBandwidth(pool, 1, 1).bytes_read, 64u);
  EXPECT_EQ(MeasureReadBandwidth(pool, 0, 1).bytes_read, 64u);
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
