#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace moeserve::kernels {
namespace {

std::vector<float> RandomRow(int64_t K, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(K));
  for (float& v : row) v = dist(rng);
  return row;
}

// Every weight comes back within half a step of its group's (row's) scale, and the largest
// magnitude of each group exactly (it defines the scale; int4's f16 scale to within its rounding,
// 2^-11 relative).
TEST(QuantizeTest, RoundTripIsWithinHalfAStep) {
  for (DType dtype : {DType::kQ8, DType::kQ4}) {
    for (int64_t K : {32, 64, 96, 2048}) {
      const int64_t N = 5;
      OwnedTensor W(dtype, {N, K});
      const int64_t group = dtype == DType::kQ8 ? K : kQ4Group;
      const float levels = dtype == DType::kQ8 ? 127.0f : 7.0f;
      for (int64_t n = N - 1; n >= 0; --n) {  // any row order
        const std::vector<float> row = RandomRow(K, static_cast<uint32_t>(K + n), 0.02f * (n + 1));
        QuantizeRow(row.data(), W.view(), n);
        std::vector<float> back(static_cast<size_t>(K));
        DequantizeRow(W.view(), n, back.data());
        for (int64_t g = 0; g < K / group; ++g) {
          float amax = 0;
          for (int64_t k = g * group; k < (g + 1) * group; ++k)
            amax = std::max(amax, std::fabs(row[k]));
          const bool int4 = dtype == DType::kQ4;
          const float step = int4 ? F16ToF32(F32ToF16(amax / levels)) : amax / levels;
          for (int64_t k = g * group; k < (g + 1) * group; ++k) {
            ASSERT_LE(std::fabs(back[k] - row[k]), 0.5f * step * (1 + 1e-5f))
                << DTypeName(dtype) << " K=" << K << " n=" << n << " k=" << k;
            if (std::fabs(row[k]) == amax) {
              ASSERT_NEAR(std::fabs(back[k]), amax, amax * (int4 ? 0x1p-11f : 1e-6f));
            }
          }
        }
      }
    }
  }
}

// The int4 layout: byte j of a group holds element j (low nibble) and j + 16 (high), each q + 8.
TEST(QuantizeTest, Int4LayoutAndScales) {
  OwnedTensor W(DType::kQ4, {1, 32});
  std::vector<float> row(32);
  for (int k = 0; k < 32; ++k) row[k] = static_cast<float>((k % 15) - 7);  // -7 .. 7, scale 1
  QuantizeRow(row.data(), W.view(), 0);
  EXPECT_EQ(PackedGroupScales(W.view())[0], F32ToF16(1.0f));
  const uint8_t* b = W.view().data_as<const uint8_t>();
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(b[j] & 15, (j % 15) - 7 + 8) << j;
    EXPECT_EQ(b[j] >> 4, ((j + 16) % 15) - 7 + 8) << j;
  }
  EXPECT_EQ(W.view().bytes(), 64u + 2u);  // 16 bytes padded to a cache line, then one f16 scale
}

// Zero rows, NaN and infinite weights quantize to something finite (NaN to 0).
TEST(QuantizeTest, DegenerateRowsStayFinite) {
  for (DType dtype : {DType::kQ8, DType::kQ4}) {
    OwnedTensor W(dtype, {2, 32});
    std::vector<float> zeros(32, 0.0f), odd(32, 0.5f);
    odd[3] = std::numeric_limits<float>::quiet_NaN();
    odd[9] = std::numeric_limits<float>::infinity();
    QuantizeRow(zeros.data(), W.view(), 0);
    QuantizeRow(odd.data(), W.view(), 1);
    std::vector<float> back(32);
    DequantizeRow(W.view(), 0, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
    DequantizeRow(W.view(), 1, back.data());
    for (float v : back) EXPECT_TRUE(std::isfinite(v)) << DTypeName(dtype);
    EXPECT_EQ(back[3], 0.0f);
  }
}

TEST(QuantizeTest, PackingRules) {
  EXPECT_TRUE(CanPack(DType::kQ8, 7));
  EXPECT_TRUE(CanPack(DType::kQ4, 128));
  EXPECT_FALSE(CanPack(DType::kQ4, 64));
  EXPECT_FALSE(CanPack(DType::kQ4, 48));
  EXPECT_FALSE(CanPack(DType::kBF16, 64));
  EXPECT_EQ(TensorBytes(DType::kQ8, std::vector<int64_t>{3, 10}), 64u + 12u);
  EXPECT_EQ(TensorBytes(DType::kQ4, std::vector<int64_t>{4, 64}), 128u + 4u * 2u * 2u);
}

}  // namespace
}  // namespace moeserve::kernels
