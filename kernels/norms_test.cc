// RmsNorm, RmsNormGated and L2Normalize on every compiled SIMD target against their scalar twins
// (double accumulation), in place and out of place; the dispatched entry points once.

#include "kernels/norms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/norms_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's *Impl functions from norms-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/norms_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/norms-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

// The relative tolerance: the f32 sum of squares (four accumulators per lane) and a few
// roundings per element, against double.
constexpr double kRel = 1e-5;
// For results in the f32 subnormal range (silu of a very negative gate), where relative
// precision is lost in both versions.
constexpr double kTiny = 1e-30;

// Every size up to 300 (all tail lengths of every target), the head sizes, and rows of real
// models (hidden 2048, 4096) plus an odd size past them.
std::vector<size_t> TestSizes() {
  std::vector<size_t> sizes(300);
  std::iota(sizes.begin(), sizes.end(), size_t{1});
  sizes.insert(sizes.end(), {2048, 4096, 4099});
  return sizes;
}

void FillUniform(std::mt19937& rng, float lo, float hi, float* x, size_t n) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
}

// Expects |got[i] - want[i]| <= rel * |want[i]| + abs for all i; reports the first miss only.
void ExpectClose(const float* got, const float* want, size_t n, double rel, double abs,
                 const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    const double tol = rel * std::fabs(static_cast<double>(want[i])) + abs;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << " target=" << hwy::TargetName(HWY_TARGET) << " n=" << n << " i=" << i
                    << " got=" << got[i] << " want=" << want[i];
      return;
    }
  }
}

void ExpectBitwiseEqual(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], b[i]) << what << " target=" << hwy::TargetName(HWY_TARGET) << " i=" << i;
  }
}

HWY_NOINLINE void TestRmsNormMatchesRef() {
  std::mt19937 rng(1);
  // Magnitudes of hidden states from tiny to large; the (1 + w) weights near 1 with some spread.
  for (float scale : {1.0f, 1e-3f, 1e4f}) {
    for (size_t n : TestSizes()) {
      // x starts at offset n % 4 into its buffer so that every misalignment is exercised.
      const size_t offset = n % 4;
      std::vector<float> buf(n + offset), w(n), got(n), want(n);
      FillUniform(rng, -scale, scale, buf.data(), buf.size());
      FillUniform(rng, 0.5f, 1.5f, w.data(), n);
      const float* x = buf.data() + offset;
      RmsNormImpl(x, w.data(), 1e-6f, got.data(), n);
      ref::RmsNorm(x, w.data(), 1e-6f, want.data(), static_cast<int64_t>(n));
      ExpectClose(got.data(), want.data(), n, kRel, kTiny,
                  "RmsNorm scale=" + std::to_string(scale));

      // y == x gives the same values as a separate output.
      std::vector<float> in_place(x, x + n);
      RmsNormImpl(in_place.data(), w.data(), 1e-6f, in_place.data(), n);
      ExpectBitwiseEqual(in_place, got, "RmsNorm in place");
    }
  }
}

HWY_NOINLINE void TestRmsNormKnownValuesAndZeros() {
  // x = (3, 4), w = (1, 2), eps = 0: mean(x^2) = 12.5, so y = x * w / sqrt(12.5).
  const float x[2] = {3.0f, 4.0f};
  const float w[2] = {1.0f, 2.0f};
  float y[2];
  RmsNormImpl(x, w, 0.0f, y, 2);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(12.5), 1e-7) << hwy::TargetName(HWY_TARGET);
  EXPECT_NEAR(y[1], 8.0 / std::sqrt(12.5), 2e-7) << hwy::TargetName(HWY_TARGET);

  // All zeros: eps keeps rsqrt finite, the output is 0, not NaN.
  for (size_t n : {1, 7, 64, 300}) {
    std::vector<float> zeros(n, 0.0f), ones(n, 1.0f), out(n, 5.0f);
    RmsNormImpl(zeros.data(), ones.data(), 1e-6f, out.data(), n);
    ExpectBitwiseEqual(out, zeros, "RmsNorm zeros");
    RmsNormGatedImpl(zeros.data(), ones.data(), ones.data(), 1e-6f, out.data(), n);
    ExpectBitwiseEqual(out, zeros, "RmsNormGated zeros");
    std::vector<float> l2 = zeros;
    L2NormalizeImpl(l2.data(), 1e-6f, 1.0f, n);
    ExpectBitwiseEqual(l2, zeros, "L2Normalize zeros");
  }
}

HWY_NOINLINE void TestRmsNormGatedMatchesRef() {
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> pick(0, 15);
  const float large[] = {100.0f, -100.0f, 1e4f, -1e4f};
  for (size_t n : TestSizes()) {
    std::vector<float> x(n), z(n), w(n), got(n), want(n);
    FillUniform(rng, -2.0f, 2.0f, x.data(), n);
    FillUniform(rng, 0.5f, 1.5f, w.data(), n);
    // Gates mostly moderate, some far out in both tails of the sigmoid.
    FillUniform(rng, -8.0f, 8.0f, z.data(), n);
    for (float& v : z) {
      const int p = pick(rng);
      if (p < 4) v = large[p];
    }
    RmsNormGatedImpl(x.data(), z.data(), w.data(), 1e-6f, got.data(), n);
    ref::RmsNormGated(x.data(), z.data(), w.data(), 1e-6f, want.data(), static_cast<int64_t>(n));
    ExpectClose(got.data(), want.data(), n, kRel, kTiny, "RmsNormGated");

    std::vector<float> in_place = x;
    RmsNormGatedImpl(in_place.data(), z.data(), w.data(), 1e-6f, in_place.data(), n);
    ExpectBitwiseEqual(in_place, got, "RmsNormGated in place");
  }
}

HWY_NOINLINE void TestL2NormalizeMatchesRef() {
  std::mt19937 rng(3);
  // scale 1/sqrt(dk) for q (dk = 128), 1 for k.
  for (float scale : {1.0f, 1.0f / std::sqrt(128.0f)}) {
    for (size_t n : TestSizes()) {
      std::vector<float> got(n);
      FillUniform(rng, -3.0f, 3.0f, got.data(), n);
      std::vector<float> want = got;
      double in_sum_sq = 0.0;
      for (float v : got) in_sum_sq += static_cast<double>(v) * v;
      L2NormalizeImpl(got.data(), 1e-6f, scale, n);
      ref::L2Normalize(want.data(), 1e-6f, scale, static_cast<int64_t>(n));
      ExpectClose(got.data(), want.data(), n, kRel, kTiny, "L2Normalize");
      // The result has norm scale * sqrt(s / (s + eps)), s = sum(x^2): just below `scale`.
      double sum_sq = 0.0;
      for (float v : got) sum_sq += static_cast<double>(v) * v;
      const double want_norm = scale * std::sqrt(in_sum_sq / (in_sum_sq + 1e-6));
      EXPECT_NEAR(std::sqrt(sum_sq), want_norm, kRel * want_norm)
          << hwy::TargetName(HWY_TARGET) << " n=" << n;
    }
  }
  // eps sits inside the sqrt of the sum (not of the mean): x = (1e-3), eps = 1e-6 gives
  // 1e-3 / sqrt(1e-6 + 1e-6).
  float x = 1e-3f;
  L2NormalizeImpl(&x, 1e-6f, 1.0f, 1);
  EXPECT_NEAR(x, 1e-3 / std::sqrt(2e-6), 1e-6) << hwy::TargetName(HWY_TARGET);
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(NormsTargetTest);
HWY_EXPORT_AND_TEST_P(NormsTargetTest, TestRmsNormMatchesRef);
HWY_EXPORT_AND_TEST_P(NormsTargetTest, TestRmsNormKnownValuesAndZeros);
HWY_EXPORT_AND_TEST_P(NormsTargetTest, TestRmsNormGatedMatchesRef);
HWY_EXPORT_AND_TEST_P(NormsTargetTest, TestL2NormalizeMatchesRef);

namespace {

// The public entry points, on whatever target the machine picks, against the references.
TEST(NormsDispatchTest, MatchesReference) {
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int64_t n : {0, 1, 128, 256, 2048, 2051}) {
    std::vector<float> x(n), z(n), w(n), got(n), want(n);
    for (float& v : x) v = dist(rng);
    for (float& v : z) v = dist(rng);
    for (float& v : w) v = 1.0f + dist(rng) / 4;
    auto expect_close = [&](const char* what) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-30) << what << " i=" << i;
      }
    };
    RmsNorm(x.data(), w.data(), 1e-6f, got.data(), n);
    ref::RmsNorm(x.data(), w.data(), 1e-6f, want.data(), n);
    expect_close("RmsNorm");
    RmsNormGated(x.data(), z.data(), w.data(), 1e-6f, got.data(), n);
    ref::RmsNormGated(x.data(), z.data(), w.data(), 1e-6f, want.data(), n);
    expect_close("RmsNormGated");
    got = x;
    want = x;
    L2Normalize(got.data(), 1e-6f, 0.125f, n);
    ref::L2Normalize(want.data(), 1e-6f, 0.125f, n);
    expect_close("L2Normalize");
  }
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
