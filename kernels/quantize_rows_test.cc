// QuantizeRows on every compiled SIMD target against its scalar twin (ConvertToF32 then
// QuantizeRow per row), byte for byte over whole packed matrices: every packed dtype, K from the
// smallest each allows to 8192 (every int8 tail length), several row counts and first rows, row
// strides with an odd number of extra elements, bf16 and f32 sources, and rows built from hostile
// values (NaN, ±Inf, denormals, -0, zeros, ties, scales that underflow or saturate f16). The
// dispatched entry point once more with an f16 source, with GGML block sources, and its errors.

#include <gtest/gtest.h>

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
#include "kernels/quantize.h"
#include "kernels/ref/ggml_blocks_ref.h"

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's QuantizeRowsImpl from quantize_rows-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantize_rows_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/quantize_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

// The kinds of blocks of 32 values a test row is made of (a whole row of one kind, or a row whose
// blocks take turns).
enum Kind : int {
  kNormal,         // N(0, sigma), sigma from 1e-6 to 1e6
  kZeros,          // +0
  kNegativeZeros,  // -0
  kInt4Ties,       // halves in [-7, 7] beside a 7, times a power of two: int4 scale 2^e, ties
  kInt8Ties,       // halves in [-127, 127] beside a 127, times a power of two: int8 scale 2^e
  kSomeNaN,        // a quarter NaN (either sign, several payloads)
  kAllNaN,
  kPlusInf,     // one +Inf among normal values
  kMinusInf,    // one -Inf among normal values
  kDenormals,   // f32 denormals of either sign (bf16 ones from a bf16 source)
  kTiny,        // near f32's smallest normal: int8's scale denormal, its inverse infinite
  kSmall,       // 1e-10 .. 1e-5: int4's f16 scale subnormal or 0
  kHuge,        // 1e5 .. 1e38: int4's scale saturates at 65504
  kNearF16Max,  // group maximum / 7 across 65504 .. 65520, where f16 rounding saturates
  kExtremes,    // ±FLT_MAX among normal values
  kAnything,    // normal values, an eighth replaced by any of the special ones above
  kKinds
};

float Normal(std::mt19937& rng, float sigma) {
  return std::normal_distribution<float>(0.0f, sigma)(rng);
}

float Uniform(std::mt19937& rng, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

float Special(std::mt19937& rng) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float choices[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           F32FromBits(0x7f800001u),  // a signalling NaN's bits
                           kInf,
                           -kInf,
                           -0.0f,
                           0.0f,
                           F32FromBits(1u),            // the smallest denormal
                           -F32FromBits(0x007fffffu),  // the largest denormal
                           std::numeric_limits<float>::max(),
                           3.5f,
                           -2.5f};
  return choices[std::uniform_int_distribution<size_t>(0, std::size(choices) - 1)(rng)];
}

// n values of one kind at v.
void FillBlock(Kind kind, std::mt19937& rng, float* v, size_t n) {
  std::uniform_int_distribution<int> exponent(-20, 20);
  const float sigma = std::pow(10.0f, Uniform(rng, -6.0f, 6.0f));
  for (size_t i = 0; i < n; ++i) v[i] = Normal(rng, sigma);
  switch (kind) {
    case kNormal:
    case kKinds:
      return;
    case kZeros:
    case kNegativeZeros:
      for (size_t i = 0; i < n; ++i) v[i] = kind == kZeros ? 0.0f : -0.0f;
      return;
    case kInt4Ties:
    case kInt8Ties: {
      const int top = kind == kInt4Ties ? 7 : 127;
      const float scale = std::ldexp(1.0f, exponent(rng));
      std::uniform_int_distribution<int> halves(-2 * top, 2 * top);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(halves(rng)) / 2 * scale;
      v[0] = static_cast<float>(top) * scale;
      return;
    }
    case kSomeNaN:
      for (size_t i = 0; i < n; i += 4) v[i] = F32FromBits(i % 8 == 0 ? 0xffc00123u : 0x7fc00000u);
      return;
    case kAllNaN:
      for (size_t i = 0; i < n; ++i) v[i] = std::numeric_limits<float>::quiet_NaN();
      return;
    case kPlusInf:
    case kMinusInf:
      v[n / 2] = kind == kPlusInf ? INFINITY : -INFINITY;
      return;
    case kDenormals:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = std::uniform_int_distribution<uint32_t>(1, 0x7fffffu)(rng);
        v[i] = F32FromBits(bits | (i % 3 == 0 ? 0x80000000u : 0u));
      }
      return;
    case kTiny:
      for (size_t i = 0; i < n; ++i) v[i] = Normal(rng, 1.0f) * 2e-38f;
      return;
    case kSmall: {
      const float s = std::pow(10.0f, Uniform(rng, -10.0f, -5.0f));
      for (size_t i = 0; i < n; ++i) v[i] = Normal(rng, s);
      return;
    }
    case kHuge: {
      const float s = std::pow(10.0f, Uniform(rng, 5.0f, 37.0f));
      for (size_t i = 0; i < n; ++i) v[i] = Normal(rng, s);
      return;
    }
    case kNearF16Max:
      for (size_t i = 0; i < n; ++i) v[i] = Uniform(rng, -1.0f, 1.0f) * 65504.0f * 7;
      v[n - 1] = 7.0f * (65504.0f + Uniform(rng, 0.0f, 24.0f));
      return;
    case kExtremes:
      v[0] = std::numeric_limits<float>::max();
      v[n - 1] = std::numeric_limits<float>::lowest();
      return;
    case kAnything:
      for (size_t i = 0; i < n; ++i) {
        if (std::uniform_int_distribution<int>(0, 7)(rng) == 0) v[i] = Special(rng);
      }
      return;
  }
}

// A test row of K values: even rows one kind throughout, odd rows a kind per block of 32.
std::vector<float> TestRow(std::mt19937& rng, size_t K, int64_t r) {
  std::vector<float> v(K);
  std::uniform_int_distribution<int> kinds(0, kKinds - 1);
  const int row_kind = kinds(rng);
  for (size_t k = 0; k < K; k += kQ4Group) {
    const Kind kind = static_cast<Kind>(r % 2 == 0 ? row_kind : kinds(rng));
    FillBlock(kind, rng, v.data() + k, std::min<size_t>(kQ4Group, K - k));
  }
  return v;
}

// `rows` test rows of K values in src_dtype, stride_elems apart; the gaps hold NaN bits, which
// would change the bytes if they were read.
std::vector<std::byte> TestSource(std::mt19937& rng, DType src_dtype, size_t K, int64_t rows,
                                  size_t stride_elems) {
  const size_t size = DTypeSize(src_dtype);
  std::vector<std::byte> src(rows * stride_elems * size, std::byte{0xff});
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = TestRow(rng, K, r);
    ConvertFromF32(v.data(), src_dtype, src.data() + r * stride_elems * size, K);
  }
  return src;
}

// Matrices of `dtype` [N, K] filled with the same byte, so that any byte one writes and the other
// does not shows.
OwnedTensor Filled(DType dtype, int64_t N, int64_t K) {
  OwnedTensor W(dtype, {N, K});
  std::memset(W.view().data(), 0xa5, W.view().bytes());
  return W;
}

void ExpectSameBytes(const Tensor& got, const Tensor& want, const std::string& what) {
  const auto* g = got.data_as<const uint8_t>();
  const auto* w = want.data_as<const uint8_t>();
  for (size_t i = 0; i < want.bytes(); ++i) {
    if (g[i] != w[i]) {
      ADD_FAILURE() << what << " target=" << hwy::TargetName(HWY_TARGET) << ": byte " << i << " of "
                    << want.bytes() << " is " << int{g[i]} << ", want " << int{w[i]};
      return;
    }
  }
}

std::vector<int64_t> TestKs(DType dtype) {
  if (IsInt4RowsDType(dtype)) return {32, 64, 96, 128, 160, 224, 256, 512, 768, 2048, 4096, 8192};
  std::vector<int64_t> Ks;
  for (int64_t K = 1; K <= 40; ++K) Ks.push_back(K);
  for (int64_t K : {63, 64, 65, 127, 128, 129, 255, 257, 768, 1000, 2048, 4095, 4096, 8192}) {
    Ks.push_back(K);
  }
  return Ks;
}

HWY_NOINLINE void TestQuantizeRowsMatchesQuantizeRow() {
  std::mt19937 rng(33);
  struct Rows {
    int64_t count, first;
  };
  for (DType dtype : {DType::kQ8, DType::kQ8A8, DType::kQ4, DType::kQ4A8}) {
    const bool int4 = IsInt4RowsDType(dtype);
    for (int64_t K : TestKs(dtype)) {
      for (Rows rows : {Rows{1, 0}, Rows{6, 2}, Rows{17, 1}}) {
        for (DType src_dtype : {DType::kBF16, DType::kF32}) {
          for (size_t extra : {0, 3}) {
            const size_t stride_elems = static_cast<size_t>(K) + extra;
            const size_t stride = stride_elems * DTypeSize(src_dtype);
            const std::vector<std::byte> src =
                TestSource(rng, src_dtype, static_cast<size_t>(K), rows.count, stride_elems);
            const int64_t N = rows.first + rows.count + 2;
            OwnedTensor want = Filled(dtype, N, K), got = Filled(dtype, N, K);
            std::vector<float> row(static_cast<size_t>(K));
            for (int64_t r = 0; r < rows.count; ++r) {
              ConvertToF32(src_dtype, src.data() + r * stride, row.data(), row.size());
              QuantizeRow(row.data(), want.view(), rows.first + r);
            }
            const Tensor& W = got.view();
            void* packed = W.data_as<uint8_t>() + rows.first * (int4 ? K / 2 : K);
            void* scales =
                int4 ? static_cast<void*>(MutablePackedGroupScales(W) + rows.first * (K / kQ4Group))
                     : static_cast<void*>(MutablePackedRowScales(W) + rows.first);
            QuantizeRowsImpl(src_dtype == DType::kBF16, src.data(), stride,
                             static_cast<size_t>(rows.count), static_cast<size_t>(K), int4, packed,
                             scales);
            ExpectSameBytes(
                W, want.view(),
                std::string(DTypeName(dtype)) + " from " + std::string(DTypeName(src_dtype)) +
                    " K=" + std::to_string(K) + " rows=" + std::to_string(rows.count) + " first=" +
                    std::to_string(rows.first) + " stride=" + std::to_string(stride_elems));
          }
        }
      }
    }
  }
}

// Every 16-bit pattern once as a bf16 source (all NaN payloads, infinities, denormals, both
// zeros): 2048 rows of 32, in two orders so that each value meets different neighbours.
HWY_NOINLINE void TestEveryBF16Value() {
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  for (const std::vector<uint16_t>& values : {all, shuffled}) {
    const int64_t K = 32, N = static_cast<int64_t>(values.size()) / K;
    const auto* src = reinterpret_cast<const std::byte*>(values.data());
    for (DType dtype : {DType::kQ8, DType::kQ4}) {
      const bool int4 = IsInt4RowsDType(dtype);
      OwnedTensor want = Filled(dtype, N, K), got = Filled(dtype, N, K);
      std::vector<float> row(K);
      for (int64_t r = 0; r < N; ++r) {
        ConvertToF32(DType::kBF16, src + r * K * 2, row.data(), K);
        QuantizeRow(row.data(), want.view(), r);
      }
      const Tensor& W = got.view();
      QuantizeRowsImpl(true, src, K * 2, static_cast<size_t>(N), K, int4, W.data_as<uint8_t>(),
                       int4 ? static_cast<void*>(MutablePackedGroupScales(W))
                            : static_cast<void*>(MutablePackedRowScales(W)));
      ExpectSameBytes(W, want.view(), std::string("every bf16, ") + std::string(DTypeName(dtype)));
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(QuantizeRowsTargetTest);
HWY_EXPORT_AND_TEST_P(QuantizeRowsTargetTest, TestQuantizeRowsMatchesQuantizeRow);
HWY_EXPORT_AND_TEST_P(QuantizeRowsTargetTest, TestEveryBF16Value);

namespace {

// The public entry point, on whatever target the machine picks: bf16, f16 (widened a row at a
// time) and f32 sources against the scalar path, into rows in the middle of the matrix.
TEST(QuantizeRowsDispatchTest, MatchesQuantizeRow) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kQ8, DType::kQ8A8, DType::kQ4, DType::kQ4A8}) {
    for (DType src_dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const int64_t N = 9, K = 256, first = 3, rows = 5;
      const size_t stride = (K + 1) * DTypeSize(src_dtype);
      std::vector<std::byte> src(rows * stride);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> v(K);
        for (float& x : v) x = std::normal_distribution<float>(0.0f, 0.05f)(rng);
        v[r * 7] = r == 2 ? NAN : 1e5f;  // beyond f16's range for an f16 source: Inf
        ConvertFromF32(v.data(), src_dtype, src.data() + r * stride, K);
      }
      OwnedTensor want(dtype, {N, K}), got(dtype, {N, K});
      std::vector<float> row(K);
      for (int64_t r = 0; r < rows; ++r) {
        ConvertToF32(src_dtype, src.data() + r * stride, row.data(), K);
        QuantizeRow(row.data(), want.view(), first + r);
      }
      QuantizeRows(src_dtype, src.data(), stride, rows, got.view(), first);
      EXPECT_EQ(std::memcmp(got.view().data(), want.view().data(), want.view().bytes()), 0)
          << DTypeName(dtype) << " from " << DTypeName(src_dtype);
      QuantizeRows(src_dtype, src.data(), stride, 0, got.view(), N);  // nothing, at the end
    }
  }
}

// GGML block rows (GGUF files): each row dequantized (DequantizeGgmlRowRef, the twin of what
// QuantizeRows calls) then QuantizeRow, byte for byte: every block format into every packed
// dtype, blocks quantized from plausible rows and blocks of random bytes (NaN and infinite
// scales included), rows a few bytes further apart than they are long.
TEST(QuantizeRowsDispatchTest, GgmlBlockRowsMatchDequantizeThenQuantizeRow) {
  std::mt19937 rng(8);
  for (DType src_dtype : {DType::kGgmlQ8_0, DType::kGgmlQ4_0, DType::kGgmlQ4_1, DType::kGgmlQ5_0,
                          DType::kGgmlQ5_1, DType::kGgmlQ4_K, DType::kGgmlQ5_K, DType::kGgmlQ6_K}) {
    for (DType dtype : {DType::kQ8, DType::kQ8A8, DType::kQ4, DType::kQ4A8}) {
      const int64_t N = 8, K = 512, first = 2, rows = 5;
      const size_t row_bytes = StoredRowBytes(src_dtype, K), stride = row_bytes + 3;
      std::vector<std::byte> src(rows * stride, std::byte{0xff});
      for (int64_t r = 0; r < rows; ++r) {
        std::byte* to = src.data() + r * stride;
        if (r == 3) {  // random bytes
          for (size_t i = 0; i < row_bytes; ++i) to[i] = static_cast<std::byte>(rng());
          continue;
        }
        std::vector<float> v(K);
        for (float& x : v) x = std::normal_distribution<float>(0.0f, 0.05f)(rng);
        ref::QuantizeGgmlRowRef(src_dtype, v.data(), to, K);
      }
      OwnedTensor want(dtype, {N, K}), got(dtype, {N, K});
      std::memset(want.view().data(), 0xa5, want.view().bytes());
      std::memset(got.view().data(), 0xa5, got.view().bytes());
      std::vector<float> row(K);
      for (int64_t r = 0; r < rows; ++r) {
        ref::DequantizeGgmlRowRef(src_dtype, src.data() + r * stride, row.data(), K);
        QuantizeRow(row.data(), want.view(), first + r);
      }
      QuantizeRows(src_dtype, src.data(), stride, rows, got.view(), first);
      EXPECT_EQ(std::memcmp(got.view().data(), want.view().data(), want.view().bytes()), 0)
          << DTypeName(dtype) << " from " << DTypeName(src_dtype);
    }
  }
  OwnedTensor W(DType::kQ8, {2, 96});
  std::vector<std::byte> src(1024);
  EXPECT_DEATH(QuantizeRows(DType::kGgmlQ4_K, src.data(), 512, 1, W.view(), 0),
               "q4_k row of 96 weights");
  EXPECT_DEATH(QuantizeRows(DType::kGgmlQ8_0, src.data(), 101, 1, W.view(), 0),
               "source rows of 102 bytes 101 bytes apart overlap");
}

TEST(QuantizeRowsDispatchTest, RejectsBadArguments) {
  OwnedTensor W(DType::kQ4, {4, 64}), bf16(DType::kBF16, {4, 64});
  std::vector<std::byte> src(4 * 64 * 4);
  EXPECT_DEATH(QuantizeRows(DType::kI8, src.data(), 64, 1, W.view(), 0), "not i8");
  EXPECT_DEATH(QuantizeRows(DType::kBF16, src.data(), 128, 1, bf16.view(), 0),
               "is not a packed weight format");
  EXPECT_DEATH(QuantizeRows(DType::kBF16, src.data(), 128, 2, W.view(), 3), "2 rows from row 3 of");
  EXPECT_DEATH(QuantizeRows(DType::kBF16, src.data(), 128, -1, W.view(), 0),
               "-1 rows from row 0 of");
  EXPECT_DEATH(QuantizeRows(DType::kF32, src.data(), 128, 2, W.view(), 0), "overlap");
  EXPECT_DEATH(QuantizeRows(DType::kBF16, src.data(), 128, INT64_MAX, W.view(), 2),
               "9223372036854775807 rows from row 2 of");
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
