// The gated delta rule: the SIMD step and chunk on every compiled target against the scalar
// twins, the chunked form against the recurrent one, the dispatched entry points, and the twins
// against each other and against values worked by hand.

#include "kernels/gated_delta_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ref/gated_delta_rule_ref.h"

// Target-independent helpers, compiled once although foreach_target.h re-includes this file.
#ifndef MOESERVE_KERNELS_GATED_DELTA_RULE_TEST_HELPERS_
#define MOESERVE_KERNELS_GATED_DELTA_RULE_TEST_HELPERS_
namespace moeserve::kernels::gdn_test {

// How fast the state forgets: g = -exp(A) * softplus(x + shift) per token.
enum class Decay {
  kRealistic,  // A ~ log U(1, 16), x ~ N(0, 1) as the layer computes it (docs/spec/model.md §3.c.3): decays
               // between ~1e-6 and ~0.7 per token, so a chunk mostly forgets what came before.
  kSlow,       // the same with x shifted by -6: decays ~0.95..0.999, so the state carried
               // between chunks and the exp(gamma) factors all matter.
  kNone,       // g = 0: no decay at all.
};

// T tokens of prepared inputs for one value head, in the layer's layout: q and k rows of
// qk_stride floats (dk used), v rows of v_stride (dv used). Padding floats are NaN, so a kernel
// that reads them poisons its output.
struct Inputs {
  int64_t T = 0, dk = 0, dv = 0, qk_stride = 0, v_stride = 0;
  std::vector<float> q, k, v;  // [T][qk_stride], [T][qk_stride], [T][v_stride]
  std::vector<float> g, beta;  // [T]
  const float* q_row(int64_t t) const { return q.data() + t * qk_stride; }
  const float* k_row(int64_t t) const { return k.data() + t * qk_stride; }
  const float* v_row(int64_t t) const { return v.data() + t * v_stride; }
};

// x * rsqrt(sum x^2 + 1e-6) * extra_scale over n floats (docs/spec/model.md §4.2: eps on the sum).
inline void L2Normalize(float* x, int64_t n, double extra_scale) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double f = extra_scale / std::sqrt(ss + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * f);
}

inline Inputs MakeInputs(int64_t T, int64_t dk, int64_t dv, Decay decay, uint32_t seed,
                         int64_t qk_pad = 0, int64_t v_pad = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(1.0, 16.0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Inputs in;
  in.T = T;
  in.dk = dk;
  in.dv = dv;
  in.qk_stride = dk + qk_pad;
  in.v_stride = dv + v_pad;
  in.q.assign(T * in.qk_stride, nan);
  in.k.assign(T * in.qk_stride, nan);
  in.v.assign(T * in.v_stride, nan);
  in.g.resize(T);
  in.beta.resize(T);
  const double rate = uniform(rng);  // exp(A_log) with A_log = log U(1, 16): one per head
  const double shift = decay == Decay::kSlow ? -6.0 : 0.0;
  for (int64_t t = 0; t < T; ++t) {
    float* q = in.q.data() + t * in.qk_stride;
    float* k = in.k.data() + t * in.qk_stride;
    for (int64_t i = 0; i < dk; ++i) q[i] = normal(rng);
    for (int64_t i = 0; i < dk; ++i) k[i] = normal(rng);
    L2Normalize(q, dk, 1.0 / std::sqrt(static_cast<double>(dk)));
    L2Normalize(k, dk, 1.0);
    for (int64_t j = 0; j < dv; ++j) in.v[t * in.v_stride + j] = normal(rng);
    in.beta[t] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(normal(rng)))));
    const double x = normal(rng) + shift;
    const double softplus = x > 20.0 ? x : std::log1p(std::exp(x));
    in.g[t] = decay == Decay::kNone ? 0.0f : static_cast<float>(-rate * softplus);
  }
  return in;
}

// A state of the magnitude a running layer holds: N(0, 0.5) entries.
inline std::vector<float> RandomState(int64_t dk, int64_t dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> S(dk * dv);
  for (float& s : S) s = normal(rng);
  return S;
}

// max |got - want| / max |want|: the error relative to the tensor's scale (elementwise relative
// error is meaningless for the entries that cancel to near zero). Any NaN counts as infinite.
inline double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double max_diff = 0.0, max_want = 0.0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= max_diff)) max_diff = std::isnan(diff) ? INFINITY : diff;
    max_want = std::max(max_want, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / std::max(max_want, 1e-30);
}

// T recurrent steps with the scalar twin, starting from S (updated in place); outputs [T][dv].
inline std::vector<float> RefSteps(const Inputs& in, int64_t t0, int64_t T, std::vector<float>& S) {
  std::vector<float> out(T * in.dv);
  for (int64_t t = 0; t < T; ++t) {
    ref::GatedDeltaRuleStep(S.data(), in.q_row(t0 + t), in.k_row(t0 + t), in.v_row(t0 + t),
                            in.g[t0 + t], in.beta[t0 + t], in.dk, in.dv, out.data() + t * in.dv);
  }
  return out;
}

// Chunk function signature shared by the per-target kernel, the dispatched one and the twin.
using ChunkFn = void (*)(float*, const float*, const float*, int64_t, const float*, int64_t,
                         const float*, const float*, int64_t, int64_t, int64_t, float*, int64_t);

// Tokens [t0, t0 + T) through `chunk` in pieces of at most 64 that start at multiples of 64 from
// t0, starting from S (updated in place); outputs [T][dv].
inline std::vector<float> RunChunks(ChunkFn chunk, const Inputs& in, int64_t t0, int64_t T,
                                    std::vector<float>& S) {
  std::vector<float> out(T * in.dv);
  for (int64_t c = 0; c < T; c += kGdnChunkSize) {
    const int64_t n = std::min(kGdnChunkSize, T - c);
    chunk(S.data(), in.q_row(t0 + c), in.k_row(t0 + c), in.qk_stride, in.v_row(t0 + c), in.v_stride,
          in.g.data() + t0 + c, in.beta.data() + t0 + c, n, in.dk, in.dv, out.data() + c * in.dv,
          in.dv);
  }
  return out;
}

struct Dims {
  int64_t dk, dv;
};
// The brief's shapes, plus odd ones for the vector tails, and the largest head.
inline constexpr Dims kStepDims[] = {{16, 16}, {64, 64}, {128, 128}, {64, 32},   {24, 40},
                                     {1, 1},   {3, 17},  {7, 100},   {128, 100}, {256, 256}};
inline constexpr Decay kDecays[] = {Decay::kRealistic, Decay::kSlow, Decay::kNone};

}  // namespace moeserve::kernels::gdn_test
#endif  // MOESERVE_KERNELS_GATED_DELTA_RULE_TEST_HELPERS_

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's kernels from gated_delta_rule-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gated_delta_rule_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/gated_delta_rule-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
namespace {

using namespace gdn_test;  // NOLINT(build/namespaces): test helpers only

// Tolerances (relative to the tensor's largest entry). The SIMD kernels sum in f32 in another
// order than the double-summing twins; the chunked form also rounds differently from the
// recurrence (its WY factors pass through f32 matrices).
constexpr double kStepTol = 1e-5;
constexpr double kChunkVsRefChunkTol = 2e-5;
constexpr double kChunkVsStepsTol = 2e-4;

HWY_NOINLINE void TestStepMatchesRef() {
  uint32_t seed = 1;
  for (const Dims& dims : kStepDims) {
    for (Decay decay : kDecays) {
      for (bool zero_start : {true, false}) {
        const int64_t T = 40;
        const Inputs in = MakeInputs(T, dims.dk, dims.dv, decay, ++seed);
        std::vector<float> S_ref = zero_start ? std::vector<float>(dims.dk * dims.dv)
                                              : RandomState(dims.dk, dims.dv, ++seed);
        std::vector<float> S = S_ref;
        const std::vector<float> want = RefSteps(in, 0, T, S_ref);
        // Exactly dv floats per output (no slack), so an over-run is an ASan error.
        std::vector<float> got(T * dims.dv);
        for (int64_t t = 0; t < T; ++t) {
          std::vector<float> out(dims.dv);
          GatedDeltaRuleStepImpl(S.data(), in.q_row(t), in.k_row(t), in.v_row(t), in.g[t],
                                 in.beta[t], dims.dk, dims.dv, out.data());
          std::copy(out.begin(), out.end(), got.begin() + t * dims.dv);
        }
        const auto where = [&] {
          return ::testing::Message()
                 << hwy::TargetName(HWY_TARGET) << " dk=" << dims.dk << " dv=" << dims.dv
                 << " decay=" << static_cast<int>(decay) << " zero_start=" << zero_start;
        };
        EXPECT_LE(RelErr(got, want), kStepTol) << where();
        EXPECT_LE(RelErr(S, S_ref), kStepTol) << where();
      }
    }
  }
}

HWY_NOINLINE void TestChunkMatchesRefChunk() {
  uint32_t seed = 100;
  // (300, 20) is past the scratch's initial sizing for dk and makes it grow.
  std::vector<Dims> dims_list(std::begin(kStepDims), std::end(kStepDims));
  dims_list.push_back({300, 20});
  for (const Dims& dims : dims_list) {
    for (Decay decay : kDecays) {
      for (int64_t T : {1, 2, 3, 4, 5, 7, 16, 17, 33, 63, 64}) {
        const Inputs in = MakeInputs(T, dims.dk, dims.dv, decay, ++seed);
        std::vector<float> S_ref = RandomState(dims.dk, dims.dv, ++seed);
        std::vector<float> S = S_ref;
        const std::vector<float> want = RunChunks(&ref::GatedDeltaRuleChunk, in, 0, T, S_ref);
        const std::vector<float> got = RunChunks(&GatedDeltaRuleChunkImpl, in, 0, T, S);
        const auto where = [&] {
          return ::testing::Message()
                 << hwy::TargetName(HWY_TARGET) << " dk=" << dims.dk << " dv=" << dims.dv
                 << " decay=" << static_cast<int>(decay) << " T=" << T;
        };
        EXPECT_LE(RelErr(got, want), kChunkVsRefChunkTol) << where();
        EXPECT_LE(RelErr(S, S_ref), kChunkVsRefChunkTol) << where();
      }
    }
  }
}

HWY_NOINLINE void TestChunkMatchesSteps() {
  uint32_t seed = 200;
  for (const Dims& dims :
       {Dims{16, 16}, Dims{64, 64}, Dims{128, 128}, Dims{64, 32}, Dims{24, 40}}) {
    for (Decay decay : kDecays) {
      for (int64_t T = 1; T <= kGdnChunkSize; ++T) {
        // Every T for the small heads; for 128x128 the lengths around vector and chunk edges.
        if (dims.dk == 128 && T > 4 && T % 16 != 0 && T % 16 != 1 && T % 16 != 15) continue;
        const Inputs in = MakeInputs(T, dims.dk, dims.dv, decay, ++seed);
        std::vector<float> S_ref = RandomState(dims.dk, dims.dv, ++seed);
        std::vector<float> S = S_ref;
        const std::vector<float> want = RefSteps(in, 0, T, S_ref);
        const std::vector<float> got = RunChunks(&GatedDeltaRuleChunkImpl, in, 0, T, S);
        const auto where = [&] {
          return ::testing::Message()
                 << hwy::TargetName(HWY_TARGET) << " dk=" << dims.dk << " dv=" << dims.dv
                 << " decay=" << static_cast<int>(decay) << " T=" << T;
        };
        EXPECT_LE(RelErr(got, want), kChunkVsStepsTol) << where();
        EXPECT_LE(RelErr(S, S_ref), kChunkVsStepsTol) << where();
      }
    }
  }
}

HWY_NOINLINE void TestChunkedSequenceMatchesSteps() {
  // 150 tokens as a prefill would cut them (64 + 64 + 22), the state carried between chunks,
  // against 150 recurrent steps; from a fresh state and from one left by earlier tokens.
  uint32_t seed = 300;
  for (const Dims& dims : {Dims{128, 128}, Dims{64, 32}, Dims{24, 40}, Dims{16, 16}}) {
    for (Decay decay : kDecays) {
      for (bool zero_start : {true, false}) {
        const int64_t T = 150;
        const Inputs in = MakeInputs(T, dims.dk, dims.dv, decay, ++seed);
        std::vector<float> S_ref = zero_start ? std::vector<float>(dims.dk * dims.dv)
                                              : RandomState(dims.dk, dims.dv, ++seed);
        std::vector<float> S = S_ref;
        const std::vector<float> want = RefSteps(in, 0, T, S_ref);
        const std::vector<float> got = RunChunks(&GatedDeltaRuleChunkImpl, in, 0, T, S);
        const auto where = [&] {
          return ::testing::Message()
                 << hwy::TargetName(HWY_TARGET) << " dk=" << dims.dk << " dv=" << dims.dv
                 << " decay=" << static_cast<int>(decay) << " zero_start=" << zero_start;
        };
        EXPECT_LE(RelErr(got, want), kChunkVsStepsTol) << where();
        EXPECT_LE(RelErr(S, S_ref), kChunkVsStepsTol) << where();
      }
    }
  }
}

HWY_NOINLINE void TestChunkStridesAndBounds() {
  // Rows wider than the head (the layer's q/k/v live inside wider rows) with NaN between them,
  // and output rows with slack that must stay untouched. Strides only move addresses, so the
  // results must equal the compact-layout ones bit for bit.
  uint32_t seed = 400;
  for (const Dims& dims : {Dims{128, 128}, Dims{24, 40}, Dims{3, 17}}) {
    for (int64_t T : {1, 5, 64}) {
      const Inputs compact = MakeInputs(T, dims.dk, dims.dv, Decay::kSlow, ++seed);
      const Inputs strided = MakeInputs(T, dims.dk, dims.dv, Decay::kSlow, seed, 5, 3);
      std::vector<float> S_compact = RandomState(dims.dk, dims.dv, ++seed);
      std::vector<float> S_strided = S_compact;
      const std::vector<float> out_compact =
          RunChunks(&GatedDeltaRuleChunkImpl, compact, 0, T, S_compact);

      const int64_t out_stride = dims.dv + 7;
      constexpr float kSentinel = 12345.0f;
      std::vector<float> out(T * out_stride, kSentinel);
      GatedDeltaRuleChunkImpl(S_strided.data(), strided.q.data(), strided.k.data(),
                              strided.qk_stride, strided.v.data(), strided.v_stride,
                              strided.g.data(), strided.beta.data(), T, dims.dk, dims.dv,
                              out.data(), out_stride);
      const auto where = [&] {
        return ::testing::Message() << hwy::TargetName(HWY_TARGET) << " dk=" << dims.dk
                                    << " dv=" << dims.dv << " T=" << T;
      };
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(0, std::memcmp(out.data() + t * out_stride, out_compact.data() + t * dims.dv,
                                 dims.dv * sizeof(float)))
            << where() << " t=" << t;
        for (int64_t j = dims.dv; j < out_stride; ++j) {
          ASSERT_EQ(out[t * out_stride + j], kSentinel) << where() << " t=" << t << " j=" << j;
        }
      }
      EXPECT_EQ(0, std::memcmp(S_strided.data(), S_compact.data(), S_compact.size() * 4))
          << where();
    }
  }
}

HWY_NOINLINE void TestExtremeDecays() {
  // Decay 1 with beta 1 and repeated keys (the delta rule then overwrites exactly), and a decay
  // so strong that exp(gamma) underflows to 0 inside the chunk: both must still agree with
  // the recurrence.
  const int64_t dk = 32, dv = 24, T = 64;
  Inputs in = MakeInputs(T, dk, dv, Decay::kNone, 500);
  for (int64_t t = 0; t < T; ++t) {
    in.beta[t] = 1.0f;
    std::copy(in.k_row(t % 3), in.k_row(t % 3) + dk, in.k.data() + t * in.qk_stride);
  }
  for (float strong_g : {0.0f, -40.0f}) {
    for (int64_t t = 0; t < T; t += 5) in.g[t] = strong_g;
    std::vector<float> S_ref = RandomState(dk, dv, 501);
    std::vector<float> S = S_ref;
    const std::vector<float> want = RefSteps(in, 0, T, S_ref);
    const std::vector<float> got = RunChunks(&GatedDeltaRuleChunkImpl, in, 0, T, S);
    EXPECT_LE(RelErr(got, want), kChunkVsStepsTol) << hwy::TargetName(HWY_TARGET) << strong_g;
    EXPECT_LE(RelErr(S, S_ref), kChunkVsStepsTol) << hwy::TargetName(HWY_TARGET) << strong_g;
  }
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(GatedDeltaRuleTargetTest);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestStepMatchesRef);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestChunkMatchesRefChunk);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestChunkMatchesSteps);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestChunkedSequenceMatchesSteps);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestChunkStridesAndBounds);
HWY_EXPORT_AND_TEST_P(GatedDeltaRuleTargetTest, TestExtremeDecays);

namespace {

using namespace gdn_test;  // NOLINT(build/namespaces): test helpers only

TEST(GatedDeltaRuleTest, DispatchedStepMatchesRef) {
  for (const Dims& dims : kStepDims) {
    const int64_t T = 20;
    const Inputs in = MakeInputs(T, dims.dk, dims.dv, Decay::kSlow, 600);
    std::vector<float> S_ref = RandomState(dims.dk, dims.dv, 601);
    std::vector<float> S = S_ref;
    const std::vector<float> want = RefSteps(in, 0, T, S_ref);
    std::vector<float> got(T * dims.dv);
    for (int64_t t = 0; t < T; ++t) {
      GatedDeltaRuleStep(S.data(), in.q_row(t), in.k_row(t), in.v_row(t), in.g[t], in.beta[t],
                         dims.dk, dims.dv, got.data() + t * dims.dv);
    }
    EXPECT_LE(RelErr(got, want), 1e-5) << dims.dk << "x" << dims.dv;
    EXPECT_LE(RelErr(S, S_ref), 1e-5) << dims.dk << "x" << dims.dv;
  }
}

TEST(GatedDeltaRuleTest, DispatchedChunkMatchesSteps) {
  for (Decay decay : kDecays) {
    const int64_t T = 150;
    const Inputs in = MakeInputs(T, 128, 128, decay, 700);
    std::vector<float> S_ref = RandomState(128, 128, 701);
    std::vector<float> S = S_ref;
    const std::vector<float> want = RefSteps(in, 0, T, S_ref);
    const std::vector<float> got = RunChunks(&GatedDeltaRuleChunk, in, 0, T, S);
    EXPECT_LE(RelErr(got, want), 2e-4) << static_cast<int>(decay);
    EXPECT_LE(RelErr(S, S_ref), 2e-4) << static_cast<int>(decay);
  }
}

TEST(GatedDeltaRuleTest, ChunkOnPoolThreadsMatchesSerial) {
  // The chunk's scratch is thread_local: heads run concurrently on the pool's threads (as the
  // layer runs them) must give the same bits as the same heads one after another.
  const int64_t kHeads = 8, T = 64, dk = 128, dv = 128;
  std::vector<Inputs> inputs;
  std::vector<std::vector<float>> serial_S, parallel_S, serial_out, parallel_out(kHeads);
  for (int64_t h = 0; h < kHeads; ++h) {
    inputs.push_back(MakeInputs(T, dk, dv, Decay::kSlow, 800 + h));
    serial_S.push_back(RandomState(dk, dv, 900 + h));
  }
  parallel_S = serial_S;
  for (int64_t h = 0; h < kHeads; ++h) {
    serial_out.push_back(RunChunks(&GatedDeltaRuleChunk, inputs[h], 0, T, serial_S[h]));
  }
  ThreadPool pool(2);
  pool.ParallelFor(kHeads, [&](size_t h, size_t) {
    parallel_out[h] = RunChunks(&GatedDeltaRuleChunk, inputs[h], 0, T, parallel_S[h]);
  });
  for (int64_t h = 0; h < kHeads; ++h) {
    EXPECT_EQ(parallel_out[h], serial_out[h]) << h;
    EXPECT_EQ(parallel_S[h], serial_S[h]) << h;
  }
}

TEST(GatedDeltaRuleTest, EmptyChunkChangesNothing) {
  std::vector<float> S = RandomState(16, 16, 1000);
  const std::vector<float> before = S;
  GatedDeltaRuleChunk(S.data(), nullptr, nullptr, 16, nullptr, 16, nullptr, nullptr, 0, 16, 16,
                      nullptr, 16);
  ref::GatedDeltaRuleChunk(S.data(), nullptr, nullptr, 16, nullptr, 16, nullptr, nullptr, 0, 16, 16,
                           nullptr, 16);
  EXPECT_EQ(S, before);
}

TEST(RefGatedDeltaRuleTest, StepByHand) {
  // dk = 2, dv = 1, S = [[1], [2]], decay e^g = 0.5, beta = 0.5, k = (1, 0), q = (0, 1), v = 3:
  //   S = [[0.5], [1]]; m = 0.5; delta = 0.5 * (3 - 0.5) = 1.25; S = [[1.75], [1]]; out = 1.
  float S[2] = {1.0f, 2.0f};
  const float q[2] = {0.0f, 1.0f}, k[2] = {1.0f, 0.0f}, v[1] = {3.0f};
  float out[1];
  ref::GatedDeltaRuleStep(S, q, k, v, std::log(0.5f), 0.5f, 2, 1, out);
  EXPECT_FLOAT_EQ(S[0], 1.75f);
  EXPECT_FLOAT_EQ(S[1], 1.0f);
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  // out reads the updated S: with q = (1, 0) the step's own write shows up.
  const float q2[2] = {1.0f, 0.0f};
  ref::GatedDeltaRuleStep(S, q2, k, v, 0.0f, 1.0f, 2, 1, out);
  // decay 1, m = 1.75, delta = 1.25, S = [[3], [1]], out = 3.
  EXPECT_FLOAT_EQ(S[0], 3.0f);
  EXPECT_FLOAT_EQ(out[0], 3.0f);
}

TEST(RefGatedDeltaRuleTest, ChunkMatchesSteps) {
  // The literal chunked form (HF's torch_chunk_gated_delta_rule) against the literal recurrence:
  // the two scalar twins are independent transcriptions of the spec, so their agreement checks
  // both.
  for (const Dims& dims : {Dims{128, 128}, Dims{24, 40}, Dims{1, 1}}) {
    for (Decay decay : kDecays) {
      const int64_t T = 150;
      const Inputs in = MakeInputs(T, dims.dk, dims.dv, decay, 1100);
      std::vector<float> S_steps = RandomState(dims.dk, dims.dv, 1101);
      std::vector<float> S_chunks = S_steps;
      const std::vector<float> want = RefSteps(in, 0, T, S_steps);
      const std::vector<float> got = RunChunks(&ref::GatedDeltaRuleChunk, in, 0, T, S_chunks);
      EXPECT_LE(RelErr(got, want), 1e-4) << dims.dk << "x" << dims.dv;
      EXPECT_LE(RelErr(S_chunks, S_steps), 1e-4) << dims.dk << "x" << dims.dv;
    }
  }
}

TEST(RefGatedDeltaRuleTest, SingleTokenChunkIsAStep) {
  // T = 1: A is empty, U = beta v, W = beta k e^g, v_new = beta (v - e^g S^T k) = delta,
  // o = e^g S^T q + (q . k) delta, S = e^g S + k delta -- the recurrence, term for term.
  const Inputs in = MakeInputs(1, 8, 5, Decay::kRealistic, 1200);
  std::vector<float> S_step = RandomState(8, 5, 1201);
  std::vector<float> S_chunk = S_step;
  const std::vector<float> want = RefSteps(in, 0, 1, S_step);
  const std::vector<float> got = RunChunks(&ref::GatedDeltaRuleChunk, in, 0, 1, S_chunk);
  EXPECT_LE(RelErr(got, want), 1e-6);
  EXPECT_LE(RelErr(S_chunk, S_step), 1e-6);
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
