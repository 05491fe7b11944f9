// MatMul against GGML block-format weights (kernels/matmul_ggml.h) on every compiled SIMD target:
// f32 activations against the double-precision reference of the dequantized rows, int8
// activations bit for bit against the scalar twin, the int8 mode's error within the bound its
// activation quantization allows, batch invariance (M, the row's place in the batch, n ranges,
// threads), bounds, strides, MatMulGroup, and the argument checks.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "hwy/tests/hwy_gtest.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "kernels/ref/ggml_blocks_ref.h"
#include "kernels/ref/matmul_ref.h"

namespace moeserve::kernels {
namespace ggml_matmul_test {

constexpr float kYSentinel = -12345.0f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using Mode = GgmlActivations;

constexpr DType kGgmlDTypes[] = {DType::kGgmlQ8_0, DType::kGgmlQ4_0, DType::kGgmlQ4_K,
                                 DType::kGgmlQ6_K, DType::kGgmlQ5_K, DType::kGgmlQ5_0,
                                 DType::kGgmlQ4_1, DType::kGgmlQ5_1};

// Offsets of a block's f16 fields (scales, mins): set to sane values in random blocks.
std::vector<size_t> HalfFields(DType dtype) {
  switch (dtype) {
    case DType::kGgmlQ6_K: return {208};
    case DType::kGgmlQ4_1:
    case DType::kGgmlQ5_1:
    case DType::kGgmlQ4_K:
    case DType::kGgmlQ5_K: return {0, 2};
    default: return {0};
  }
}

// W [N, K] of `dtype` in a buffer of exactly its bytes, followed by `pad_blocks` blocks of 0xff
// bytes (every f16 field NaN), so that reading past the last row is out of bounds for
// AddressSanitizer (no pad) or turns results into NaN (pad). Rows are ggml's reference
// quantization of values in [-1, 1] (`raw` false), or random bytes with random f16 fields of
// moderate size (every code and scale pattern: q = -128, Q6_K scales of -128, ...).
class GgmlWeights {
 public:
  GgmlWeights(DType dtype, int64_t N, int64_t K, uint32_t seed, bool raw, int64_t pad_blocks = 0)
      : dtype_(dtype), N_(N), K_(K) {
    std::mt19937 rng(seed);
    const size_t row = StoredRowBytes(dtype, K);
    bytes_.assign(static_cast<size_t>(N) * row + pad_blocks * GgmlBlockBytes(dtype),
                  std::byte{0xff});
    if (raw) {
      std::uniform_int_distribution<int> byte(0, 255);
      std::uniform_real_distribution<float> magnitude(0.002f, 0.05f);
      const size_t blocks = static_cast<size_t>(N) * row / GgmlBlockBytes(dtype);
      for (size_t i = 0; i < static_cast<size_t>(N) * row; ++i) {
        bytes_[i] = static_cast<std::byte>(byte(rng));
      }
      for (size_t b = 0; b < blocks; ++b) {
        std::byte* block = bytes_.data() + b * GgmlBlockBytes(dtype);
        for (size_t at : HalfFields(dtype)) {
          const float sign = byte(rng) % 2 == 0 ? 1.0f : -1.0f;
          const uint16_t h = F32ToF16(sign * magnitude(rng));
          std::memcpy(block + at, &h, sizeof(h));
        }
      }
    } else {
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> values(static_cast<size_t>(K));
      for (int64_t n = 0; n < N; ++n) {
        for (float& v : values) v = dist(rng);
        ref::QuantizeGgmlRowRef(dtype, values.data(), bytes_.data() + n * row, K);
      }
    }
  }
  Tensor view() { return Tensor(bytes_.data(), dtype_, {N_, K_}); }

 private:
  DType dtype_;
  int64_t N_, K_;
  std::vector<std::byte> bytes_;
};

// M rows of K values in [-1, 1] (normal with an outlier in every 3rd row), row m at m * x_stride;
// gaps and `pad` trailing elements hold NaN.
std::vector<float> MakeX(int64_t M, int64_t K, int64_t x_stride, uint32_t seed, int64_t pad = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t size = M == 0 ? pad : (M - 1) * x_stride + K + pad;
  std::vector<float> x(static_cast<size_t>(size), kNaN);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) x[m * x_stride + k] = dist(rng);
    if (m % 3 == 2) x[m * x_stride + (m * 7) % K] = 30.0f;
  }
  return x;
}

std::vector<float> MakeY(int64_t M, int64_t N, int64_t y_stride, int64_t pad = 0) {
  const int64_t size = M == 0 ? pad : (M - 1) * y_stride + N + pad;
  return std::vector<float>(static_cast<size_t>(size), kYSentinel);
}

std::vector<float> Dequantized(const Tensor& W) {
  const int64_t N = W.dim(0), K = W.dim(1);
  std::vector<float> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    ref::DequantizeGgmlRowRef(W.dtype(),
                              W.data_as<const std::byte>() + n * StoredRowBytes(W.dtype(), K),
                              out.data() + n * K, K);
  }
  return out;
}

std::string Describe(DType dtype, Mode mode, int64_t M, int64_t N, int64_t K) {
  return std::string(DTypeName(dtype)) + (mode == Mode::kInt8 ? " int8" : " f32") +
         " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// y (M rows of N at y_stride) against ref::MatMul: kInt8 bit for bit; kF32 within 1e-5 *
// sum_k |x w| (any f32 order's rounding). Every element outside the outputs must still hold
// kYSentinel.
void ExpectMatchesReference(const std::vector<float>& y, int64_t y_stride, const float* x,
                            int64_t x_stride, int64_t M, const Tensor& W, Mode mode,
                            const std::string& what) {
  const int64_t N = W.dim(0), K = W.dim(1);
  std::vector<float> want(static_cast<size_t>(M * N));
  ref::MatMul(x, x_stride, M, W, want.data(), N, mode);
  const std::vector<float> w = Dequantized(W);
  int failures = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float got = y[m * y_stride + n], ref = want[m * N + n];
      if (mode == Mode::kInt8) {
        if (std::memcmp(&got, &ref, sizeof(float)) != 0 && ++failures <= 5) {
          ADD_FAILURE() << what << " m=" << m << " n=" << n << ": got " << got << ", want " << ref
                        << " (bit for bit)";
        }
        continue;
      }
      double abs_dot = 0.0;
      for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(double{x[m * x_stride + k]} * w[n * K + k]);
      const double tol = 1e-5 * abs_dot + 1e-30;
      if (!(std::fabs(double{got} - ref) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << what << " m=" << m << " n=" << n << ": got " << got << ", want " << ref
                      << " (tolerance " << tol << ")";
      }
    }
  }
  std::vector<bool> is_output(y.size(), false);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) is_output[m * y_stride + n] = true;
  }
  for (size_t i = 0; i < y.size(); ++i) {
    if (!is_output[i] && y[i] != kYSentinel && ++failures <= 5) {
      ADD_FAILURE() << what << ": wrote y[" << i << "] outside the outputs";
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

bool Identical(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// K values to test for a format: several multiples of its block (the K-quants' 256; the others'
// 32, including ones that are not multiples of 256 and a partial group of 8 blocks).
std::vector<int64_t> Ks(DType dtype) {
  if (GgmlBlockWeights(dtype) == 256) return {256, 512, 768, 2048, 2304};
  return {32, 64, 96, 224, 256, 288, 768};
}

}  // namespace ggml_matmul_test

// Per-target tests: each runs once per compiled target the CPU runs, with the dispatch
// restricted to it (hwy::TestWithParamTarget), through the public entry points.
namespace ggml_matmul_target_test {

using namespace ggml_matmul_test;  // NOLINT: the test's own helpers

std::string Where(DType dtype, Mode mode, int64_t M, int64_t N, int64_t K) {
  return ActiveIsa() + " " + Describe(dtype, mode, M, N, K);
}

void TestMatchesReference() {
  uint32_t seed = 11;
  for (DType dtype : kGgmlDTypes) {
    for (int64_t K : Ks(dtype)) {
      for (int64_t N : {1, 3, 8, 9, 20}) {
        ++seed;
        GgmlWeights w(dtype, N, K, seed, /*raw=*/seed % 2 == 0);
        const Tensor W = w.view();
        for (int64_t M : {1, 2, 3, 4, 5, 6, 8, 13, 37}) {
          // Every other case has padded rows: x and y strides wider than K and N.
          const bool strided = (M + N) % 2 == 0;
          const int64_t x_stride = strided ? K + 5 : K, y_stride = strided ? N + 3 : N;
          const std::vector<float> x = MakeX(M, K, x_stride, seed + 1000 + M, /*pad=*/16);
          for (Mode mode : {Mode::kF32, Mode::kInt8}) {
            std::vector<float> y = MakeY(M, N, y_stride, /*pad=*/16);
            MatMulRange(x.data(), x_stride, M, W, 0, N, y.data(), y_stride, mode);
            ExpectMatchesReference(y, y_stride, x.data(), x_stride, M, W, mode,
                                   Where(dtype, mode, M, N, K));
          }
        }
      }
    }
  }
}

// Each of the rows of `full` (y of x [M, K] against W) equals, bit for bit, that row computed
// alone, in sub-batches at every offset, and with n split in two ranges anywhere.
void TestBatchInvariance() {
  constexpr int64_t kM = 37, kN = 19;
  uint32_t seed = 500;
  for (DType dtype : kGgmlDTypes) {
    for (int64_t K : {GgmlBlockWeights(dtype), 3 * GgmlBlockWeights(dtype), int64_t{2048}}) {
      ++seed;
      GgmlWeights w(dtype, kN, K, seed, /*raw=*/true);
      const Tensor W = w.view();
      const std::vector<float> x = MakeX(kM, K, K, seed + 1);
      for (Mode mode : {Mode::kF32, Mode::kInt8}) {
        const std::string where = Where(dtype, mode, kM, kN, K);
        std::vector<float> full = MakeY(kM, kN, kN);
        MatMulRange(x.data(), K, kM, W, 0, kN, full.data(), kN, mode);
        for (int64_t m = 0; m < kM; ++m) {
          std::vector<float> one(kN);
          MatMulRange(x.data() + m * K, K, 1, W, 0, kN, one.data(), kN, mode);
          EXPECT_TRUE(Identical(one.data(), full.data() + m * kN, kN)) << where << " m=" << m;
        }
        // Every pass length of every tile shape (AVX2's int8 tiles take up to 8 x rows a pass).
        for (int64_t batch : {2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 14, 15, 36}) {
          for (int64_t m0 = 0; m0 + batch <= kM; m0 += 7) {
            std::vector<float> part(batch * kN);
            MatMulRange(x.data() + m0 * K, K, batch, W, 0, kN, part.data(), kN, mode);
            EXPECT_TRUE(Identical(part.data(), full.data() + m0 * kN, batch * kN))
                << where << " batch=" << batch << " m0=" << m0;
          }
        }
        for (int64_t split : {0, 1, 3, 5, 8, 11, 18, 19}) {
          std::vector<float> y = MakeY(kM, kN, kN);
          MatMulRange(x.data(), K, kM, W, 0, split, y.data(), kN, mode);
          MatMulRange(x.data(), K, kM, W, split, kN, y.data(), kN, mode);
          EXPECT_TRUE(Identical(y.data(), full.data(), kM * kN)) << where << " split=" << split;
        }
      }
    }
  }
}

// Exact-size weights (AddressSanitizer sees a read past the last row) and weights followed by a
// block of NaN scales (a read past it makes NaN), every small N and M.
void TestStaysInBounds() {
  uint32_t seed = 900;
  for (DType dtype : kGgmlDTypes) {
    const int64_t K = GgmlBlockWeights(dtype);
    for (int64_t N : {1, 2, 3, 5, 8, 9}) {
      for (int64_t M : {1, 2, 3, 4, 5, 7}) {
        for (int64_t pad : {0, 1}) {
          ++seed;
          GgmlWeights w(dtype, N, K, seed, /*raw=*/false, pad);
          const std::vector<float> x = MakeX(M, K, K, seed + 1, 16 * pad);
          for (Mode mode : {Mode::kF32, Mode::kInt8}) {
            std::vector<float> y = MakeY(M, N, N, 16 * pad);
            MatMulRange(x.data(), K, M, w.view(), 0, N, y.data(), N, mode);
            ExpectMatchesReference(y, N, x.data(), K, M, w.view(), mode,
                                   Where(dtype, mode, M, N, K) + " pad=" + std::to_string(pad));
            for (int64_t i = 0; i < M * N; ++i) {
              EXPECT_FALSE(std::isnan(y[i / N * N + i % N])) << Where(dtype, mode, M, N, K);
            }
          }
        }
      }
    }
  }
}

// int8 activations: the special rows (zeros, tiny values quantized to 0, an Inf, a NaN, values
// on rounding ties) per activation block, bit for bit against the twin, with NaN where float
// arithmetic gives NaN and 0 for rows of zeros.
void TestInt8SpecialRows() {
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : kGgmlDTypes) {
    const int64_t K = 2 * std::max<int64_t>(GgmlBlockWeights(dtype), 128), M = 6, N = 9;
    const int64_t B = GgmlBlockWeights(dtype);
    std::vector<float> x(M * K);
    for (float& v : x) v = normal(rng);
    std::fill(x.begin() + 1 * K, x.begin() + 2 * K, 0.0f);                  // row 1: zeros
    for (int64_t k = 0; k < K; ++k) x[2 * K + k] *= 1e-32f;                 // row 2: tiny
    x[3 * K + K - 1] = std::numeric_limits<float>::infinity();             // row 3: Inf
    x[4 * K + 3] = kNaN;                                                    // row 4: NaN
    // Row 5: halves against a block maximum of 127, so x * 127 / 127 lies on rounding ties.
    for (int64_t k = 0; k < K; ++k) x[5 * K + k] = static_cast<float>(k % B % 50) - 24.5f;
    for (int64_t b = 0; b < K / B; ++b) x[5 * K + b * B] = 127.0f;
    GgmlWeights w(dtype, N, K, 78, /*raw=*/true);
    std::vector<float> y(M * N);
    MatMulRange(x.data(), K, M, w.view(), 0, N, y.data(), N, Mode::kInt8);
    ExpectMatchesReference(y, N, x.data(), K, M, w.view(), Mode::kInt8,
                           Where(dtype, Mode::kInt8, M, N, K));
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(y[1 * N + n], 0.0f) << Where(dtype, Mode::kInt8, M, N, K);
      EXPECT_EQ(y[2 * N + n], 0.0f) << Where(dtype, Mode::kInt8, M, N, K);
      EXPECT_TRUE(std::isnan(y[3 * N + n]) && std::isnan(y[4 * N + n]))
          << Where(dtype, Mode::kInt8, M, N, K);
    }
  }
}

}  // namespace ggml_matmul_target_test

class GgmlMatMulTargetTest : public hwy::TestWithParamTarget {
 protected:
  void SetUp() override {
    hwy::TestWithParamTarget::SetUp();
    std::string name = hwy::TargetName(GetParam());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    ASSERT_EQ(ActiveIsa(), name);
  }
};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(GgmlMatMulTargetTest);
TEST_P(GgmlMatMulTargetTest, MatchesReference) {
  ggml_matmul_target_test::TestMatchesReference();
}
TEST_P(GgmlMatMulTargetTest, BatchInvariance) { ggml_matmul_target_test::TestBatchInvariance(); }
TEST_P(GgmlMatMulTargetTest, StaysInBounds) { ggml_matmul_target_test::TestStaysInBounds(); }
TEST_P(GgmlMatMulTargetTest, Int8SpecialRows) { ggml_matmul_target_test::TestInt8SpecialRows(); }

namespace {

using namespace ggml_matmul_test;  // NOLINT: the test's own helpers

TEST(GgmlMatMulTest, Int8ErrorWithinItsActivationQuantization) {
  // int8 activations differ from f32 ones only by p's rounding: |x - a p| <= a / 2 per value, so
  // |y_int8 - y_f32| <= sum_b (a_b / 2) sum_{k in b} |w_k| plus f32 rounding. This ties the twin's
  // reading of every layout (ref::MatMul kInt8, one weight at a time) to DequantizeGgmlRowRef's,
  // which an independent numpy definition checks (ggml_blocks_test).
  uint32_t seed = 1200;
  for (DType dtype : kGgmlDTypes) {
    const int64_t K = 1024, N = 24, M = 5, B = GgmlBlockWeights(dtype);
    GgmlWeights w(dtype, N, K, ++seed, /*raw=*/true);
    const Tensor W = w.view();
    const std::vector<float> x = MakeX(M, K, K, seed + 1);
    std::vector<float> y8(M * N), yf(M * N);
    ThreadPool pool(2);
    MatMul(x.data(), K, M, W, y8.data(), N, pool, Mode::kInt8);
    ref::MatMul(x.data(), K, M, W, yf.data(), N, Mode::kF32);
    const std::vector<float> wf = Dequantized(W);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double bound = 0.0, abs_dot = 0.0;
        for (int64_t b = 0; b < K / B; ++b) {
          double amax = 0.0, wsum = 0.0;
          for (int64_t k = b * B; k < (b + 1) * B; ++k) {
            amax = std::max(amax, std::fabs(double{x[m * K + k]}));
            wsum += std::fabs(double{wf[n * K + k]});
            abs_dot += std::fabs(double{x[m * K + k]} * wf[n * K + k]);
          }
          bound += amax / 127.0 / 2.0 * wsum;
        }
        const double tol = bound * 1.0001 + 1e-5 * abs_dot + 1e-30;
        EXPECT_LE(std::fabs(double{y8[m * N + n]} - yf[m * N + n]), tol)
            << Describe(dtype, Mode::kInt8, M, N, K) << " m=" << m << " n=" << n;
        // And, for rows without an outlier (MakeX puts a 30 in every third), the bound is far
        // below the output's scale: the mode is usable.
        if (m % 3 != 2) {
          EXPECT_LT(bound, 0.02 * abs_dot) << DTypeName(dtype) << " m=" << m;
        }
      }
    }
  }
}

TEST(GgmlMatMulTest, BitIdenticalAcrossThreadCounts) {
  constexpr int64_t kM = 9;
  uint32_t seed = 3000;
  for (DType dtype : kGgmlDTypes) {
    for (int64_t N : {1, 7, 64, 133}) {
      const int64_t K = GgmlBlockWeights(dtype) == 256 ? 512 : 160;
      GgmlWeights w(dtype, N, K, ++seed, /*raw=*/true);
      const Tensor W = w.view();
      const std::vector<float> x = MakeX(kM, K, K, seed + 1);
      for (Mode mode : {Mode::kF32, Mode::kInt8}) {
        const std::string where = Describe(dtype, mode, kM, N, K);
        std::vector<float> base(kM * N);
        {
          ThreadPool pool(1);
          MatMul(x.data(), K, kM, W, base.data(), N, pool, mode);
        }
        ExpectMatchesReference(base, N, x.data(), K, kM, W, mode, where);
        for (size_t threads : {2, 3, 4}) {
          ThreadPool pool(threads);
          std::vector<float> y(base.size());
          MatMul(x.data(), K, kM, W, y.data(), N, pool, mode);
          EXPECT_TRUE(Identical(y.data(), base.data(), kM * N)) << where << " threads=" << threads;
          std::vector<float> one(N);
          MatMul(x.data() + 4 * K, K, 1, W, one.data(), N, pool, mode);
          EXPECT_TRUE(Identical(one.data(), base.data() + 4 * N, N)) << where;
        }
      }
    }
  }
}

TEST(GgmlMatMulTest, ViewsOfAStackedTensor) {
  // Experts [E, N, K] of one GGUF tensor, each viewed in place (Reshape, Slice), as the loader
  // will: each expert's product equals that of its own copy.
  constexpr int64_t kE = 3, kN = 16, kK = 512;
  GgmlWeights all(DType::kGgmlQ4_K, kE * kN, kK, 41, /*raw=*/true);
  const Tensor stacked = all.view().Reshape({kE, kN, kK});
  const std::vector<float> x = MakeX(2, kK, kK, 42);
  ThreadPool pool(2);
  for (int64_t e = 0; e < kE; ++e) {
    const Tensor expert = stacked.Slice(0, e, e + 1).Reshape({kN, kK});
    const size_t bytes = expert.bytes();
    std::vector<std::byte> copy(expert.data_as<const std::byte>(),
                                expert.data_as<const std::byte>() + bytes);
    const Tensor own(copy.data(), DType::kGgmlQ4_K, {kN, kK});
    for (Mode mode : {Mode::kF32, Mode::kInt8}) {
      std::vector<float> a(2 * kN), b(2 * kN);
      MatMul(x.data(), kK, 2, expert, a.data(), kN, pool, mode);
      MatMul(x.data(), kK, 2, own, b.data(), kN, pool, mode);
      EXPECT_TRUE(Identical(a.data(), b.data(), 2 * kN)) << "expert " << e;
    }
  }
}

TEST(GgmlMatMulTest, GroupMatchesSeparateCallsBitForBit) {
  // A step's experts: GGML jobs of both modes and several formats, some sharing x (an expert's
  // gate and up: quantized once), mixed with a bf16 and a w8a8 job.
  ThreadPool pool(2);
  struct Shape {
    int64_t N, K, M;
    DType dtype;
    Mode mode;
  };
  const Shape shapes[] = {{48, 512, 3, DType::kGgmlQ4_K, Mode::kInt8},
                          {48, 512, 3, DType::kGgmlQ6_K, Mode::kInt8},
                          {40, 512, 1, DType::kGgmlQ4_K, Mode::kF32},
                          {17, 256, 0, DType::kGgmlQ6_K, Mode::kInt8},
                          {64, 96, 5, DType::kGgmlQ8_0, Mode::kInt8},
                          {64, 96, 5, DType::kGgmlQ4_0, Mode::kInt8},
                          {33, 160, 2, DType::kGgmlQ5_1, Mode::kF32},
                          {512, 768, 9, DType::kGgmlQ5_K, Mode::kInt8},
                          {16, 64, 4, DType::kQ8A8, Mode::kF32},
                          {16, 64, 4, DType::kBF16, Mode::kF32}};
  std::vector<GgmlWeights*> ggml;
  std::vector<OwnedTensor> plain;
  std::vector<Tensor> Ws;
  std::vector<std::vector<float>> xs, group_ys, single_ys;
  uint32_t seed = 60;
  for (const Shape& s : shapes) {
    ++seed;
    if (IsGgmlBlockDType(s.dtype)) {
      ggml.push_back(new GgmlWeights(s.dtype, s.N, s.K, seed, true));
      Ws.push_back(ggml.back()->view());
    } else {
      plain.emplace_back(s.dtype, std::initializer_list<int64_t>{s.N, s.K});
      std::vector<float> row(s.K, 0.25f);
      if (IsPackedDType(s.dtype)) {
        for (int64_t n = 0; n < s.N; ++n) QuantizeRow(row.data(), plain.back().view(), n);
      }
      Ws.push_back(plain.back().view());
    }
    xs.push_back(MakeX(s.M, s.K, s.K, seed + 100));
    group_ys.emplace_back(s.M * s.N, -1.0f);
    single_ys.emplace_back(s.M * s.N, -2.0f);
  }
  xs[1] = xs[0];  // the same values at another address
  std::vector<MatMulJob> jobs;
  for (size_t j = 0; j < Ws.size(); ++j) {
    const Shape& s = shapes[j];
    jobs.push_back({xs[j].data(), s.K, s.M, &Ws[j], group_ys[j].data(), s.N, s.mode});
  }
  // Jobs on the very same x: Q4_K then Q6_K (both blocks of 256: shared rows), then Q8_0 rows.
  std::vector<float> shared_q6(3 * 48, -3.0f);
  jobs.push_back({xs[0].data(), 512, 3, &Ws[1], shared_q6.data(), 48, Mode::kInt8});
  const uint64_t joins = pool.barrier_count();
  MatMulGroup(jobs.data(), static_cast<int64_t>(jobs.size()), pool);
  EXPECT_EQ(pool.barrier_count(), joins + 1);
  for (size_t j = 0; j < Ws.size(); ++j) {
    const Shape& s = shapes[j];
    MatMul(xs[j].data(), s.K, s.M, Ws[j], single_ys[j].data(), s.N, pool, s.mode);
    if (s.M == 0) continue;
    EXPECT_TRUE(Identical(group_ys[j].data(), single_ys[j].data(), s.M * s.N)) << "job " << j;
  }
  EXPECT_TRUE(Identical(shared_q6.data(), single_ys[1].data(), 3 * 48));
  for (GgmlWeights* w : ggml) delete w;
}

TEST(GgmlMatMulDeathTest, RejectsBadArguments) {
  ThreadPool pool(1);
  std::vector<float> x(512, 1.0f), y(64);
  std::vector<float> w32(64);
  const Tensor f32(w32.data(), DType::kF32, {4, 16});
  EXPECT_DEATH(MatMul(x.data(), 16, 1, f32, y.data(), 4, pool, Mode::kInt8),
               "int8 activations are for GGML block formats");
  EXPECT_DEATH(ref::MatMul(x.data(), 16, 1, f32, y.data(), 4, Mode::kInt8),
               "int8 activations are for GGML block formats");
  GgmlWeights w(DType::kGgmlQ4_K, 4, 512, 1, true);
  EXPECT_DEATH(MatMul(x.data(), 256, 2, w.view(), y.data(), 4, pool),
               "x rows are shorter than K");
  // Columns of a block-format matrix (whole blocks) are a view, not a matmul operand.
  const Tensor columns = w.view().Slice(1, 0, 256);
  EXPECT_DEATH(MatMul(x.data(), 512, 1, columns, y.data(), 4, pool), "must be contiguous");
}

}  // namespace
}  // namespace moeserve::kernels
