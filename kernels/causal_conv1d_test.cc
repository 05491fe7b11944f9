// CausalConv1dSiluStep on every compiled SIMD target: T steps from a zero state against the causal
// conv computed directly from its definition (docs/spec/model.md §3.c.2), the state window after
// each step, the scalar twin from a random state, out aliasing x; the dispatched entry point once.

#include "kernels/causal_conv1d.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/causal_conv1d_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's CausalConv1dSiluStepImpl from causal_conv1d-inl.h directly, not through the
// dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/causal_conv1d_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/causal_conv1d-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

void FillUniform(std::mt19937& rng, float lo, float hi, std::vector<float>* x) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& v : *x) v = dist(rng);
}

double SiluDouble(double u) { return u / (1.0 + std::exp(-u)); }

// The channel counts of the brief (1, 7, 64 and the 80B conv_dim 8192) plus every count up to 40
// for the tail lengths of every target.
std::vector<size_t> ChannelCounts() {
  std::vector<size_t> counts = {1, 7, 64, 8192};
  for (size_t c = 2; c <= 40; ++c) {
    if (c != 7) counts.push_back(c);
  }
  return counts;
}

// Runs T steps of the kernel from a zero state over inputs xin [T][C] and checks each step's
// output against the definition
//   u[t][c] = sum_{j<Kc} w[j][c] * xin[t - (Kc-1) + j][c]   (xin[< 0] = 0),  y = silu(u)
// evaluated in double, and the state after each step against the last Kc-1 inputs (bitwise:
// the state is a copy). Odd steps run with out aliasing x.
void CheckAgainstDefinition(size_t C, size_t Kc, size_t T, std::mt19937& rng) {
  std::vector<float> w(Kc * C), xin(T * C);
  FillUniform(rng, -0.6f, 0.6f, &w);
  FillUniform(rng, -3.0f, 3.0f, &xin);
  std::vector<float> state((Kc - 1) * C, 0.0f);
  std::vector<float> x(C), out(C);
  const std::string where = std::string(hwy::TargetName(HWY_TARGET)) + " C=" + std::to_string(C) +
                            " Kc=" + std::to_string(Kc);
  for (size_t t = 0; t < T; ++t) {
    x.assign(xin.begin() + t * C, xin.begin() + (t + 1) * C);
    const bool aliased = t % 2 == 1;
    float* y = aliased ? x.data() : out.data();
    CausalConv1dSiluStepImpl(x.data(), state.data(), w.data(), C, Kc, y);
    for (size_t c = 0; c < C; ++c) {
      double u = 0.0;
      double magnitude = 0.0;  // sum |w * x|: the scale of the f32 rounding error of u
      for (size_t j = 0; j < Kc; ++j) {
        const int64_t src = static_cast<int64_t>(t + j) - static_cast<int64_t>(Kc - 1);
        if (src < 0) continue;
        const double term = static_cast<double>(w[j * C + c]) * xin[src * C + c];
        u += term;
        magnitude += std::fabs(term);
      }
      const double want = SiluDouble(u);
      ASSERT_NEAR(y[c], want, 1e-5 * std::fabs(want) + 1e-6 * magnitude)
          << where << " t=" << t << " c=" << c << (aliased ? " aliased" : "");
    }
    // state[j] = xin[t - (Kc-2) + j], zero before the sequence start.
    for (size_t j = 0; j + 1 < Kc; ++j) {
      const int64_t src = static_cast<int64_t>(t + j) - static_cast<int64_t>(Kc - 2);
      for (size_t c = 0; c < C; ++c) {
        const float want = src < 0 ? 0.0f : xin[src * C + c];
        ASSERT_EQ(state[j * C + c], want) << where << " t=" << t << " row=" << j << " c=" << c;
      }
    }
  }
}

HWY_NOINLINE void TestCausalConvMatchesDefinition() {
  std::mt19937 rng(1);
  for (size_t Kc : {2, 3, 4}) {
    for (size_t C : ChannelCounts()) {
      // More steps than the window, so that zero padding, filling and sliding all happen.
      CheckAgainstDefinition(C, Kc, /*T=*/C > 1000 ? 6 : 9, rng);
    }
  }
}

HWY_NOINLINE void TestCausalConvMatchesRefFromRandomState() {
  std::mt19937 rng(2);
  for (size_t Kc : {1, 2, 3, 4}) {
    for (size_t C : ChannelCounts()) {
      std::vector<float> w(Kc * C), x(C), state((Kc - 1) * C);
      FillUniform(rng, -0.6f, 0.6f, &w);
      FillUniform(rng, -3.0f, 3.0f, &x);
      FillUniform(rng, -3.0f, 3.0f, &state);
      std::vector<float> ref_state = state;
      std::vector<float> got(C), want(C);
      CausalConv1dSiluStepImpl(x.data(), state.data(), w.data(), C, Kc, got.data());
      ref::CausalConv1dSiluStep(x.data(), ref_state.data(), w.data(), static_cast<int64_t>(C),
                                static_cast<int64_t>(Kc), want.data());
      const std::string where = std::string(hwy::TargetName(HWY_TARGET)) +
                                " C=" + std::to_string(C) + " Kc=" + std::to_string(Kc);
      for (size_t c = 0; c < C; ++c) {
        // Inputs |w * x| <= 1.8 per term: an absolute floor of 1e-6 per term covers the f32
        // rounding of the dot product when it cancels.
        ASSERT_NEAR(got[c], want[c], 1e-5 * std::fabs(want[c]) + 2e-6 * Kc) << where << " c=" << c;
      }
      ASSERT_EQ(state, ref_state) << where;

      // out aliasing x: the same output and state as with a separate output, from the same
      // start state.
      std::vector<float> start((Kc - 1) * C);
      FillUniform(rng, -3.0f, 3.0f, &start);
      std::vector<float> state_separate = start;
      std::vector<float> state_aliased = start;
      std::vector<float> separate(C);
      std::vector<float> x_aliased = x;
      CausalConv1dSiluStepImpl(x.data(), state_separate.data(), w.data(), C, Kc, separate.data());
      CausalConv1dSiluStepImpl(x_aliased.data(), state_aliased.data(), w.data(), C, Kc,
                               x_aliased.data());
      ASSERT_EQ(x_aliased, separate) << where << " aliased";
      ASSERT_EQ(state_aliased, state_separate) << where << " aliased";
    }
  }
}

// Splitting the channels into ranges (key-head sized, odd, and ones that cut a vector) gives the
// whole step's bits, output and state, on every target.
HWY_NOINLINE void TestCausalConvRangesEqualTheWholeStep() {
  std::mt19937 rng(4);
  for (size_t Kc : {1, 2, 4}) {
    for (size_t C : ChannelCounts()) {
      std::vector<float> w(Kc * C), x(C), start((Kc - 1) * C);
      FillUniform(rng, -0.6f, 0.6f, &w);
      FillUniform(rng, -3.0f, 3.0f, &x);
      FillUniform(rng, -3.0f, 3.0f, &start);
      std::vector<float> whole_state = start, whole(C);
      CausalConv1dSiluStepImpl(x.data(), whole_state.data(), w.data(), C, Kc, whole.data());
      for (size_t piece : {size_t{1}, size_t{3}, size_t{16}, size_t{37}, size_t{128}}) {
        std::vector<float> state = start, got(C, -1.0f);
        for (size_t begin = 0; begin < C; begin += piece) {
          CausalConv1dSiluStepRangeImpl(x.data(), state.data(), w.data(), C, Kc, begin,
                                        std::min(C, begin + piece), got.data());
        }
        const std::string where = std::string(hwy::TargetName(HWY_TARGET)) +
                                  " C=" + std::to_string(C) + " Kc=" + std::to_string(Kc) +
                                  " piece=" + std::to_string(piece);
        ASSERT_EQ(got, whole) << where;
        ASSERT_EQ(state, whole_state) << where;
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(CausalConv1dTargetTest);
HWY_EXPORT_AND_TEST_P(CausalConv1dTargetTest, TestCausalConvMatchesDefinition);
HWY_EXPORT_AND_TEST_P(CausalConv1dTargetTest, TestCausalConvMatchesRefFromRandomState);
HWY_EXPORT_AND_TEST_P(CausalConv1dTargetTest, TestCausalConvRangesEqualTheWholeStep);

namespace {

TEST(CausalConv1dDispatchTest, MatchesReference) {
  // The public entry point, on whatever target the machine picks, for the 80B shape (conv_dim
  // 8192, Kc 4) over a few decode steps.
  constexpr int64_t C = 8192;
  constexpr int64_t Kc = 4;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(Kc * C), state((Kc - 1) * C, 0.0f);
  for (float& v : w) v = dist(rng);
  std::vector<float> ref_state = state;
  std::vector<float> x(C), got(C), want(C);
  for (int step = 0; step < 5; ++step) {
    for (float& v : x) v = dist(rng);
    CausalConv1dSiluStep(x.data(), state.data(), w.data(), C, Kc, got.data());
    ref::CausalConv1dSiluStep(x.data(), ref_state.data(), w.data(), C, Kc, want.data());
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_NEAR(got[c], want[c], 1e-5 * std::fabs(want[c]) + 1e-6 * Kc) << step << " " << c;
    }
    ASSERT_EQ(state, ref_state) << step;
  }
}

TEST(CausalConv1dDeathTest, BadArguments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float x[4] = {};
  float out[4];
  EXPECT_DEATH(CausalConv1dSiluStep(x, nullptr, x, 4, 0, out), "CHECK failed: \\(Kc\\) >= \\(1\\)");
  EXPECT_DEATH(CausalConv1dSiluStepRange(x, x, x, 4, 2, 3, 5, out),
               "CHECK failed: \\(end\\) <= \\(C\\)");
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
