// MatMul on every compiled SIMD target against the double-precision reference, bit-identity of
// each output across batch sizes, n ranges and thread counts (batch invariance), bounds, strides,
// and the argument checks.

#include "kernels/matmul.h"

#include <gtest/gtest.h>

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
#include "kernels/quantize.h"
#include "kernels/ref/matmul_ref.h"

// Shared by the per-target tests and the dispatched ones.

namespace moeserve::kernels::matmul_test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// What y holds where the kernel must not write.
constexpr float kYSentinel = -12345.0f;

// Random weights W [N, K] in [-1, 1] (bf16-rounded for kBF16), followed by `pad` NaN elements.
// The vector holds exactly N * K + pad elements, so a read past W[N-1, K-1] is out of bounds for
// AddressSanitizer (pad 0) or turns the result into NaN (pad > 0). Packed formats (int8, int4)
// quantize such rows into their own layout (rows, then scales; `pad` does not apply).
class Weights {
 public:
  Weights(DType dtype, int64_t N, int64_t K, uint32_t seed, int64_t pad = 0)
      : dtype_(dtype), N_(N), K_(K) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const size_t n = static_cast<size_t>(N * K);
    const size_t total = n + static_cast<size_t>(pad);
    if (IsPackedDType(dtype)) {
      packed_ = OwnedTensor(dtype, {N, K});
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t r = 0; r < N; ++r) {
        for (float& v : row) v = dist(rng);
        QuantizeRow(row.data(), packed_.view(), r);
      }
    } else if (dtype == DType::kBF16) {
      bf16_.assign(total, F32ToBF16(kNaN));
      for (size_t i = 0; i < n; ++i) bf16_[i] = F32ToBF16(dist(rng));
    } else {
      f32_.assign(total, kNaN);
      for (size_t i = 0; i < n; ++i) f32_[i] = dist(rng);
    }
  }
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  Tensor view() {
    if (IsPackedDType(dtype_)) return packed_.view();
    void* data =
        dtype_ == DType::kBF16 ? static_cast<void*>(bf16_.data()) : static_cast<void*>(f32_.data());
    return Tensor(data, dtype_, {N_, K_});
  }

 private:
  DType dtype_;
  int64_t N_;
  int64_t K_;
  std::vector<uint16_t> bf16_;
  std::vector<float> f32_;
  OwnedTensor packed_;
};

// M rows of K values in [-1, 1], row m at m * x_stride; the gaps between rows and `pad` elements
// after the last row hold NaN, so reading past a row's K elements poisons the result.
std::vector<float> MakeX(int64_t M, int64_t K, int64_t x_stride, uint32_t seed, int64_t pad = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t size = M == 0 ? pad : (M - 1) * x_stride + K + pad;
  std::vector<float> x(static_cast<size_t>(size), kNaN);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(m * x_stride + k)] = dist(rng);
  }
  return x;
}

// Room for M rows of N outputs at y_stride, plus `pad`, all holding kYSentinel.
std::vector<float> MakeY(int64_t M, int64_t N, int64_t y_stride, int64_t pad = 0) {
  const int64_t size = M == 0 ? pad : (M - 1) * y_stride + N + pad;
  return std::vector<float>(static_cast<size_t>(size), kYSentinel);
}

// W [N, K] as the f32 weights it stands for (packed rows dequantized).
std::vector<float> WeightsAsF32(const Tensor& W) {
  const int64_t N = W.dim(0), K = W.dim(1);
  std::vector<float> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    if (IsPackedDType(W.dtype())) {
      DequantizeRow(W, n, out.data() + n * K);
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = n * K + k;
      out[i] = W.dtype() == DType::kBF16 ? BF16ToF32(W.data_as<const uint16_t>()[i])
                                         : W.data_as<const float>()[i];
    }
  }
  return out;
}

// Checks y (M rows of N at y_stride) against ref::MatMul: |y - ref| <= 1e-5 * sum_k |x W| + 1e-30,
// the scale of the rounding error of any f32 summation order. Also checks that every element of
// y's buffer outside the outputs still holds kYSentinel. Reports at most a few mismatches.
void ExpectMatchesReference(const std::vector<float>& y, int64_t y_stride, const float* x,
                            int64_t x_stride, int64_t M, const Tensor& W, const std::string& what) {
  const int64_t N = W.dim(0);
  const int64_t K = W.dim(1);
  std::vector<float> want(static_cast<size_t>(M * N));
  ref::MatMul(x, x_stride, M, W, want.data(), N);
  const std::vector<float> w = WeightsAsF32(W);
  int failures = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double abs_dot = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        abs_dot += std::fabs(static_cast<double>(x[m * x_stride + k]) * w[n * K + k]);
      }
      const double got = y[static_cast<size_t>(m * y_stride + n)];
      const double ref = want[static_cast<size_t>(m * N + n)];
      const double tol = 1e-5 * abs_dot + 1e-30;
      if (!(std::fabs(got - ref) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << what << " m=" << m << " n=" << n << ": got " << got << ", want " << ref
                      << " (tolerance " << tol << ")";
      }
    }
  }
  std::vector<bool> is_output(y.size(), false);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) is_output[static_cast<size_t>(m * y_stride + n)] = true;
  }
  for (size_t i = 0; i < y.size(); ++i) {
    if (!is_output[i] && y[i] != kYSentinel && ++failures <= 5) {
      ADD_FAILURE() << what << ": wrote y[" << i << "] outside the outputs";
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// The first N floats at a and at b are bit-identical.
bool RowsIdentical(const float* a, const float* b, int64_t N) {
  return std::memcmp(a, b, static_cast<size_t>(N) * sizeof(float)) == 0;
}

std::string Describe(DType dtype, int64_t M, int64_t N, int64_t K) {
  return std::string(DTypeName(dtype)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
         " K=" + std::to_string(K);
}

// Every weight format the kernel takes.
constexpr DType kWeightDTypes[] = {DType::kBF16, DType::kF32,  DType::kQ8,
                                   DType::kQ4,   DType::kQ8A8, DType::kQ4A8};

// M rows of K activations of the kinds quantization must get right: row m is kind m % 6:
// 0 random with an outlier, 1 zeros, 2 tiny (quantized to 0), 3 an Inf, 4 a NaN, 5 halves
// (values whose x * 127 / max|x| is exactly k + 0.5: rounded half to even).
constexpr int64_t kQuantizationRowKinds = 6;
std::vector<float> QuantizationRows(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    float* row = x.data() + m * K;
    for (int64_t k = 0; k < K; ++k) row[k] = normal(rng);
    switch (m % kQuantizationRowKinds) {
      case 0:
        row[K / 2] = 40.0f;
        break;
      case 1:
        std::fill(row, row + K, 0.0f);
        break;
      case 2:
        for (int64_t k = 0; k < K; ++k) row[k] *= 1e-32f;
        break;
      case 3:
        row[K - 1] = std::numeric_limits<float>::infinity();
        break;
      case 4:
        row[0] = kNaN;
        break;
      case 5:
        for (int64_t k = 0; k < K; ++k) row[k] = static_cast<float>(k % 254 - 127) + 0.5f;
        row[0] = 127.0f;  // max|x| = 127: x * 127 / 127 = x
        break;
    }
  }
  return x;
}

// The outputs of quantization rows (above) that are not random: NaN for Inf and NaN rows,
// exactly 0 for zero and tiny rows.
void ExpectSpecialRows(const std::vector<float>& y, int64_t N, const std::string& where) {
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_TRUE(std::isnan(y[3 * N + n]) && std::isnan(y[4 * N + n])) << where << ": Inf, NaN rows";
    EXPECT_EQ(y[1 * N + n], 0.0f) << where << ": zero row";
    EXPECT_EQ(y[2 * N + n], 0.0f) << where << ": tiny row";
  }
}

}  // namespace moeserve::kernels::matmul_test

// The per-target tests: each runs once per target this build compiled and this CPU runs, with the
// dispatch restricted to that target (hwy::TestWithParamTarget), through the public entry points.
// They do not compile the kernels again for each target: matmul.cc's dispatch tables are what
// they test.
namespace moeserve::kernels::matmul_target_test {

using matmul_test::Describe;
using matmul_test::ExpectMatchesReference;
using matmul_test::ExpectSpecialRows;
using matmul_test::kQuantizationRowKinds;
using matmul_test::kWeightDTypes;
using matmul_test::MakeX;
using matmul_test::MakeY;
using matmul_test::QuantizationRows;
using matmul_test::RowsIdentical;
using matmul_test::Weights;

// The target's kernel on outputs [n_begin, n_end).
void Run(const float* x, int64_t x_stride, int64_t M, const Tensor& W, int64_t n_begin,
         int64_t n_end, float* y, int64_t y_stride) {
  MatMulRange(x, x_stride, M, W, n_begin, n_end, y, y_stride);
}

std::string Where(DType dtype, int64_t M, int64_t N, int64_t K) {
  return ActiveIsa() + " " + Describe(dtype, M, N, K);
}


void TestMatMulMatchesReference() {
  uint32_t seed = 1;
  int cases = 0;
  for (DType dtype : kWeightDTypes) {
    // M = 1..3, 4, 5 and more take the four tile shapes of the AVX-512 path (matmul_common-inl.h).
    for (int64_t M : {1, 2, 3, 4, 5, 16, 37}) {
      for (int64_t N : {1, 3, 4, 7, 64, 129}) {
        for (int64_t K : {1, 7, 8, 15, 16, 31, 32, 64, 100, 128, 257, 640, 2048}) {
          if (!CanPack(dtype, K) && IsPackedDType(dtype)) continue;
          ++seed;
          // Every other case has padded rows: x and y strides wider than K and N.
          const bool strided = seed % 2 == 0;
          const int64_t x_stride = strided ? K + 5 : K;
          const int64_t y_stride = strided ? N + 3 : N;
          Weights w(dtype, N, K, seed, /*pad=*/16);
          const Tensor W = w.view();
          const std::vector<float> x = MakeX(M, K, x_stride, seed + 1000, /*pad=*/16);
          std::vector<float> y = MakeY(M, N, y_stride, /*pad=*/16);
          Run(x.data(), x_stride, M, W, 0, N, y.data(), y_stride);
          ExpectMatchesReference(y, y_stride, x.data(), x_stride, M, W, Where(dtype, M, N, K));
          ++cases;
        }
      }
    }
  }
  // int4 and w4a8: only K = 128, 640, 2048 (multiples of kQ4A8Block).
  EXPECT_EQ(cases, (4 * 13 + 3 + 3) * 7 * 6);
}

// Each of the M rows of `full` (y of x [M, K] against W's first N rows) equals, bit for bit, the
// same row computed alone (M = 1).
void ExpectEachRowMatchesAlone(const std::vector<float>& full, const float* x, int64_t K, int64_t M,
                               const Tensor& W, int64_t N, const std::string& where) {
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> one(static_cast<size_t>(N));
    Run(x + m * K, K, 1, W, 0, N, one.data(), N);
    EXPECT_TRUE(RowsIdentical(one.data(), full.data() + m * N, N)) << where << " m=" << m;
  }
}

void TestMatMulBatchInvariance() {
  // Each output computed inside a batch of 37 rows must equal, bit for bit, the same output
  // computed alone (M = 1), in any smaller batch at any offset, and in any split of n.
  constexpr int64_t kM = 37;
  constexpr int64_t kN = 37;
  uint32_t seed = 500;
  for (DType dtype : kWeightDTypes) {
    for (int64_t K : {1, 7, 8, 15, 16, 17, 31, 64, 100, 128, 257, 2048}) {
      if (IsPackedDType(dtype) && !CanPack(dtype, K)) continue;
      ++seed;
      const std::string where = Where(dtype, kM, kN, K);
      Weights w(dtype, kN, K, seed);
      const Tensor W = w.view();
      const std::vector<float> x = MakeX(kM, K, K, seed + 1);
      std::vector<float> full = MakeY(kM, kN, kN);
      Run(x.data(), K, kM, W, 0, kN, full.data(), kN);

      ExpectEachRowMatchesAlone(full, x.data(), K, kM, W, kN, where);
      // Sub-batches of every size up to 9 and a few larger, at every offset that fits.
      for (int64_t batch : {2, 3, 4, 5, 6, 7, 8, 9, 13, 24, 36}) {
        for (int64_t m0 = 0; m0 + batch <= kM; m0 += 5) {
          std::vector<float> part(static_cast<size_t>(batch * kN));
          Run(x.data() + m0 * K, K, batch, W, 0, kN, part.data(), kN);
          for (int64_t m = 0; m < batch; ++m) {
            EXPECT_TRUE(RowsIdentical(part.data() + m * kN, full.data() + (m0 + m) * kN, kN))
                << where << " batch=" << batch << " m0=" << m0 << " m=" << m;
          }
        }
      }
      // Two ranges of n, split at the ends, inside the first tile, on and off tile boundaries.
      for (int64_t split : {0, 1, 2, 3, 4, 5, 7, 8, 13, 20, 33, 36, 37}) {
        std::vector<float> y = MakeY(kM, kN, kN);
        Run(x.data(), K, kM, W, 0, split, y.data(), kN);
        Run(x.data(), K, kM, W, split, kN, y.data(), kN);
        EXPECT_EQ(std::memcmp(y.data(), full.data(), y.size() * sizeof(float)), 0)
            << where << " split=" << split;
      }
    }
  }
}

void TestMatMulAcrossRowBlocks() {
  // Rows long enough that M = 37 spans several of the row blocks that the passes over a W tile
  // cover (kXBlockBytes, 512 KiB: 8 f32 rows of K = 16384, 32 quantized rows): every output must
  // equal its computation alone, and the batch must match the reference.
  constexpr int64_t kM = 37, kN = 13, kK = 16384;
  static_assert(kM * kK > (512 << 10), "int8 rows: more than one block (kXBlockBytes)");
  uint32_t seed = 700;
  for (DType dtype : kWeightDTypes) {
    ++seed;
    const std::string where = Where(dtype, kM, kN, kK);
    Weights w(dtype, kN, kK, seed);
    const Tensor W = w.view();
    const std::vector<float> x = MakeX(kM, kK, kK, seed + 1);
    std::vector<float> full = MakeY(kM, kN, kN);
    Run(x.data(), kK, kM, W, 0, kN, full.data(), kN);
    ExpectMatchesReference(full, kN, x.data(), kK, kM, W, where);
    ExpectEachRowMatchesAlone(full, x.data(), kK, kM, W, kN, where);
  }
}

void TestMatMulStaysInBounds() {
  // Exact-size buffers: a read past W, x or y is out of bounds for AddressSanitizer in the asan
  // build. NaN-padded buffers: an over-read turns the result into NaN in every build. Every
  // partial-vector length is covered for every target (K up to 3 vectors of 16 lanes).
  uint32_t seed = 900;
  for (DType dtype : kWeightDTypes) {
    for (int64_t K = 0; K <= 70; ++K) {
      if (!IsPackedDType(dtype) && K > 50) break;
      if (IsPackedDType(dtype) && !CanPack(dtype, K)) continue;
      for (int64_t N : {1, 2, 3, 4, 5, 9}) {
        for (int64_t M : {1, 2, 4, 7}) {
          for (int64_t pad : {0, 16}) {
            ++seed;
            Weights w(dtype, N, K, seed, pad);
            const Tensor W = w.view();
            const std::vector<float> x = MakeX(M, K, K, seed + 1, pad);
            std::vector<float> y = MakeY(M, N, N, pad);
            Run(x.data(), K, M, W, 0, N, y.data(), N);
            ExpectMatchesReference(y, N, x.data(), K, M, W,
                                   Where(dtype, M, N, K) + " pad=" + std::to_string(pad));
          }
        }
      }
    }
  }
}

// w8a8 sums integers exactly, so every target must equal the reference bit for bit, including
// the activation quantization (ties rounded to even, rows of zeros, tiny rows, Inf and NaN).
void TestW8A8ExactlyMatchesReference() {
  std::mt19937 rng(31);
  for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 200, 2048}) {
    const int64_t M = kQuantizationRowKinds + 3;
    const std::vector<float> x = QuantizationRows(M, K, rng);
    // Activation quantization alone.
    for (int64_t m = 0; m < M; ++m) {
      std::vector<int8_t> got(static_cast<size_t>(K)), want(static_cast<size_t>(K));
      float got_scale = -1, want_scale = -2;
      const int32_t got_sum = QuantizeActivationRowForTest(x.data() + m * K, K, got.data(), &got_scale);
      const int32_t want_sum =
          ref::QuantizeActivationRow(x.data() + m * K, K, want.data(), &want_scale);
      EXPECT_EQ(got, want) << ActiveIsa() << " K=" << K << " m=" << m;
      EXPECT_EQ(got_sum, want_sum) << ActiveIsa() << " K=" << K << " m=" << m;
      EXPECT_EQ(std::memcmp(&got_scale, &want_scale, sizeof(float)), 0)
          << ActiveIsa() << " K=" << K << " m=" << m;
    }
    for (int64_t N : {1, 9, 33}) {
      Weights w(DType::kQ8A8, N, K, static_cast<uint32_t>(K * 100 + N));
      const Tensor W = w.view();
      std::vector<float> got(static_cast<size_t>(M * N)), want(got.size());
      Run(x.data(), K, M, W, 0, N, got.data(), N);
      ref::MatMul(x.data(), K, M, W, want.data(), N);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << Where(DType::kQ8A8, M, N, K);
      ExpectSpecialRows(got, N, Where(DType::kQ8A8, M, N, K));
    }
  }
  // The largest sum: every product 127 * 127 (or -127 * 127) over K = kMaxQ8A8K.
  for (float sign : {1.0f, -1.0f}) {
    const int64_t K = kMaxQ8A8K, N = 2;
    std::vector<float> row(static_cast<size_t>(K), sign), ones(static_cast<size_t>(K), 1.0f);
    OwnedTensor W(DType::kQ8A8, {N, K});
    QuantizeRow(ones.data(), W.view(), 0);
    QuantizeRow(row.data(), W.view(), 1);
    float y[2] = {};
    Run(row.data(), K, 1, W.view(), 0, N, y, N);
    EXPECT_EQ(y[0], sign * static_cast<float>(K)) << ActiveIsa();
    EXPECT_EQ(y[1], static_cast<float>(K)) << ActiveIsa();
  }
}

void TestMatMulRangeWritesOnlyItsOutputs() {
  constexpr int64_t kM = 5;
  constexpr int64_t kN = 23;
  constexpr int64_t kK = 40;
  Weights w(DType::kBF16, kN, kK, 77);
  const Tensor W = w.view();
  const std::vector<float> x = MakeX(kM, kK, kK, 78);
  std::vector<float> full(kM * kN);
  Run(x.data(), kK, kM, W, 0, kN, full.data(), kN);
  for (int64_t n_begin = 0; n_begin <= kN; n_begin += 3) {
    for (int64_t n_end = n_begin; n_end <= kN; n_end += 4) {
      std::vector<float> y = MakeY(kM, kN, kN);
      Run(x.data(), kK, kM, W, n_begin, n_end, y.data(), kN);
      for (int64_t m = 0; m < kM; ++m) {
        for (int64_t n = 0; n < kN; ++n) {
          const float got = y[m * kN + n];
          const float want = n_begin <= n && n < n_end ? full[m * kN + n] : matmul_test::kYSentinel;
          EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
              << ActiveIsa() << " [" << n_begin << ", " << n_end << ") m=" << m
              << " n=" << n;
        }
      }
    }
  }
}

// w4a8 and int4 add their groups' exact integer sums in one fixed order, so every target must
// equal the reference bit for bit: every tile shape, partial superblocks (K % 512), the special
// rows, the largest group sums, and the in-place layout of the activations.
void TestW4A8ExactlyMatchesReference() {
  std::mt19937 rng(41);
  for (DType dtype : {DType::kQ4A8, DType::kQ4}) {
    for (int64_t K : {128, 256, 384, 512, 640, 896, 1024, 2048 + 384}) {
      const int64_t M = kQuantizationRowKinds + 5;
      const std::vector<float> x = QuantizationRows(M, K, rng);
      for (int64_t N : {1, 2, 5, 9, 33}) {
        Weights w(dtype, N, K, static_cast<uint32_t>(K * 100 + N));
        const Tensor W = w.view();
        std::vector<float> want(static_cast<size_t>(M * N));
        ref::MatMul(x.data(), K, M, W, want.data(), N);
        // Every batch size from 1 to M: each tile shape and its partial tiles.
        for (int64_t rows = 1; rows <= M; ++rows) {
          std::vector<float> got(static_cast<size_t>(rows * N));
          Run(x.data(), K, rows, W, 0, N, got.data(), N);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << Where(dtype, rows, N, K);
        }
        ExpectSpecialRows(want, N, Where(dtype, M, N, K));
      }
    }
    // The largest group sums: nibbles 0 and 15 (weights -8 and 7 times the scale; int4
    // quantizes to -7 .. 7, the kernel takes any nibble) against the largest p (+-127 for w4a8,
    // +-kQ4Levels for int4), every group of a 2048 row.
    const int64_t K = 2048, N = 4;
    OwnedTensor W(dtype, {N, K});
    std::vector<float> ones(static_cast<size_t>(K), 1.0f);
    for (int64_t n = 0; n < N; ++n) QuantizeRow(ones.data(), W.view(), n);
    uint8_t* bytes = W.view().data_as<uint8_t>();
    std::fill(bytes, bytes + K / 2, uint8_t{0x00});          // row 0: all -8
    std::fill(bytes + K / 2, bytes + K, uint8_t{0xff});      // row 1: all 7
    std::fill(bytes + K, bytes + 3 * K / 2, uint8_t{0x0f});  // row 2: 7 then -8
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> row(static_cast<size_t>(K), sign);
      float y[N] = {}, want[N] = {};
      Run(row.data(), K, 1, W.view(), 0, N, y, N);
      ref::MatMul(row.data(), K, 1, W.view(), want, N);
      EXPECT_EQ(std::memcmp(y, want, sizeof(y)), 0) << Where(dtype, 1, N, K);
      // s = 1 / 7 per group, p = +-levels with a = 1 / levels: y = sum (nibble - 8) / 7.
      EXPECT_NEAR(y[0], sign * -8.0f / 7.0f * K, 1e-2f * K) << Where(dtype, 1, N, K);
      EXPECT_NEAR(y[1], sign * K, 1e-2f * K) << Where(dtype, 1, N, K);
    }
  }
  // ToQ4A8Layout: the first halves of a block's groups, then the second halves.
  std::vector<int8_t> p(256);
  for (size_t k = 0; k < p.size(); ++k) p[k] = static_cast<int8_t>(k % 128 - 64);
  const std::vector<int8_t> natural = p;
  int32_t sums[8];
  ToQ4A8Layout(p.data(), 256, sums);
  for (int64_t g = 0; g < 8; ++g) {
    int32_t sum = 0;
    for (int64_t j = 0; j < 32; ++j) {
      const int64_t at = g / 4 * 128 + (j < 16 ? 0 : 64) + g % 4 * 16 + j % 16;
      EXPECT_EQ(p[at], natural[g * 32 + j]) << "g=" << g << " j=" << j;
      sum += natural[g * 32 + j];
    }
    EXPECT_EQ(sums[g], sum) << "g=" << g;
  }
}

}  // namespace moeserve::kernels::matmul_target_test

namespace moeserve::kernels {

// Restricts the dispatch to the target, and checks it took: the kernels run that target's code.
class MatMulTargetTest : public hwy::TestWithParamTarget {
 protected:
  void SetUp() override {
    hwy::TestWithParamTarget::SetUp();
    std::string name = hwy::TargetName(GetParam());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    ASSERT_EQ(ActiveIsa(), name);
  }
};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(MatMulTargetTest);
TEST_P(MatMulTargetTest, MatMulMatchesReference) { matmul_target_test::TestMatMulMatchesReference(); }
TEST_P(MatMulTargetTest, MatMulBatchInvariance) { matmul_target_test::TestMatMulBatchInvariance(); }
TEST_P(MatMulTargetTest, MatMulAcrossRowBlocks) { matmul_target_test::TestMatMulAcrossRowBlocks(); }
TEST_P(MatMulTargetTest, MatMulStaysInBounds) { matmul_target_test::TestMatMulStaysInBounds(); }
TEST_P(MatMulTargetTest, MatMulRangeWritesOnlyItsOutputs) { matmul_target_test::TestMatMulRangeWritesOnlyItsOutputs(); }
TEST_P(MatMulTargetTest, W8A8ExactlyMatchesReference) { matmul_target_test::TestW8A8ExactlyMatchesReference(); }
TEST_P(MatMulTargetTest, W4A8ExactlyMatchesReference) { matmul_target_test::TestW4A8ExactlyMatchesReference(); }

namespace {

using matmul_test::Describe;
using matmul_test::ExpectMatchesReference;
using matmul_test::kWeightDTypes;
using matmul_test::MakeX;
using matmul_test::MakeY;
using matmul_test::RowsIdentical;
using matmul_test::Weights;

TEST(MatMulTest, BitIdenticalAcrossThreadCountsAndBatches) {
  // The public entry point on the dispatched target: the N split over threads, M and the row
  // offset of an output in the batch never change its bits.
  constexpr int64_t kM = 37;
  uint32_t seed = 3000;
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kQ8A8, DType::kQ4A8, DType::kQ4}) {
    for (int64_t N : {1, 5, 64, 133}) {
      for (int64_t K : {1, 7, 257, 384, 2048}) {
        if (IsPackedDType(dtype) && !CanPack(dtype, K)) continue;
        ++seed;
        const std::string where = Describe(dtype, kM, N, K);
        Weights w(dtype, N, K, seed);
        const Tensor W = w.view();
        const std::vector<float> x = MakeX(kM, K, K, seed + 1);
        std::vector<float> base(static_cast<size_t>(kM * N));
        {
          ThreadPool pool(1);
          MatMul(x.data(), K, kM, W, base.data(), N, pool);
        }
        ExpectMatchesReference(base, N, x.data(), K, kM, W, where);
        for (size_t threads : {2, 3, 4}) {
          ThreadPool pool(threads);
          std::vector<float> y(base.size());
          MatMul(x.data(), K, kM, W, y.data(), N, pool);
          EXPECT_EQ(std::memcmp(y.data(), base.data(), y.size() * sizeof(float)), 0)
              << where << " threads=" << threads;
          for (int64_t m = 0; m < kM; m += 6) {
            std::vector<float> one(static_cast<size_t>(N));
            MatMul(x.data() + m * K, K, 1, W, one.data(), N, pool);
            EXPECT_TRUE(RowsIdentical(one.data(), base.data() + m * N, N))
                << where << " threads=" << threads << " m=" << m;
          }
        }
        std::vector<float> ranged(base.size());
        MatMulRange(x.data(), K, kM, W, 0, N / 3, ranged.data(), N);
        MatMulRange(x.data(), K, kM, W, N / 3, N, ranged.data(), N);
        EXPECT_EQ(std::memcmp(ranged.data(), base.data(), base.size() * sizeof(float)), 0)
            << where << " MatMulRange";
      }
    }
  }
}

TEST(MatMulTest, StridedRowsOnThreads) {
  // x and y rows wider than K and N (a view into larger activations), split over two threads.
  constexpr int64_t kM = 6;
  constexpr int64_t kN = 70;
  constexpr int64_t kK = 300;
  constexpr int64_t kXStride = 512;
  constexpr int64_t kYStride = 96;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    Weights w(dtype, kN, kK, 4000);
    const Tensor W = w.view();
    const std::vector<float> x = MakeX(kM, kK, kXStride, 4001, /*pad=*/8);
    std::vector<float> y = MakeY(kM, kN, kYStride, /*pad=*/8);
    ThreadPool pool(2);
    MatMul(x.data(), kXStride, kM, W, y.data(), kYStride, pool);
    ExpectMatchesReference(y, kYStride, x.data(), kXStride, kM, W, Describe(dtype, kM, kN, kK));
  }
}

TEST(MatMulTest, ModelShapesMatchReference) {
  // A Qwen3-Next expert (down: [2048, 512]; gate/up: [512, 2048]) at decode and prefill sizes.
  ThreadPool pool(2);
  uint32_t seed = 5000;
  for (DType dtype : kWeightDTypes) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{512, 2048}, {2048, 512}}) {
      for (int64_t M : {1, 4, 19}) {
        ++seed;
        Weights w(dtype, N, K, seed);
        const Tensor W = w.view();
        const std::vector<float> x = MakeX(M, K, K, seed + 1);
        std::vector<float> y = MakeY(M, N, N);
        MatMul(x.data(), K, M, W, y.data(), N, pool);
        ExpectMatchesReference(y, N, x.data(), K, M, W, Describe(dtype, M, N, K));
      }
    }
  }
}

TEST(MatMulTest, OneJoinPerCall) {
  ThreadPool pool(2);
  Weights w(DType::kBF16, 64, 32, 6000);
  const std::vector<float> x = MakeX(3, 32, 32, 6001);
  std::vector<float> y(3 * 64);
  const uint64_t before = pool.barrier_count();
  MatMul(x.data(), 32, 3, w.view(), y.data(), 64, pool);
  EXPECT_EQ(pool.barrier_count(), before + 1);
  // A single row tile is one task: it runs inline, with no join.
  Weights small(DType::kBF16, 4, 32, 6002);
  MatMul(x.data(), 32, 3, small.view(), y.data(), 4, pool);
  EXPECT_EQ(pool.barrier_count(), before + 1);
}

TEST(MatMulTest, GroupMatchesSeparateCallsBitForBit) {
  ThreadPool pool(2);
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Jobs of different shapes, dtypes and row counts (one empty), as a step's experts are.
  struct Shape {
    int64_t N, K, M;
    DType dtype;
  };
  const Shape shapes[] = {{64, 48, 3, DType::kBF16},
                          {40, 48, 1, DType::kF32},
                          {17, 33, 0, DType::kBF16},
                          {128, 64, 8, DType::kBF16},
                          {9, 16, 5, DType::kF32},
                          {24, 80, 4, DType::kQ8A8},
                          {33, 80, 4, DType::kQ8A8},
                          {16, 80, 0, DType::kQ8A8},
                          {8, 80, 2, DType::kQ8A8},
                          {8, 40, 3, DType::kQ8},
                          // Large enough that the pool's worker surely runs some of their tasks.
                          {1024, 512, 16, DType::kQ8A8},
                          {1024, 512, 9, DType::kQ8A8}};
  std::vector<OwnedTensor> weights;
  std::vector<std::vector<float>> xs, group_ys, single_ys;
  std::vector<MatMulJob> jobs;
  for (const Shape& s : shapes) {
    OwnedTensor w(s.dtype, {s.N, s.K});
    std::vector<float> values(s.N * s.K);
    for (float& v : values) v = normal(rng);
    if (IsPackedDType(s.dtype)) {
      for (int64_t n = 0; n < s.N; ++n) QuantizeRow(values.data() + n * s.K, w.view(), n);
    } else {
      ConvertFromF32(values.data(), s.dtype, w.view().data(), values.size());
    }
    weights.push_back(std::move(w));
    xs.emplace_back(s.M * s.K);
    for (float& v : xs.back()) v = normal(rng);
    group_ys.emplace_back(s.M * s.N, -1.0f);
    single_ys.emplace_back(s.M * s.N, -2.0f);
  }
  xs[6] = xs[5];  // same values at another address: quantized again
  for (size_t j = 0; j < weights.size(); ++j) {
    const Shape& s = shapes[j];
    jobs.push_back({xs[j].data(), s.K, s.M, &weights[j].view(), group_ys[j].data(), s.N});
  }
  // Two w8a8 jobs on the very same x, as an expert's gate and up: quantized once, shared.
  std::vector<float> shared_y(4 * 24, -3.0f);
  jobs.insert(jobs.begin() + 6, {xs[5].data(), 80, 4, &weights[5].view(), shared_y.data(), 24});
  const uint64_t joins = pool.barrier_count();
  MatMulGroup(jobs.data(), static_cast<int64_t>(jobs.size()), pool);
  EXPECT_EQ(pool.barrier_count(), joins + 1);
  for (size_t j = 0; j < weights.size(); ++j) {
    const Shape& s = shapes[j];
    MatMul(xs[j].data(), s.K, s.M, weights[j].view(), single_ys[j].data(), s.N, pool);
    if (s.M == 0) continue;  // nothing to compare (and memcmp may not see null pointers)
    EXPECT_EQ(
        0, std::memcmp(group_ys[j].data(), single_ys[j].data(), group_ys[j].size() * sizeof(float)))
        << "job " << j;
  }
  EXPECT_EQ(0, std::memcmp(shared_y.data(), group_ys[5].data(), shared_y.size() * sizeof(float)));
}

TEST(MatMulTest, EmptyShapes) {
  ThreadPool pool(2);
  // M = 0: nothing is read or written.
  Weights w(DType::kF32, 8, 16, 7000);
  std::vector<float> y = MakeY(1, 8, 8);
  MatMul(nullptr, 16, 0, w.view(), y.data(), 8, pool);
  for (float v : y) EXPECT_EQ(v, matmul_test::kYSentinel);
  // N = 0: likewise.
  Weights none(DType::kBF16, 0, 16, 7001);
  const std::vector<float> x = MakeX(2, 16, 16, 7002);
  MatMul(x.data(), 16, 2, none.view(), nullptr, 0, pool);
  // K = 0: empty sums are zero.
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    Weights empty(dtype, 9, 0, 7003);
    std::vector<float> z = MakeY(3, 9, 9);
    MatMul(nullptr, 0, 3, empty.view(), z.data(), 9, pool);
    for (float v : z) EXPECT_EQ(v, 0.0f) << DTypeName(dtype);
    std::vector<float> zr = MakeY(3, 9, 9);
    ref::MatMul(nullptr, 0, 3, empty.view(), zr.data(), 9);
    for (float v : zr) EXPECT_EQ(v, 0.0f) << DTypeName(dtype);
  }
}

TEST(MatMulTest, ExactForSmallIntegers) {
  // Products and partial sums of small integers are exact in f32 in any order, so the kernel must
  // equal the reference exactly, also in bf16 (integers up to 256 are exact there).
  constexpr int64_t kM = 3;
  constexpr int64_t kN = 11;
  constexpr int64_t kK = 1000;
  std::mt19937 rng(8000);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> x(kM * kK);
  for (float& v : x) v = static_cast<float>(dist(rng));
  std::vector<uint16_t> wb(kN * kK);
  std::vector<float> wf(kN * kK);
  for (size_t i = 0; i < wf.size(); ++i) {
    wf[i] = static_cast<float>(dist(rng));
    wb[i] = F32ToBF16(wf[i]);
  }
  ThreadPool pool(2);
  for (const Tensor& W :
       {Tensor(wb.data(), DType::kBF16, {kN, kK}), Tensor(wf.data(), DType::kF32, {kN, kK})}) {
    std::vector<float> got(kM * kN);
    std::vector<float> want(kM * kN);
    MatMul(x.data(), kK, kM, W, got.data(), kN, pool);
    ref::MatMul(x.data(), kK, kM, W, want.data(), kN);
    EXPECT_EQ(got, want) << DTypeName(W.dtype());
  }
}

TEST(RefMatMulTest, SmallCases) {
  // x = [[1, 2, 3], [1e8, 1, -1e8]]; W = [[1, 0, -1], [0.5, 0.5, 0.5]].
  const float x[] = {1.0f, 2.0f, 3.0f, 1e8f, 1.0f, -1e8f};
  float wf[] = {1.0f, 0.0f, -1.0f, 0.5f, 0.5f, 0.5f};
  uint16_t wb[6];
  for (int i = 0; i < 6; ++i) wb[i] = F32ToBF16(wf[i]);
  for (const Tensor& W : {Tensor(wf, DType::kF32, {2, 3}), Tensor(wb, DType::kBF16, {2, 3})}) {
    float y[4] = {};
    ref::MatMul(x, 3, 2, W, y, 2);
    EXPECT_EQ(y[0], -2.0f);
    EXPECT_EQ(y[1], 3.0f);
    EXPECT_EQ(y[2], 2e8f);
    // Double accumulation keeps the 0.5 that an f32 running sum would lose next to 5e7.
    EXPECT_EQ(y[3], 0.5f);
  }
}

TEST(MatMulDeathTest, RejectsBadArguments) {
  ThreadPool pool(1);
  std::vector<float> x(64, 1.0f);
  std::vector<float> y(64);
  std::vector<uint16_t> w16(64);
  std::vector<float> w32(64);
  const Tensor f16(w16.data(), DType::kF16, {4, 16});
  EXPECT_DEATH(MatMul(x.data(), 16, 1, f16, y.data(), 4, pool), "f16 is unsupported");
  EXPECT_DEATH(ref::MatMul(x.data(), 16, 1, f16, y.data(), 4), "f16 is unsupported");
  const Tensor rank3(w32.data(), DType::kF32, {2, 2, 16});
  EXPECT_DEATH(MatMul(x.data(), 16, 1, rank3, y.data(), 4, pool), "must be \\[N, K\\]");
  const Tensor W(w32.data(), DType::kF32, {4, 16});
  EXPECT_DEATH(MatMul(x.data(), 8, 2, W, y.data(), 4, pool), "x rows are shorter than K");
  EXPECT_DEATH(MatMul(x.data(), 16, 2, W, y.data(), 3, pool), "y rows are shorter than N");
  EXPECT_DEATH(MatMulRange(x.data(), 16, 1, W, 2, 5, y.data(), 4), "outside N");
  EXPECT_DEATH(MatMulRange(x.data(), 16, 1, W, 3, 2, y.data(), 4), "outside N");
  const Tensor columns = Tensor(w32.data(), DType::kF32, {4, 16}).Slice(1, 0, 8);
  EXPECT_DEATH(MatMul(x.data(), 16, 1, columns, y.data(), 4, pool), "must be contiguous");
}

}  // namespace
}  // namespace moeserve::kernels

