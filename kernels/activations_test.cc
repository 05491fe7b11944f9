// SwiGlu, Silu, MulSigmoid, Axpy and Softmax on every compiled SIMD target against their scalar
// twins (double math); TopK against std::partial_sort with the tie rule; the dispatched entry
// points once.

#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/ref/activations_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's *Impl functions from activations-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activations_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/activations-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Every size up to 300 (all tail lengths of every target, several whole vectors), then sizes of
// real rows: the hidden size 2048, 4096, and an odd size past it.
std::vector<size_t> TestSizes() {
  std::vector<size_t> sizes(300);
  std::iota(sizes.begin(), sizes.end(), size_t{1});
  sizes.insert(sizes.end(), {2048, 4096, 4099});
  return sizes;
}

// Mostly uniform in [-range, range]; about one value in 16 is a large magnitude (+-100, +-1e4,
// +-1e30) that would overflow a naive exp(-x) in f32.
void FillActivationInputs(std::mt19937& rng, float range, float* x, size_t n) {
  std::uniform_real_distribution<float> uniform(-range, range);
  std::uniform_int_distribution<int> pick(0, 15);
  const float large[] = {100.0f, -100.0f, 1e4f, -1e4f, 1e30f, -1e30f};
  for (size_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    x[i] = p < 6 && pick(rng) == 0 ? large[p] : uniform(rng);
  }
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

// Relative tolerance of the sigmoid-based kernels: a few f32 roundings (exp to 1 ulp, add,
// divide, multiplies) against a double reference. The absolute floor only matters for results in
// the f32 subnormal range (e.g. silu(-100) ~ -4e-42), where relative precision is lost in both.
constexpr double kSigmoidRel = 2e-6;
constexpr double kTiny = 1e-30;

HWY_NOINLINE void TestSwiGluMatchesRef() {
  std::mt19937 rng(1);
  for (size_t n : TestSizes()) {
    std::vector<float> gate(n), up(n), got(n), want(n);
    FillActivationInputs(rng, 8.0f, gate.data(), n);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (float& u : up) u = dist(rng);
    SwiGluImpl(gate.data(), up.data(), got.data(), n);
    ref::SwiGlu(gate.data(), up.data(), want.data(), n);
    ExpectClose(got.data(), want.data(), n, kSigmoidRel, kTiny, "SwiGlu");

    // out aliasing gate, then up: the same values as the separate output.
    std::vector<float> in_gate = gate;
    SwiGluImpl(in_gate.data(), up.data(), in_gate.data(), n);
    std::vector<float> in_up = up;
    SwiGluImpl(gate.data(), in_up.data(), in_up.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(in_gate[i], got[i]) << hwy::TargetName(HWY_TARGET) << " n=" << n << " i=" << i;
      ASSERT_EQ(in_up[i], got[i]) << hwy::TargetName(HWY_TARGET) << " n=" << n << " i=" << i;
    }
  }
}

HWY_NOINLINE void TestSiluMatchesRef() {
  std::mt19937 rng(2);
  for (size_t n : TestSizes()) {
    std::vector<float> got(n);
    FillActivationInputs(rng, 8.0f, got.data(), n);
    std::vector<float> want = got;
    SiluImpl(got.data(), n);
    ref::Silu(want.data(), n);
    ExpectClose(got.data(), want.data(), n, kSigmoidRel, kTiny, "Silu");
  }
}

HWY_NOINLINE void TestMulSigmoidMatchesRef() {
  std::mt19937 rng(3);
  for (size_t n : TestSizes()) {
    std::vector<float> gate(n), got(n);
    FillActivationInputs(rng, 8.0f, gate.data(), n);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (float& v : got) v = dist(rng);
    std::vector<float> want = got;
    MulSigmoidImpl(got.data(), gate.data(), n);
    ref::MulSigmoid(want.data(), gate.data(), n);
    ExpectClose(got.data(), want.data(), n, kSigmoidRel, kTiny, "MulSigmoid");
  }
}

HWY_NOINLINE void TestSigmoidExtremes() {
  // MulSigmoid of ones is sigmoid(gate) itself.
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> gate = {0.0f,   -0.0f,   100.0f, -100.0f, 1e4f, -1e4f, 88.0f, -88.0f,
                                   104.0f, -104.0f, max,    -max,    kInf, -kInf, 20.0f, -20.0f};
  const size_t n = gate.size();
  std::vector<float> s(n, 1.0f);
  MulSigmoidImpl(s.data(), gate.data(), n);
  std::vector<float> silu = gate;
  SiluImpl(silu.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const std::string where =
        std::string(hwy::TargetName(HWY_TARGET)) + " gate=" + std::to_string(gate[i]);
    EXPECT_TRUE(s[i] >= 0.0f && s[i] <= 1.0f) << where << " sigmoid=" << s[i];
    // silu(+-inf) is inf * 1 and -inf * 0 (NaN), as in torch; every finite input is finite.
    if (std::isfinite(gate[i])) {
      EXPECT_TRUE(std::isfinite(silu[i])) << where;
    }
    // sigmoid(x) + sigmoid(-x) = 1: the two branches of the robust formula agree.
    if (i % 2 == 0) {
      EXPECT_NEAR(s[i] + s[i + 1], 1.0f, 1e-7f) << where;
    }
  }
  EXPECT_EQ(s[0], 0.5f);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_GT(s[3], 0.0f);  // e^-100 ~ 3.7e-44 is a (subnormal) f32, not a flushed 0
  EXPECT_LT(s[3], 1e-40f);
  EXPECT_EQ(s[5], 0.0f);
  EXPECT_EQ(s[12], 1.0f);
  EXPECT_EQ(s[13], 0.0f);
  EXPECT_EQ(silu[4], 1e4f);
  EXPECT_EQ(silu[5], 0.0f);
}

HWY_NOINLINE void TestAxpyMatchesRef() {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (size_t n : TestSizes()) {
    const float a = dist(rng);
    std::vector<float> x(n), got(n);
    for (float& v : x) v = dist(rng);
    for (float& v : got) v = dist(rng);
    std::vector<float> want = got;
    const std::vector<float> y = got;
    AxpyImpl(a, x.data(), got.data(), n);
    ref::Axpy(a, x.data(), want.data(), n);
    // One multiply-add (fused on targets with FMA, two roundings elsewhere) against a double
    // reference: within an ulp or so of the terms' magnitude; the sum itself may cancel to near 0.
    for (size_t i = 0; i < n; ++i) {
      const double scale = std::fabs(static_cast<double>(a) * x[i]) + std::fabs(y[i]);
      ASSERT_NEAR(got[i], want[i], 1e-6 * scale + kTiny)
          << hwy::TargetName(HWY_TARGET) << " n=" << n << " i=" << i;
    }
    // x aliasing y: y += a * y.
    std::vector<float> self = x;
    std::vector<float> self_ref = x;
    AxpyImpl(a, self.data(), self.data(), n);
    ref::Axpy(a, self_ref.data(), self_ref.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double scale = std::fabs(static_cast<double>(a) * x[i]) + std::fabs(x[i]);
      ASSERT_NEAR(self[i], self_ref[i], 1e-6 * scale + kTiny)
          << hwy::TargetName(HWY_TARGET) << " aliased n=" << n << " i=" << i;
    }
  }
}

// Softmax probabilities are compared in absolute terms: every one is in [0, 1].
constexpr double kProbAbs = 2e-6;

void ExpectSoftmaxMatchesRef(std::vector<float> x, const std::string& what) {
  const size_t n = x.size();
  std::vector<float> want = x;
  ref::Softmax(want.data(), static_cast<int64_t>(n));
  SoftmaxImpl(x.data(), n);
  ExpectClose(x.data(), want.data(), n, 0.0, kProbAbs, what);
  double sum = 0.0;
  for (float p : x) {
    ASSERT_TRUE(p >= 0.0f && p <= 1.0f) << what << " " << hwy::TargetName(HWY_TARGET) << " " << p;
    sum += p;
  }
  EXPECT_NEAR(sum, 1.0, 1e-5) << what << " " << hwy::TargetName(HWY_TARGET) << " n=" << n;
}

HWY_NOINLINE void TestSoftmaxMatchesRef() {
  std::mt19937 rng(5);
  for (float range : {1.0f, 10.0f, 100.0f, 1e4f, 1e30f}) {
    std::uniform_real_distribution<float> dist(-range, range);
    for (size_t n : TestSizes()) {
      std::vector<float> x(n);
      for (float& v : x) v = dist(rng);
      ExpectSoftmaxMatchesRef(x, "Softmax range=" + std::to_string(range));
    }
  }
}

HWY_NOINLINE void TestSoftmaxMasked() {
  // About a third of the entries masked with -inf (causal masks, padded experts); they must come
  // out exactly 0, the rest must match the reference.
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
  std::uniform_int_distribution<int> third(0, 2);
  for (size_t n : TestSizes()) {
    std::vector<float> x(n);
    for (float& v : x) v = third(rng) == 0 ? -kInf : dist(rng);
    x[std::uniform_int_distribution<size_t>(0, n - 1)(rng)] = dist(rng);  // one finite entry
    std::vector<float> got = x;
    SoftmaxImpl(got.data(), n);
    for (size_t i = 0; i < n; ++i) {
      if (x[i] == -kInf) {
        ASSERT_EQ(got[i], 0.0f) << hwy::TargetName(HWY_TARGET) << " i=" << i;
      }
    }
    ExpectSoftmaxMatchesRef(x, "Softmax masked");
  }
  // Only one finite entry, anywhere: it gets everything.
  for (size_t n : {1, 2, 7, 16, 17, 33}) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> x(n, -kInf);
      x[at] = -3.0f;
      SoftmaxImpl(x.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(x[i], i == at ? 1.0f : 0.0f) << hwy::TargetName(HWY_TARGET) << " n=" << n;
      }
    }
  }
}

HWY_NOINLINE void TestSoftmaxSpecialCases() {
  // n = 1 is exactly 1 whatever the value.
  for (float v : {0.0f, -1e30f, 1e30f, 3.5f}) {
    float x = v;
    SoftmaxImpl(&x, 1);
    EXPECT_EQ(x, 1.0f) << hwy::TargetName(HWY_TARGET) << " v=" << v;
  }
  // Equal values give 1/n each.
  for (size_t n : {2, 3, 8, 15, 16, 100, 4096}) {
    std::vector<float> x(n, 7.25f);
    SoftmaxImpl(x.data(), n);
    for (float p : x) ASSERT_NEAR(p, 1.0 / n, 1e-7) << hwy::TargetName(HWY_TARGET) << " n=" << n;
  }
  // +-FLT_MAX: x - max overflows to -inf for the small one, which still gives 0.
  const float max = std::numeric_limits<float>::max();
  std::vector<float> x = {-max, max, 0.0f};
  SoftmaxImpl(x.data(), x.size());
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[2], 0.0f);
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(ActivationsTargetTest);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSwiGluMatchesRef);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSiluMatchesRef);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestMulSigmoidMatchesRef);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSigmoidExtremes);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestAxpyMatchesRef);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSoftmaxMatchesRef);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSoftmaxMasked);
HWY_EXPORT_AND_TEST_P(ActivationsTargetTest, TestSoftmaxSpecialCases);

namespace {

// The public entry points, on whatever target the machine picks, against the references.
TEST(ActivationsDispatchTest, MatchesReference) {
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> dist(-6.0f, 6.0f);
  for (int64_t n : {0, 1, 31, 512, 1000}) {
    std::vector<float> a(n), b(n), got(n), want(n);
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    auto expect_close = [&](const char* what, double abs) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-6 * std::fabs(want[i]) + abs) << what << " i=" << i;
      }
    };
    SwiGlu(a.data(), b.data(), got.data(), n);
    ref::SwiGlu(a.data(), b.data(), want.data(), n);
    expect_close("SwiGlu", 1e-30);
    got = a;
    want = a;
    Silu(got.data(), n);
    ref::Silu(want.data(), n);
    expect_close("Silu", 1e-30);
    got = a;
    want = a;
    MulSigmoid(got.data(), b.data(), n);
    ref::MulSigmoid(want.data(), b.data(), n);
    expect_close("MulSigmoid", 1e-30);
    got = b;
    want = b;
    Axpy(0.5f, a.data(), got.data(), n);
    ref::Axpy(0.5f, a.data(), want.data(), n);
    expect_close("Axpy", 1e-5);
    got = a;
    want = a;
    Softmax(got.data(), n);
    ref::Softmax(want.data(), n);
    expect_close("Softmax", 2e-6);
  }
}

// The independent definition of TopK's result: sort by (value descending, NaN last, index
// ascending) and keep k.
void PartialSortTopK(const std::vector<float>& x, int64_t k, std::vector<int32_t>* indices,
                     std::vector<float>* values) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    const bool a_nan = std::isnan(x[a]);
    const bool b_nan = std::isnan(x[b]);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && x[a] != x[b]) return x[a] > x[b];
    return a < b;
  });
  indices->assign(order.begin(), order.begin() + k);
  values->resize(k);
  for (int64_t i = 0; i < k; ++i) (*values)[i] = x[order[i]];
}

// TopK and ref::TopK both equal the partial_sort definition (values compared bitwise, so NaN
// and -0.0 count too).
void ExpectTopKMatches(const std::vector<float>& x, int64_t k, const std::string& what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<int32_t> want_idx;
  std::vector<float> want_val;
  PartialSortTopK(x, k, &want_idx, &want_val);
  std::vector<int32_t> idx(k, -1), ref_idx(k, -1);
  std::vector<float> val(k), ref_val(k);
  TopK(x.data(), n, k, idx.data(), val.data());
  ref::TopK(x.data(), n, k, ref_idx.data(), ref_val.data());
  EXPECT_EQ(idx, want_idx) << what << " n=" << n << " k=" << k;
  EXPECT_EQ(ref_idx, want_idx) << what << " (ref) n=" << n << " k=" << k;
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_EQ(std::memcmp(&val[i], &want_val[i], sizeof(float)), 0) << what << " i=" << i;
    ASSERT_EQ(std::memcmp(&ref_val[i], &want_val[i], sizeof(float)), 0) << what << " i=" << i;
  }
}

TEST(TopKTest, RandomMatchesPartialSort) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> real(-5.0f, 5.0f);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 600)(rng);
    std::vector<float> x(n);
    const bool ties = trial % 2 == 0;
    for (float& v : x) v = ties ? static_cast<float>(small(rng)) : real(rng);
    for (int64_t k : {int64_t{1}, std::min<int64_t>(n, 8), std::min<int64_t>(n, 10),
                      std::uniform_int_distribution<int64_t>(1, n)(rng), n}) {
      ExpectTopKMatches(x, k, ties ? "ties" : "real");
    }
  }
  // The router's shape: 512 experts, top 10; ascending input (every entry is inserted), and
  // descending (none after the first k).
  std::vector<float> up(512);
  std::iota(up.begin(), up.end(), 0.0f);
  ExpectTopKMatches(up, 10, "ascending");
  std::vector<float> down(up.rbegin(), up.rend());
  ExpectTopKMatches(down, 10, "descending");
}

TEST(TopKTest, TiesKeepIndexOrder) {
  for (int64_t n : {1, 2, 10, 512}) {
    std::vector<float> x(n, 0.25f);
    for (int64_t k : {int64_t{1}, std::min<int64_t>(n, 4), n}) {
      std::vector<int32_t> idx(k);
      std::vector<float> val(k);
      TopK(x.data(), n, k, idx.data(), val.data());
      for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(idx[i], i) << "n=" << n << " k=" << k;
        EXPECT_EQ(val[i], 0.25f);
      }
    }
  }
  // Ties at the cut: of the three 2s, the two lowest indices make it.
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 2.0f, 0.0f, 2.0f};
  int32_t idx[3];
  float val[3];
  TopK(x.data(), 6, 3, idx, val);
  EXPECT_EQ(idx[0], 2);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(idx[2], 3);
  EXPECT_EQ(val[0], 3.0f);
  EXPECT_EQ(val[1], 2.0f);
  EXPECT_EQ(val[2], 2.0f);
}

TEST(TopKTest, InfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {nan, -inf, 1.0f, inf, nan, -0.0f, 0.0f, -inf, 5.0f};
  for (int64_t k = 1; k <= static_cast<int64_t>(x.size()); ++k) ExpectTopKMatches(x, k, "inf/nan");
  // NaN only when nothing else is left.
  int32_t idx[9];
  float val[9];
  TopK(x.data(), 9, 9, idx, val);
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 8);
  EXPECT_EQ(idx[7], 0);
  EXPECT_EQ(idx[8], 4);
}

TEST(TopKTest, ZeroK) {
  const float x[] = {1.0f, 2.0f};
  int32_t idx[1] = {-7};
  float val[1] = {-7.0f};
  TopK(x, 2, 0, idx, val);
  EXPECT_EQ(idx[0], -7);  // nothing written
  EXPECT_EQ(val[0], -7.0f);
}

TEST(TopKDeathTest, BadArguments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const float x[] = {1.0f, 2.0f, 3.0f};
  int32_t idx[4];
  float val[4];
  EXPECT_DEATH(TopK(x, 3, 4, idx, val), "CHECK failed: \\(k\\) <= \\(n\\)");
  EXPECT_DEATH(TopK(x, 3, -1, idx, val), "CHECK failed: \\(k\\) >= \\(0\\)");
  EXPECT_DEATH(Softmax(val, -1), "CHECK failed: \\(n\\) >= \\(0\\)");
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
