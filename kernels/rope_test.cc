// ApplyRope on every compiled SIMD target against its scalar twin; RopeCosSin against long double;
// pass-through of the non-rotary dims, the identity at position 0, a known value.

#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/rope_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's ApplyRopeImpl from rope-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rope_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

// Floats past the end of x that the kernel must not touch.
constexpr size_t kGuard = 16;
constexpr float kGuardValue = 12345.0f;

struct RopeShape {
  size_t num_heads;
  size_t head_dim;
  size_t rotary_dim;
};

// Rotates num_heads heads with the kernel and the reference (tables from RopeCosSin at
// `position`) and checks: rotated dims agree to rounding, dims [rotary_dim, head_dim) and the
// guard past the last head are bitwise unchanged.
void CheckShape(const RopeShape& s, int64_t position, double theta, std::mt19937& rng) {
  const size_t half = s.rotary_dim / 2;
  std::vector<float> cos(half), sin(half);
  RopeCosSin(position, theta, static_cast<int64_t>(s.rotary_dim), cos.data(), sin.data());

  const size_t total = s.num_heads * s.head_dim;
  std::vector<float> x(total + kGuard, kGuardValue);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (size_t i = 0; i < total; ++i) x[i] = dist(rng);
  const std::vector<float> original = x;
  std::vector<float> want = x;
  ApplyRopeImpl(x.data(), s.num_heads, s.head_dim, s.rotary_dim, cos.data(), sin.data());
  ref::ApplyRope(want.data(), static_cast<int64_t>(s.num_heads), static_cast<int64_t>(s.head_dim),
                 static_cast<int64_t>(s.rotary_dim), cos.data(), sin.data());

  const std::string where =
      std::string(hwy::TargetName(HWY_TARGET)) + " heads=" + std::to_string(s.num_heads) +
      " head_dim=" + std::to_string(s.head_dim) + " rotary_dim=" + std::to_string(s.rotary_dim) +
      " pos=" + std::to_string(position);
  for (size_t h = 0; h < s.num_heads; ++h) {
    const float* in = original.data() + h * s.head_dim;
    for (size_t d = 0; d < s.head_dim; ++d) {
      const size_t i = h * s.head_dim + d;
      if (d >= s.rotary_dim) {
        ASSERT_EQ(x[i], original[i]) << where << " pass-through h=" << h << " d=" << d;
        continue;
      }
      // Error of a fused multiply-add pair: an ulp or so of the larger term.
      const size_t j = d % half;
      const double scale = std::fabs(in[j] * cos[j]) + std::fabs(in[j + half] * sin[j]) +
                           std::fabs(in[j + half] * cos[j]) + std::fabs(in[j] * sin[j]);
      ASSERT_NEAR(x[i], want[i], 1e-6 * scale + 1e-30) << where << " h=" << h << " d=" << d;
    }
  }
  for (size_t g = total; g < total + kGuard; ++g) ASSERT_EQ(x[g], kGuardValue) << where;
}

HWY_NOINLINE void TestApplyRopeMatchesRef() {
  std::mt19937 rng(1);
  // The models' shapes: 256-dim heads with 64 rotary dims (Qwen3-Next), full rotation.
  for (const RopeShape& s :
       {RopeShape{16, 256, 64}, RopeShape{2, 256, 64}, RopeShape{32, 128, 128},
        RopeShape{1, 2048, 2048}, RopeShape{1, 4096, 4096}, RopeShape{3, 4096, 2048}}) {
    for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4095}, int64_t{262143}}) {
      CheckShape(s, pos, 1e7, rng);
    }
  }
  // Random shapes: every rotary half size up to 150 (all tail lengths of every target), rotary
  // dims below and equal to head_dim, odd head_dims.
  std::uniform_int_distribution<int64_t> pos_dist(0, 1 << 20);
  for (size_t rotary_dim = 2; rotary_dim <= 300; rotary_dim += 2) {
    const size_t head_dim = rotary_dim + std::uniform_int_distribution<size_t>(0, 9)(rng);
    const size_t num_heads = std::uniform_int_distribution<size_t>(1, 4)(rng);
    CheckShape({num_heads, head_dim, rotary_dim}, pos_dist(rng), 1e4, rng);
  }
}

HWY_NOINLINE void TestApplyRopePositionZeroIsIdentity() {
  // cos = 1 and sin = 0 exactly, so x * 1 - y * 0 = x exactly (compared with ==, which does not
  // care about the sign of a zero).
  std::mt19937 rng(2);
  for (const RopeShape& s : {RopeShape{16, 256, 64}, RopeShape{3, 37, 36}, RopeShape{1, 2, 2}}) {
    std::vector<float> cos(s.rotary_dim / 2), sin(s.rotary_dim / 2);
    RopeCosSin(0, 1e7, static_cast<int64_t>(s.rotary_dim), cos.data(), sin.data());
    std::vector<float> x(s.num_heads * s.head_dim);
    std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
    for (float& v : x) v = dist(rng);
    const std::vector<float> original = x;
    ApplyRopeImpl(x.data(), s.num_heads, s.head_dim, s.rotary_dim, cos.data(), sin.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i], original[i]) << hwy::TargetName(HWY_TARGET) << " i=" << i;
    }
  }
}

HWY_NOINLINE void TestApplyRopeKnownValue() {
  // theta 1e7, rotary_dim 16, position 5, one head of 20 dims (4 pass through), x[d] = d + 1.
  // Expected rotation from long double angles; the kernel sees the tables rounded to float, whose
  // error (< 6e-8) times |x| <= 20 bounds the difference.
  constexpr int64_t kRotary = 16;
  constexpr int64_t kHalf = kRotary / 2;
  float cos[kHalf], sin[kHalf];
  RopeCosSin(5, 1e7, kRotary, cos, sin);
  float x[20];
  for (int d = 0; d < 20; ++d) x[d] = static_cast<float>(d + 1);
  ApplyRopeImpl(x, 1, 20, kRotary, cos, sin);
  for (int64_t j = 0; j < kHalf; ++j) {
    const long double angle = 5.0L * std::pow(1e7L, -2.0L * j / kRotary);
    const long double c = std::cos(angle);
    const long double s = std::sin(angle);
    const long double lo = j + 1;
    const long double hi = j + 1 + kHalf;
    EXPECT_NEAR(x[j], static_cast<double>(lo * c - hi * s), 2e-6)
        << hwy::TargetName(HWY_TARGET) << " j=" << j;
    EXPECT_NEAR(x[j + kHalf], static_cast<double>(hi * c + lo * s), 2e-6)
        << hwy::TargetName(HWY_TARGET) << " j=" << j;
  }
  for (int d = kRotary; d < 20; ++d) EXPECT_EQ(x[d], static_cast<float>(d + 1));
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(RopeTargetTest);
HWY_EXPORT_AND_TEST_P(RopeTargetTest, TestApplyRopeMatchesRef);
HWY_EXPORT_AND_TEST_P(RopeTargetTest, TestApplyRopePositionZeroIsIdentity);
HWY_EXPORT_AND_TEST_P(RopeTargetTest, TestApplyRopeKnownValue);

namespace {

TEST(RopeCosSinTest, MatchesLongDouble) {
  // Angles in double are good to ~1e-11 rad even at position 2^20, so each table entry is the
  // long double value rounded to float, up to an ulp (6e-8 below 1).
  for (double theta : {1e4, 1e6, 1e7}) {
    for (int64_t rotary_dim : {2, 16, 64, 128}) {
      for (int64_t pos : {0, 1, 5, 1000, 123457, 1 << 20}) {
        std::vector<float> cos(rotary_dim / 2), sin(rotary_dim / 2);
        RopeCosSin(pos, theta, rotary_dim, cos.data(), sin.data());
        for (int64_t j = 0; j < rotary_dim / 2; ++j) {
          const long double angle =
              static_cast<long double>(pos) *
              std::pow(static_cast<long double>(theta), -2.0L * j / rotary_dim);
          ASSERT_NEAR(cos[j], static_cast<double>(std::cos(angle)), 6e-8)
              << "theta=" << theta << " rotary_dim=" << rotary_dim << " pos=" << pos << " j=" << j;
          ASSERT_NEAR(sin[j], static_cast<double>(std::sin(angle)), 6e-8)
              << "theta=" << theta << " rotary_dim=" << rotary_dim << " pos=" << pos << " j=" << j;
        }
      }
    }
  }
}

TEST(RopeCosSinTest, PositionZeroAndFirstFrequency) {
  std::vector<float> cos(32), sin(32);
  RopeCosSin(0, 1e7, 64, cos.data(), sin.data());
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(cos[j], 1.0f);
    EXPECT_EQ(sin[j], 0.0f);
  }
  // inv_freq[0] = theta^0 = 1: the first pair turns by exactly `position` radians.
  RopeCosSin(5, 1e7, 64, cos.data(), sin.data());
  EXPECT_EQ(cos[0], static_cast<float>(std::cos(5.0)));
  EXPECT_EQ(sin[0], static_cast<float>(std::sin(5.0)));
}

TEST(RopeDispatchTest, MatchesReference) {
  // The public entry point, on whatever target the machine picks: a Qwen3-Next q block
  // (16 heads of 256, 64 rotary dims).
  std::vector<float> cos(32), sin(32);
  RopeCosSin(1234, 1e7, 64, cos.data(), sin.data());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> got(16 * 256);
  for (float& v : got) v = dist(rng);
  std::vector<float> want = got;
  ApplyRope(got.data(), 16, 256, 64, cos.data(), sin.data());
  ref::ApplyRope(want.data(), 16, 256, 64, cos.data(), sin.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
  // rotary_dim 0 and zero heads are no-ops.
  const std::vector<float> before = got;
  ApplyRope(got.data(), 16, 256, 0, cos.data(), sin.data());
  ApplyRope(got.data(), 0, 256, 64, cos.data(), sin.data());
  EXPECT_EQ(got, before);
}

TEST(RopeDeathTest, BadArguments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float x[8] = {};
  float c[4] = {};
  float s[4] = {};
  EXPECT_DEATH(ApplyRope(x, 1, 8, 3, c, s), "rotary_dim must be even");
  EXPECT_DEATH(ApplyRope(x, 1, 4, 8, c, s), "CHECK failed: \\(rotary_dim\\) <= \\(head_dim\\)");
  EXPECT_DEATH(RopeCosSin(0, 1e7, 7, c, s), "rotary_dim must be even");
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
