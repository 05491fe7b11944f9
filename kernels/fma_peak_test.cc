// FmaChains on every compiled SIMD target against the scalar twin, and MeasureFmaPeak's rate
// against the flops it must have done.

#include "kernels/fma_peak.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/ref/fma_peak_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests call that
// target's FmaChainsImpl from fma_peak-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_peak_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/fma_peak-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

HWY_NOINLINE void TestFmaChainsMatchesReference() {
  const size_t lanes = FloatLanesImpl();
  // Exact where every step is: halving and adding 1 or 0.25 to small dyadic values rounds
  // nowhere for the first steps, so fused or not, the results must be equal.
  for (size_t iterations : {0, 1, 2, 5, 10}) {
    for (auto [a, b] : {std::pair{0.5f, 1.0f}, {0.5f, 0.25f}, {1.0f, 1.0f}}) {
      EXPECT_EQ(FmaChainsImpl(a, b, iterations), ref::FmaChains(a, b, iterations, lanes))
          << hwy::TargetName(HWY_TARGET) << " iterations=" << iterations << " a=" << a;
    }
  }
  // Rounding steps: a multiply and an add may differ from a fused one in the last bit of a step,
  // so to rounding.
  for (size_t iterations : {100, 1000, 100000}) {
    const float want = ref::FmaChains(0.999f, 0.001f, iterations, lanes);
    EXPECT_NEAR(FmaChainsImpl(0.999f, 0.001f, iterations), want, 1e-4 * std::fabs(want))
        << hwy::TargetName(HWY_TARGET) << " iterations=" << iterations;
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(FmaChainsTargetTest);
HWY_EXPORT_AND_TEST_P(FmaChainsTargetTest, TestFmaChainsMatchesReference);

TEST(FmaChainsTest, DispatchedMatchesReference) {
  EXPECT_EQ(FmaChains(0.5f, 1.0f, 7), ref::FmaChains(0.5f, 1.0f, 7, FloatLanes()));
  EXPECT_GE(FloatLanes(), 1u);
}

TEST(RefFmaChainsTest, ClosedForm) {
  // x -> x / 2 + 1 from c: after n steps 2 + (c - 2) / 2^n, exact in f32 for small n.
  double want = 0;
  for (size_t c = 0; c < kFmaChains; ++c) want += 2.0 + (static_cast<double>(c) - 2.0) / 8.0;
  EXPECT_EQ(ref::FmaChains(0.5f, 1.0f, 3, 1), static_cast<float>(want));
  EXPECT_EQ(ref::FmaChains(0.5f, 1.0f, 3, 4), static_cast<float>(4 * want));
}

// The rate is flops / time of the best repeat: it can be no higher than the flops one repeat
// does divided by the whole measurement's time over the repeats, and not absurdly high.
TEST(MeasureFmaPeakTest, PositiveFiniteAndBoundedByItsOwnWork) {
  for (size_t threads : {1, 2}) {
    ThreadPool pool(threads);
    const Stopwatch watch;
    const FmaPeakResult r = MeasureFmaPeak(pool, 0.005, 2);
    const double elapsed = watch.ElapsedSeconds();
    EXPECT_EQ(r.threads, static_cast<int>(threads));
    EXPECT_TRUE(std::isfinite(r.gflops)) << threads;
    EXPECT_GT(r.gflops, 0.0) << threads;
    // No core does 1,000 GFLOP/s of f32 with vectors of up to 16 lanes.
    EXPECT_LT(r.gflops, 1000.0 * static_cast<double>(threads)) << threads;
    EXPECT_GT(elapsed, 0.0);
  }
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
