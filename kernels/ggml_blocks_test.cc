// GGML's block formats: DequantizeGgmlRow on every compiled SIMD target against its scalar twin
// DequantizeGgmlRowRef, bit for bit (NaN payloads included), over every format, many row lengths
// and random blocks whose bytes take every value (all codes and nibbles, hostile f16 scales:
// infinities, NaNs of both kinds and signs, subnormals, zeros); every f16 and bf16 pattern; the
// twin against an independent numpy definition (kernels/testdata/ggml_dequant_reference.py);
// QuantizeGgmlRowRef's error bounds; the dispatched entry point and its errors.

#include "kernels/ggml_blocks.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/ref/ggml_blocks_ref.h"

// Helpers shared by the per-target tests and the others, compiled once (foreach_target.h
// re-includes this file per target).
#ifndef MOESERVE_KERNELS_GGML_BLOCKS_TEST_HELPERS_
#define MOESERVE_KERNELS_GGML_BLOCKS_TEST_HELPERS_
namespace moeserve::kernels::ggml_test {

inline constexpr DType kBlockFormats[] = {
    DType::kGgmlQ8_0, DType::kGgmlQ4_0, DType::kGgmlQ4_1, DType::kGgmlQ5_0,
    DType::kGgmlQ5_1, DType::kGgmlQ4_K, DType::kGgmlQ5_K, DType::kGgmlQ6_K,
};
inline constexpr DType kPlainFormats[] = {DType::kF32, DType::kF16, DType::kBF16};

// Byte offsets of a block's f16 scales.
inline std::vector<size_t> ScaleOffsets(DType dtype) {
  switch (dtype) {
    case DType::kGgmlQ4_1:
    case DType::kGgmlQ5_1:
    case DType::kGgmlQ4_K:
    case DType::kGgmlQ5_K:
      return {0, 2};
    case DType::kGgmlQ6_K:
      return {208};
    default:
      return {0};
  }
}

// An f16 scale: a quarter hostile (infinities, NaNs, subnormals, zeros, the extremes), a half of
// moderate size, the rest any bits.
inline uint16_t TestScale(std::mt19937& rng) {
  static constexpr uint16_t kHostile[] = {
      0x7c00, 0xfc00,          // ±inf
      0x7e00, 0xfe00,          // quiet NaNs
      0x7d55, 0xfc01,          // signalling NaNs with payloads
      0x7fff, 0xffff,          // NaNs with every payload bit
      0x0001, 0x8001, 0x03ff,  // subnormals
      0x0000, 0x8000,          // ±0
      0x7bff, 0xfbff, 0x0400,  // ±65504, the smallest normal
  };
  switch (rng() % 4) {
    case 0:
      return kHostile[rng() % std::size(kHostile)];
    case 1:
    case 2:
      return F32ToF16(std::ldexp(static_cast<float>(rng() % 2048) / 1024.0f - 1.0f,
                                 static_cast<int>(rng() % 20) - 14));
    default:
      return static_cast<uint16_t>(rng());
  }
}

// `count` random blocks of `dtype` (every byte uniform, then the scales from TestScale); for
// f32, f16 and bf16, `count` values of random bits.
inline std::vector<std::byte> TestBlocks(std::mt19937& rng, DType dtype, int64_t count) {
  const size_t bytes = GgmlBlockBytes(dtype);
  std::vector<std::byte> b(bytes * static_cast<size_t>(count));
  for (std::byte& x : b) x = static_cast<std::byte>(rng());
  if (!IsGgmlBlockDType(dtype)) return b;
  for (int64_t k = 0; k < count; ++k) {
    for (size_t offset : ScaleOffsets(dtype)) {
      const uint16_t s = TestScale(rng);
      std::memcpy(b.data() + k * bytes + offset, &s, sizeof(s));
    }
  }
  return b;
}

// The index of the first value whose bits differ, or -1.
inline int64_t FirstDifference(const float* got, const float* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (F32Bits(got[i]) != F32Bits(want[i])) return i;
  }
  return -1;
}

inline std::string Bits(float f) {
  char s[16];
  std::snprintf(s, sizeof(s), "0x%08x", F32Bits(f));
  return s;
}

}  // namespace moeserve::kernels::ggml_test
#endif  // MOESERVE_KERNELS_GGML_BLOCKS_TEST_HELPERS_

// foreach_target.h re-includes this file once per target; the per-target tests below call that
// target's DequantizeGgmlRowImpl from ggml_blocks-inl.h directly, not through the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ggml_blocks_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/test_util-inl.h"
#include "kernels/ggml_blocks-inl.h"
#include "core/test_paths.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
// Unnamed: these helpers and tests exist once per target in every test file of the binary.
namespace {

using namespace ::moeserve::kernels::ggml_test;  // NOLINT

constexpr uint32_t kSentinel = 0x7fbadbadu;

// This target's DequantizeGgmlRowImpl on `count` blocks (values) of `src`, read from an odd
// address, against the twin, bit for bit; the 16 floats past the row stay untouched.
void ExpectMatchesTwin(DType dtype, const std::vector<std::byte>& src, int64_t count) {
  const int64_t n = count * GgmlBlockWeights(dtype);
  std::vector<std::byte> odd(src.size() + 1);
  std::copy(src.begin(), src.end(), odd.begin() + 1);
  std::vector<float> want(n), got(n + 16, F32FromBits(kSentinel));
  ref::DequantizeGgmlRowRef(dtype, src.data(), want.data(), n);
  DequantizeGgmlRowImpl(dtype, odd.data() + 1, got.data(), static_cast<size_t>(n));
  const int64_t i = FirstDifference(got.data(), want.data(), n);
  EXPECT_EQ(i, -1) << DTypeName(dtype) << " n=" << n << " target=" << hwy::TargetName(HWY_TARGET)
                   << ": weight " << i << " is " << Bits(got[std::max<int64_t>(i, 0)]) << ", want "
                   << Bits(want[std::max<int64_t>(i, 0)]);
  for (int64_t k = n; k < n + 16; ++k) {
    ASSERT_EQ(F32Bits(got[k]), kSentinel)
        << DTypeName(dtype) << " n=" << n << " wrote past the row";
  }
}

HWY_NOINLINE void TestBlockFormatsMatchTwin() {
  std::mt19937 rng(41);
  for (DType dtype : kBlockFormats) {
    for (int64_t count : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 64, 129}) {
      for (int rep = 0; rep < (count < 16 ? 8 : 2); ++rep) {
        ExpectMatchesTwin(dtype, TestBlocks(rng, dtype, count), count);
      }
    }
  }
}

HWY_NOINLINE void TestPlainFormatsMatchTwin() {
  std::mt19937 rng(42);
  for (DType dtype : kPlainFormats) {
    for (int64_t n = 0; n <= 70; ++n) ExpectMatchesTwin(dtype, TestBlocks(rng, dtype, n), n);
    ExpectMatchesTwin(dtype, TestBlocks(rng, dtype, 4099), 4099);
  }
}

// Every 16-bit pattern as f16 and as bf16 (all NaN payloads, infinities, subnormals, zeros).
HWY_NOINLINE void TestEveryF16AndBF16() {
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<std::byte> src(all.size() * 2);
  std::memcpy(src.data(), all.data(), src.size());
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    ExpectMatchesTwin(dtype, src, static_cast<int64_t>(all.size()));
  }
}

}  // namespace
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace moeserve::kernels {

HWY_BEFORE_TEST(GgmlBlocksTargetTest);
HWY_EXPORT_AND_TEST_P(GgmlBlocksTargetTest, TestBlockFormatsMatchTwin);
HWY_EXPORT_AND_TEST_P(GgmlBlocksTargetTest, TestPlainFormatsMatchTwin);
HWY_EXPORT_AND_TEST_P(GgmlBlocksTargetTest, TestEveryF16AndBF16);

namespace {

using namespace ggml_test;  // NOLINT

// ---- The dispatched entry point. ----

TEST(GgmlBlocksDispatchTest, MatchesTwin) {
  std::mt19937 rng(7);
  for (DType dtype : kBlockFormats) {
    const int64_t count = 9, n = count * GgmlBlockWeights(dtype);
    const std::vector<std::byte> src = TestBlocks(rng, dtype, count);
    ASSERT_EQ(src.size(), StoredRowBytes(dtype, n));
    std::vector<float> want(n), got(n);
    ref::DequantizeGgmlRowRef(dtype, src.data(), want.data(), n);
    DequantizeGgmlRow(dtype, src.data(), got.data(), n);
    EXPECT_EQ(FirstDifference(got.data(), want.data(), n), -1) << DTypeName(dtype);
    DequantizeGgmlRow(dtype, nullptr, nullptr, 0);  // nothing
  }
}

TEST(GgmlBlocksDispatchTest, RejectsBadArguments) {
  std::vector<std::byte> src(1024);
  std::vector<float> out(512);
  EXPECT_DEATH(DequantizeGgmlRow(DType::kGgmlQ4_K, src.data(), out.data(), 100),
               "q4_k row of 100 weights");
  EXPECT_DEATH(DequantizeGgmlRow(DType::kGgmlQ8_0, src.data(), out.data(), 33),
               "q8_0 row of 33 weights");
  EXPECT_DEATH(DequantizeGgmlRow(DType::kI8, src.data(), out.data(), 4),
               "i8 is not a GGML block format");
  EXPECT_DEATH(DequantizeGgmlRow(DType::kQ4, src.data(), out.data(), 32),
               "int4 is not a GGML block format");
  EXPECT_DEATH(DequantizeGgmlRow(DType::kF32, src.data(), out.data(), -1), "");
  EXPECT_DEATH(ref::DequantizeGgmlRowRef(DType::kGgmlQ6_K, src.data(), out.data(), 255),
               "q6_k row of 255 weights");
  EXPECT_DEATH(ref::QuantizeGgmlRowRef(DType::kGgmlQ5_0, out.data(), src.data(), 48),
               "q5_0 row of 48 weights");
}

// ---- Hand-made blocks: the layouts, one field at a time. ----

std::vector<std::byte> Bytes(std::initializer_list<int> values, size_t size) {
  std::vector<std::byte> b(size);
  size_t i = 0;
  for (int v : values) b[i++] = static_cast<std::byte>(v);
  return b;
}

TEST(GgmlBlocksLayoutTest, HandMadeBlocks) {
  std::vector<float> y(256);
  // Q8_0: d = 0.5 (0x3800), q[0] = -3, q[31] = 100.
  std::vector<std::byte> q8 = Bytes({0x00, 0x38, 0xfd}, 34);
  q8[33] = std::byte{100};
  DequantizeGgmlRow(DType::kGgmlQ8_0, q8.data(), y.data(), 32);
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[31], 50.0f);
  // Q4_0: d = 2 (0x4000); byte 0 = 0xf1: weight 0 = (1 - 8) 2, weight 16 = (15 - 8) 2.
  DequantizeGgmlRow(DType::kGgmlQ4_0, Bytes({0x00, 0x40, 0xf1}, 18).data(), y.data(), 32);
  EXPECT_EQ(y[0], -14.0f);
  EXPECT_EQ(y[16], 14.0f);
  EXPECT_EQ(y[1], -16.0f);
  // Q4_1: d = 1, m = -1 (0xbc00); byte 1 = 0x3a: weight 1 = 10 - 1, weight 17 = 3 - 1.
  DequantizeGgmlRow(DType::kGgmlQ4_1, Bytes({0x00, 0x3c, 0x00, 0xbc, 0, 0x3a}, 20).data(), y.data(),
                    32);
  EXPECT_EQ(y[1], 9.0f);
  EXPECT_EQ(y[17], 2.0f);
  EXPECT_EQ(y[0], -1.0f);
  // Q5_0: d = 1; fifth bits 0x80000001 (weights 0 and 31); byte 15 = 0xf0: weight 31 = 31 - 16.
  std::vector<std::byte> q50 = Bytes({0x00, 0x3c, 0x01, 0, 0, 0x80}, 22);
  q50[21] = std::byte{0xf0};
  DequantizeGgmlRow(DType::kGgmlQ5_0, q50.data(), y.data(), 32);
  EXPECT_EQ(y[0], 0.0f);     // 16 - 16
  EXPECT_EQ(y[15], -16.0f);  // 0 - 16
  EXPECT_EQ(y[31], 15.0f);
  // Q5_1: d = 1, m = 0.5; fifth bit of weight 16; byte 0 = 0x20: weight 16 = 16 + 2.
  DequantizeGgmlRow(DType::kGgmlQ5_1, Bytes({0x00, 0x3c, 0x00, 0x38, 0, 0, 1, 0, 0x20}, 24).data(),
                    y.data(), 32);
  EXPECT_EQ(y[16], 18.5f);
  EXPECT_EQ(y[0], 0.5f);
  // Q4_K: d = 1, dmin = 1; sub-block 1: sc = 3, m = 2 (bytes 1, 5); sub-block 6: sc = 0x25
  // (low nibble 5 in byte 10, top bits 2 in byte 2), m = 0x13 (high nibble 3 in byte 10, top
  // bits 1 in byte 6); qs byte 0 = 0x70 (sub-block 1 weight 0 = 7), byte 96 = 0x09 (sub-block
  // 6 weight 0 = 9).
  std::vector<std::byte> q4k =
      Bytes({0x00, 0x3c, 0x00, 0x3c, 0, 3, 0x80, 0, 0, 2, 0x40, 0, 0, 0, 0x35, 0, 0x70}, 144);
  q4k[16 + 96] = std::byte{0x09};
  DequantizeGgmlRow(DType::kGgmlQ4_K, q4k.data(), y.data(), 256);
  EXPECT_EQ(y[32], 3.0f * 7 - 2);
  EXPECT_EQ(y[33], -2.0f);
  EXPECT_EQ(y[192], 37.0f * 9 - 19);
  // Q5_K: the same scales; qh byte 0 = 0x42: fifth bits of sub-blocks 1 and 6's weight 0.
  std::vector<std::byte> q5k(176);
  std::copy(q4k.begin(), q4k.begin() + 16, q5k.begin());
  q5k[16] = std::byte{0x42};
  q5k[48] = std::byte{0x70};
  q5k[48 + 96] = std::byte{0x09};
  DequantizeGgmlRow(DType::kGgmlQ5_K, q5k.data(), y.data(), 256);
  EXPECT_EQ(y[32], 3.0f * 23 - 2);
  EXPECT_EQ(y[192], 37.0f * 25 - 19);
  EXPECT_EQ(y[0], 0.0f);
  // Q6_K: d = 1 (0x3c00 at 208); scales[s] = s + 1. Weight 200 = 128 + 64 + 8 (h 1, t 2, i 8):
  // high nibble of ql[64 + 8], bits 4..5 of qh[32 + 8]; code 0x2b = 43 -> (13) (43 - 32).
  std::vector<std::byte> q6k(210);
  for (int s = 0; s < 16; ++s) q6k[192 + s] = static_cast<std::byte>(s + 1);
  q6k[208] = std::byte{0x00};
  q6k[209] = std::byte{0x3c};
  q6k[64 + 8] = std::byte{0xb0};
  q6k[128 + 32 + 8] = std::byte{0x20};
  DequantizeGgmlRow(DType::kGgmlQ6_K, q6k.data(), y.data(), 256);
  EXPECT_EQ(y[200], 13.0f * 11);
  EXPECT_EQ(y[199], 13.0f * -32);
  EXPECT_EQ(y[0], 1.0f * -32);
}

// ---- The quantizers. ----

float F16Field(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return F16ToF32(h);
}

// Sub-block j's 6-bit scale in Q4_K's and Q5_K's 12 packed bytes (ggml's get_scale_min_k4).
int KScale(const std::byte* packed, int j) {
  const auto p = [&](int i) { return static_cast<int>(packed[i]); };
  return j < 4 ? p(j) & 63 : (p(j + 4) & 15) | (p(j - 4) >> 6) << 4;
}

// Integers on each format's grid come back exactly (ggml's quantizers on values they represent).
TEST(GgmlQuantizeTest, GridValuesRoundTrip) {
  std::vector<float> x(32), y(32);
  std::vector<std::byte> b(34);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(4 * i - 127 + (i == 31 ? 3 : 0));
  ref::QuantizeGgmlRowRef(DType::kGgmlQ8_0, x.data(), b.data(), 32);  // d = 127 / 127
  ref::DequantizeGgmlRowRef(DType::kGgmlQ8_0, b.data(), y.data(), 32);
  EXPECT_EQ(y, x);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 16 - 8);  // d = -8 / -8
  ref::QuantizeGgmlRowRef(DType::kGgmlQ4_0, x.data(), b.data(), 32);
  ref::DequantizeGgmlRowRef(DType::kGgmlQ4_0, b.data(), y.data(), 32);
  EXPECT_EQ(y, x);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.25f;  // d = -4 / -16
  ref::QuantizeGgmlRowRef(DType::kGgmlQ5_0, x.data(), b.data(), 32);
  ref::DequantizeGgmlRowRef(DType::kGgmlQ5_0, b.data(), y.data(), 32);
  EXPECT_EQ(y, x);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>((i * 7) % 16) * 0.5f + 3.0f;
  ref::QuantizeGgmlRowRef(DType::kGgmlQ4_1, x.data(), b.data(), 32);  // d = 7.5 / 15, m = 3
  ref::DequantizeGgmlRowRef(DType::kGgmlQ4_1, b.data(), y.data(), 32);
  EXPECT_EQ(y, x);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(31 - i) - 10.0f;
  ref::QuantizeGgmlRowRef(DType::kGgmlQ5_1, x.data(), b.data(), 32);  // d = 1, m = -10
  ref::DequantizeGgmlRowRef(DType::kGgmlQ5_1, b.data(), y.data(), 32);
  EXPECT_EQ(y, x);
}

// A test row: per block of 32 values, normal with a random sigma (0.05 .. 50, so that every f16
// scale is normal) around 0, shifted to all positive or all negative, zeros, or a constant.
std::vector<float> TestRow(std::mt19937& rng, int64_t n) {
  std::vector<float> x(n);
  for (int64_t k = 0; k < n; k += 32) {
    const float sigma = std::pow(10.0f, std::uniform_real_distribution<float>(-1.3f, 1.7f)(rng));
    const int kind = static_cast<int>(rng() % 8);
    const float shift = kind == 0 ? 4 * sigma : kind == 1 ? -4 * sigma : 0.0f;
    for (int64_t i = k; i < k + 32; ++i) {
      x[i] = kind == 2   ? 0.0f
             : kind == 3 ? sigma
                         : std::normal_distribution<float>(shift, sigma)(rng);
    }
  }
  return x;
}

// Each value within the format's bound of its block (sub-block) after QuantizeGgmlRowRef then
// DequantizeGgmlRowRef: the legacy formats within half a step (a whole step for Q4_0 and Q5_0,
// whose top code is one short on the side opposite the largest magnitude) plus the f16 rounding of
// d and m; the K formats within half of their sub-block's decoded step, that step as small as
// ggml_blocks_ref.h promises.
TEST(GgmlQuantizeTest, ErrorWithinTheStep) {
  std::mt19937 rng(3);
  constexpr double kF16 = 1.0 / 2048;  // f16's relative rounding
  for (DType dtype : kBlockFormats) {
    const int64_t n = 256 * 12;
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<float> x = TestRow(rng, n);
      std::vector<std::byte> b(StoredRowBytes(dtype, n));
      std::vector<float> y(n);
      ref::QuantizeGgmlRowRef(dtype, x.data(), b.data(), n);
      ref::DequantizeGgmlRowRef(dtype, b.data(), y.data(), n);
      const int64_t block = GgmlBlockWeights(dtype);
      const size_t bytes = GgmlBlockBytes(dtype);
      for (int64_t k = 0; k < n / block; ++k) {
        const float* xb = x.data() + k * block;
        const float* yb = y.data() + k * block;
        const std::byte* bb = b.data() + k * bytes;
        // (bound, step limit) per sub-block of `sub` values.
        const int64_t sub = dtype == DType::kGgmlQ6_K ? 16 : 32;
        for (int64_t s = 0; s < block / sub; ++s) {
          double lo = 0, hi = -1e30, amax = 0, lo_signed = 1e30;
          for (int64_t i = s * sub; i < (s + 1) * sub; ++i) {
            lo = std::min<double>(lo, xb[i]);
            lo_signed = std::min<double>(lo_signed, xb[i]);
            hi = std::max<double>(hi, xb[i]);
            amax = std::max<double>(amax, std::fabs(xb[i]));
          }
          double bound = 0;
          switch (dtype) {
            case DType::kGgmlQ8_0:
              bound = amax / 127 * (0.5 + 127 * kF16);
              break;
            case DType::kGgmlQ4_0:
              bound = amax / 8 * (1 + 8 * kF16);
              break;
            case DType::kGgmlQ5_0:
              bound = amax / 16 * (1 + 16 * kF16);
              break;
            case DType::kGgmlQ4_1:
            case DType::kGgmlQ5_1: {
              const double top = dtype == DType::kGgmlQ4_1 ? 15 : 31;
              bound = (hi - lo_signed) / top * (0.5 + top * kF16) + std::fabs(lo_signed) * kF16;
              break;
            }
            case DType::kGgmlQ4_K:
            case DType::kGgmlQ5_K: {
              const double top = dtype == DType::kGgmlQ4_K ? 15 : 31;
              const double d = F16Field(bb), dmin = F16Field(bb + 2);
              const double step = d * KScale(bb + 4, static_cast<int>(s));
              EXPECT_LE(step, ((hi - lo) + dmin) / top * (1 + 1e-6) + d)
                  << DTypeName(dtype) << " block " << k << " sub-block " << s;
              bound = 0.5 * step * (1 + 1e-6) + 1e-6 * (amax - lo);
              break;
            }
            case DType::kGgmlQ6_K: {
              const double d = F16Field(bb + 208);
              const int sc = static_cast<int8_t>(bb[192 + s]);
              const double step = d * sc;
              EXPECT_LE(step, amax / 31 * (1 + 1e-6) + d)
                  << DTypeName(dtype) << " block " << k << " sub-block " << s;
              bound = 0.5 * step * (1 + 1e-6) + 1e-6 * amax;
              break;
            }
            default:
              FAIL();
          }
          for (int64_t i = s * sub; i < (s + 1) * sub; ++i) {
            ASSERT_LE(std::fabs(static_cast<double>(yb[i]) - xb[i]), bound * (1 + 1e-6) + 1e-30)
                << DTypeName(dtype) << " block " << k << " value " << i << ": " << xb[i] << " -> "
                << yb[i];
          }
        }
      }
    }
  }
}

// Non-finite, huge and tiny inputs: blocks without undefined behaviour (UBSan in the asan build
// checks); their values are unspecified.
TEST(GgmlQuantizeTest, HostileInputsGiveBlocks) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            kInf,
                            -kInf,
                            3e38f,
                            -3e38f,
                            1e-40f,
                            -0.0f,
                            0.0f,
                            1e6f};
  std::mt19937 rng(9);
  for (DType dtype : kBlockFormats) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> x = TestRow(rng, 256);
      for (int i = 0; i < 256; ++i) {
        if (rng() % (1 + rep % 5) == 0) x[i] = specials[rng() % std::size(specials)];
      }
      std::vector<std::byte> b(StoredRowBytes(dtype, 256));
      std::vector<float> y(256);
      ref::QuantizeGgmlRowRef(dtype, x.data(), b.data(), 256);
      ref::DequantizeGgmlRowRef(dtype, b.data(), y.data(), 256);
    }
  }
}

TEST(GgmlQuantizeTest, PlainFormatsConvert) {
  const std::vector<float> x = {1.0f, -2.5f, 1e-8f, 65520.0f};
  std::vector<std::byte> b(16);
  std::vector<float> y(4);
  for (DType dtype : kPlainFormats) {
    ref::QuantizeGgmlRowRef(dtype, x.data(), b.data(), 4);
    DequantizeGgmlRow(dtype, b.data(), y.data(), 4);
    std::vector<float> want(4);
    std::vector<std::byte> conv(16);
    ConvertFromF32(x.data(), dtype, conv.data(), 4);
    ConvertToF32(dtype, conv.data(), want.data(), 4);
    EXPECT_EQ(FirstDifference(y.data(), want.data(), 4), -1) << DTypeName(dtype);
  }
}

// ---- The independent numpy definition. ----

// A python3 that has numpy: $MOESERVE_PYTHON3, python3 on the PATH, or Debian's /usr/bin/python3
// (where scripts/install-deps.sh puts python3-numpy); "" if none.
std::string PythonWithNumpy() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MOESERVE_PYTHON3"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const std::string& python : candidates) {
    const std::string probe = python + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void WriteFile(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// Random blocks of every format (hostile scales included, as in the SIMD tests) and blocks
// quantized from plausible rows, decoded by the numpy script and by the twin: the same bits.
TEST(GgmlBlocksNumpyTest, TwinMatchesIndependentReference) {
  const std::string python = PythonWithNumpy();
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy (python3-numpy)";
  std::string dir = ::testing::TempDir() + "ggml_blocks_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::mt19937 rng(17);
  struct Case {
    DType dtype;
    std::vector<std::byte> bytes;
    int64_t n;
  };
  std::vector<Case> cases;
  for (DType dtype : kBlockFormats) {
    const int64_t count = GgmlBlockWeights(dtype) == 32 ? 2048 : 256;
    cases.push_back({dtype, TestBlocks(rng, dtype, count), count * GgmlBlockWeights(dtype)});
    const int64_t n = 256 * 8;
    const std::vector<float> x = TestRow(rng, n);
    std::vector<std::byte> b(StoredRowBytes(dtype, n));
    ref::QuantizeGgmlRowRef(dtype, x.data(), b.data(), n);
    cases.push_back({dtype, b, n});
  }
  for (DType dtype : kPlainFormats) cases.push_back({dtype, TestBlocks(rng, dtype, 70000), 70000});
  std::string command =
      python + " " + MOESERVE_SOURCE_DIR + "/kernels/testdata/ggml_dequant_reference.py";
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string in = dir + "/" + std::to_string(c) + ".in";
    WriteFile(in, cases[c].bytes);
    command.append(" ").append(DTypeName(cases[c].dtype)).append(" ").append(in);
    command.append(" ").append(in).append(".out");
  }
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    const std::vector<char> got = ReadFile(dir + "/" + std::to_string(c) + ".in.out");
    ASSERT_EQ(got.size(), static_cast<size_t>(k.n) * sizeof(float)) << DTypeName(k.dtype);
    std::vector<float> numpy(k.n), want(k.n);
    std::memcpy(numpy.data(), got.data(), got.size());
    ref::DequantizeGgmlRowRef(k.dtype, k.bytes.data(), want.data(), k.n);
    const int64_t i = FirstDifference(want.data(), numpy.data(), k.n);
    EXPECT_EQ(i, -1) << DTypeName(k.dtype) << " case " << c << ": weight " << i << " is "
                     << Bits(want[std::max<int64_t>(i, 0)]) << ", numpy "
                     << Bits(numpy[std::max<int64_t>(i, 0)]);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
