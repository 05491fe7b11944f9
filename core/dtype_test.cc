#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace moeserve {
namespace {

// Random-pattern sweeps: enough to hit every exponent and rounding case many times over.
constexpr int kRandomPatterns = 10'000'000;
// Failures reported per sweep before the rest are only counted (keeps a broken build readable).
constexpr int kMaxReported = 10;

bool IsNaNBits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
bool IsBF16NaN(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }
bool IsF16NaN(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

// ---- bf16 ----

TEST(BF16Test, AllPatternsRoundTripThroughF32) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BF16ToF32(b);
    EXPECT_EQ(F32Bits(f), i << 16) << "bf16 0x" << std::hex << i;
    const uint16_t back = F32ToBF16(f);
    if (IsBF16NaN(b)) {
      EXPECT_TRUE(IsBF16NaN(back)) << std::hex << i << " -> " << back;
      EXPECT_EQ(back & 0x8000u, b & 0x8000u) << std::hex << i << " -> " << back;
    } else {
      EXPECT_EQ(back, b) << std::hex << i;
    }
  }
}

TEST(BF16Test, RoundsHalfwayToEven) {
  // 0x3f80 (1.0) has an even mantissa: the exact halfway point to 0x3f81 rounds down.
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f808000u)), 0x3f80u);
  // 0x3f81 is odd: the halfway point to 0x3f82 rounds up.
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f818000u)), 0x3f82u);
  // The same with the sign bit set (rounding is on the magnitude).
  EXPECT_EQ(F32ToBF16(F32FromBits(0xbf808000u)), 0xbf80u);
  EXPECT_EQ(F32ToBF16(F32FromBits(0xbf818000u)), 0xbf82u);
  // A halfway tie whose round-up carries into the next binade: 0x3fff is odd.
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3fff8000u)), 0x4000u);
}

TEST(BF16Test, RoundsJustAboveAndBelowHalfway) {
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f808001u)), 0x3f81u);  // above the tie, even side
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f807fffu)), 0x3f80u);  // below the tie, even side
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f818001u)), 0x3f82u);  // above the tie, odd side
  EXPECT_EQ(F32ToBF16(F32FromBits(0x3f817fffu)), 0x3f81u);  // below the tie, odd side
  EXPECT_EQ(F32ToBF16(F32FromBits(0xc0490fdbu)), 0xc049u);  // -pi
}

TEST(BF16Test, LargestFiniteValuesRoundToInfinity) {
  // bf16's largest finite value is 0x7f7f; f32 values at or past the tie with "0x7f80" round up.
  EXPECT_EQ(F32ToBF16(F32FromBits(0x7f7f8000u)), 0x7f80u);
  EXPECT_EQ(F32ToBF16(F32FromBits(0x7f7fffffu)), 0x7f80u);  // FLT_MAX
  EXPECT_EQ(F32ToBF16(F32FromBits(0xff7fffffu)), 0xff80u);  // -FLT_MAX
  EXPECT_EQ(F32ToBF16(F32FromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(F32ToBF16(F32FromBits(0xff7f7fffu)), 0xff7fu);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80u);
}

TEST(BF16Test, ZerosAndDenormals) {
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000u);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000u);
  EXPECT_EQ(F32ToBF16(F32FromBits(0x00000001u)), 0x0000u);  // smallest f32 denormal
  EXPECT_EQ(F32ToBF16(F32FromBits(0x80000001u)), 0x8000u);
  EXPECT_EQ(F32ToBF16(F32FromBits(0x00010000u)), 0x0001u);  // smallest bf16 denormal, exact
  EXPECT_EQ(F32ToBF16(F32FromBits(0x00008000u)), 0x0000u);  // tie between 0 and 0x0001
  EXPECT_EQ(F32ToBF16(F32FromBits(0x00018000u)), 0x0002u);  // tie between 0x0001 and 0x0002
  EXPECT_EQ(F32ToBF16(F32FromBits(0x00008001u)), 0x0001u);
  EXPECT_EQ(F32ToBF16(F32FromBits(0x007fffffu)), 0x0080u);  // largest denormal -> FLT_MIN
  EXPECT_EQ(F32ToBF16(F32FromBits(0x807fffffu)), 0x8080u);
  EXPECT_EQ(BF16ToF32(0x0001u), F32FromBits(0x00010000u));
}

TEST(BF16Test, NaNsStayNaN) {
  // Payload only in the low 16 bits: truncation alone would produce infinity.
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(F32FromBits(0x7f800001u))));
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(F32FromBits(0x7f80ffffu))));
  EXPECT_EQ(F32ToBF16(F32FromBits(0xff800001u)) & 0x8000u, 0x8000u);
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(F32FromBits(0xff800001u))));
  // Signaling NaN with a high payload bit (quiet bit clear), and the all-ones payload, which must
  // not carry into the sign bit.
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(F32FromBits(0x7fa00000u))));
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(F32FromBits(0x7fffffffu))));
  EXPECT_EQ(F32ToBF16(F32FromBits(0x7fffffffu)) & 0x8000u, 0u);
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::numeric_limits<float>::signaling_NaN())));
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::signaling_NaN()))));
}

// The value of bf16 magnitude bits `m` (sign clear), where m == 0x7f80 stands for 2^128: the
// value the next bf16 step past the largest finite would have with an unbounded exponent. That is
// the value IEEE rounding compares against before it decides to overflow to infinity.
double BF16MagnitudeValue(uint16_t m) {
  if (m == 0x7f80u) return std::ldexp(1.0, 128);
  return static_cast<double>(BF16ToF32(m));
}

// Reference f32 -> bf16: pick the nearer of the two bf16 neighbours by comparing distances in
// double (exact: both differences fit in 53 bits), ties to the even mantissa.
uint16_t ReferenceF32ToBF16(uint32_t u) {
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs == 0x7f800000u) return sign | 0x7f80u;
  const double x = static_cast<double>(F32FromBits(abs));
  const uint16_t below = static_cast<uint16_t>(abs >> 16);  // truncation: the neighbour <= x
  const uint16_t above = static_cast<uint16_t>(below + 1);
  const double d_below = x - BF16MagnitudeValue(below);
  const double d_above = BF16MagnitudeValue(above) - x;
  uint16_t m;
  if (d_below < d_above) {
    m = below;
  } else if (d_above < d_below) {
    m = above;
  } else {
    m = (below & 1u) == 0 ? below : above;
  }
  return sign | m;
}

TEST(BF16Test, MatchesNearestEvenReferenceOnRandomPatterns) {
  std::mt19937 rng(20240611);
  int failures = 0;
  for (int i = 0; i < kRandomPatterns; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    const uint16_t got = F32ToBF16(F32FromBits(u));
    if (IsNaNBits(u)) {
      if (IsBF16NaN(got) && (got & 0x8000u) == ((u >> 16) & 0x8000u)) continue;
    } else if (got == ReferenceF32ToBF16(u)) {
      continue;
    }
    if (++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "f32 0x" << u << " -> 0x" << got << ", want 0x"
                    << ReferenceF32ToBF16(u);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(BF16Test, MatchesReferenceAtEveryHalfwayPoint) {
  // For every positive finite bf16 b: the tie with its successor and the f32 values on either
  // side of it, which is where rounding bugs live.
  int failures = 0;
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    const uint32_t tie = (b << 16) | 0x8000u;
    for (uint32_t u : {tie - 1, tie, tie + 1}) {
      for (uint32_t s : {0u, 0x80000000u}) {
        const uint16_t got = F32ToBF16(F32FromBits(u | s));
        const uint16_t want = ReferenceF32ToBF16(u | s);
        if (got != want && ++failures <= kMaxReported) {
          ADD_FAILURE() << std::hex << "f32 0x" << (u | s) << " -> 0x" << got << ", want 0x"
                        << want;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- f16 ----

uint16_t Float16Bits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, sizeof(u));
  return u;
}
_Float16 Float16FromBits(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, sizeof(h));
  return h;
}

TEST(F16Test, AllPatternsRoundTripThroughF32) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = F32ToF16(F16ToF32(h));
    if (IsF16NaN(h)) {
      EXPECT_TRUE(IsF16NaN(back)) << std::hex << i << " -> " << back;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u) << std::hex << i << " -> " << back;
    } else {
      EXPECT_EQ(back, h) << std::hex << i;
    }
  }
}

TEST(F16Test, F16ToF32MatchesCompilerForAllPatterns) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float got = F16ToF32(h);
    const float want = static_cast<float>(Float16FromBits(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << i;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << std::hex << i;
    } else {
      EXPECT_EQ(F32Bits(got), F32Bits(want)) << std::hex << i << ": " << got << " vs " << want;
    }
  }
}

TEST(F16Test, SpecialValues) {
  EXPECT_EQ(F32ToF16(0.0f), 0x0000u);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000u);
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00u);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bffu);                  // largest finite
  EXPECT_EQ(F32ToF16(F32FromBits(0x477fefffu)), 0x7bffu);  // just below the tie with "65536"
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00u);  // the tie rounds to even, which is infinity
  EXPECT_EQ(F32ToF16(-65520.0f), 0xfc00u);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000u);  // tie with 0: even
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -26)), 0x8000u);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400u);        // smallest normal
  EXPECT_EQ(F32ToF16(std::ldexp(1023.5f, -24)), 0x0400u);     // tie rounds up into the normals
  EXPECT_TRUE(IsF16NaN(F32ToF16(F32FromBits(0x7f800001u))));  // payload only in dropped bits
  EXPECT_TRUE(IsF16NaN(F32ToF16(std::numeric_limits<float>::signaling_NaN())));
  EXPECT_EQ(F32ToF16(F32FromBits(0xffc00000u)) & 0x8000u, 0x8000u);
}

// Compares F32ToF16 with the compiler's conversion (libgcc's soft-float __truncsfhf2, round to
// nearest even); for NaN only NaN-ness and sign are specified. Returns true on a match.
bool F32ToF16MatchesCompiler(uint32_t u, int* failures) {
  const float f = F32FromBits(u);
  const uint16_t got = F32ToF16(f);
  const uint16_t want = Float16Bits(static_cast<_Float16>(f));
  const bool ok = IsNaNBits(u) ? IsF16NaN(got) && (got & 0x8000u) == (want & 0x8000u) : got == want;
  if (!ok && ++*failures <= kMaxReported) {
    ADD_FAILURE() << std::hex << "f32 0x" << u << " -> 0x" << got << ", want 0x" << want;
  }
  return ok;
}

TEST(F16Test, F32ToF16MatchesCompilerOnRandomPatterns) {
  std::mt19937 rng(42);
  int failures = 0;
  for (int i = 0; i < kRandomPatterns; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 2 == 1) {
      // Half the patterns get an exponent in f16's neighbourhood (2^-27 .. 2^17): uniform bits
      // land there only one time in six.
      const uint32_t exp = 100 + static_cast<uint32_t>(rng() % 45);
      u = (u & 0x807fffffu) | (exp << 23);
    }
    F32ToF16MatchesCompiler(u, &failures);
  }
  EXPECT_EQ(failures, 0);
}

TEST(F16Test, F32ToF16MatchesCompilerAtEveryHalfwayPoint) {
  // Every finite f16 h, its f32 value, and the f32 values around the tie with its successor.
  int failures = 0;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float value = F16ToF32(static_cast<uint16_t>(h));
    // The successor of the largest finite f16 is 65536 as far as rounding is concerned.
    const float next = h == 0x7bffu ? 65536.0f : F16ToF32(static_cast<uint16_t>(h + 1));
    const uint32_t lo = F32Bits(value);
    const uint32_t tie = F32Bits((value + next) / 2);  // exact: f32 has 13 more mantissa bits
    for (uint32_t u : {lo, lo + 1, tie - 1, tie, tie + 1}) {
      F32ToF16MatchesCompiler(u, &failures);
      F32ToF16MatchesCompiler(u | 0x80000000u, &failures);
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- bulk conversions ----

TEST(ConvertTest, ToF32FromEveryComputeDType) {
  const std::vector<float> want = {0.0f, 1.0f, -2.5f, 100.0f, -0.125f};
  {
    std::vector<float> out(want.size());
    ConvertToF32(DType::kF32, want.data(), out.data(), want.size());
    EXPECT_EQ(out, want);
  }
  {
    std::vector<uint16_t> src;
    for (float f : want) src.push_back(F32ToBF16(f));
    std::vector<float> out(want.size());
    ConvertToF32(DType::kBF16, src.data(), out.data(), src.size());
    EXPECT_EQ(out, want);
  }
  {
    std::vector<uint16_t> src;
    for (float f : want) src.push_back(F32ToF16(f));
    std::vector<float> out(want.size());
    ConvertToF32(DType::kF16, src.data(), out.data(), src.size());
    EXPECT_EQ(out, want);
  }
  {
    const std::vector<int8_t> src = {-128, -1, 0, 1, 127};
    std::vector<float> out(src.size());
    ConvertToF32(DType::kI8, src.data(), out.data(), src.size());
    EXPECT_EQ(out, (std::vector<float>{-128.0f, -1.0f, 0.0f, 1.0f, 127.0f}));
  }
  {
    const std::vector<int32_t> src = {-2147483647 - 1, -7, 0, 7, 16777216};
    std::vector<float> out(src.size());
    ConvertToF32(DType::kI32, src.data(), out.data(), src.size());
    EXPECT_EQ(out, (std::vector<float>{-2147483648.0f, -7.0f, 0.0f, 7.0f, 16777216.0f}));
  }
}

TEST(ConvertTest, FromF32ToEveryOutputDType) {
  // 1.00390625 = 1 + 2^-8 is the bf16 tie between 1.0 and 1.0078125 (rounds to even: 1.0) and is
  // exact in f16.
  const std::vector<float> src = {0.0f, -1.0f, 1.00390625f, 3.0e5f, -0.1f};
  {
    std::vector<float> out(src.size());
    ConvertFromF32(src.data(), DType::kF32, out.data(), src.size());
    EXPECT_EQ(out, src);
  }
  {
    std::vector<uint16_t> out(src.size());
    ConvertFromF32(src.data(), DType::kBF16, out.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(out[i], F32ToBF16(src[i])) << i;
    EXPECT_EQ(out[2], 0x3f80u);
  }
  {
    std::vector<uint16_t> out(src.size());
    ConvertFromF32(src.data(), DType::kF16, out.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(out[i], F32ToF16(src[i])) << i;
    EXPECT_EQ(out[2], 0x3c04u);  // 1 + 4 * 2^-10
    EXPECT_EQ(out[3], 0x7c00u);  // 3e5 overflows f16
  }
}

TEST(ConvertTest, ZeroElementsTouchNothing) {
  ConvertToF32(DType::kBF16, nullptr, nullptr, 0);
  ConvertFromF32(nullptr, DType::kF16, nullptr, 0);
}

TEST(ConvertDeathTest, UnsupportedDTypesCheckFail) {
  float f = 0.0f;
  double d = 0.0;
  EXPECT_DEATH(ConvertToF32(DType::kF64, &d, &f, 1), "unsupported dtype f64");
  EXPECT_DEATH(ConvertFromF32(&f, DType::kI8, &d, 1), "unsupported dtype i8");
}

// ---- names and sizes ----

constexpr DType kAllDTypes[] = {
    DType::kBF16, DType::kF16, DType::kF32,  DType::kI8,     DType::kI32,
    DType::kF64,  DType::kI16, DType::kI64,  DType::kU8,     DType::kU16,
    DType::kU32,  DType::kU64, DType::kBool, DType::kF8E4M3, DType::kF8E5M2,
};

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kI16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kU16), 2u);
  EXPECT_EQ(DTypeSize(DType::kU32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E5M2), 1u);
}

// Block sizes as ggml-common.h's static_asserts give them.
TEST(DTypeTest, GgmlBlockFormats) {
  struct Expected {
    DType dtype;
    int64_t weights;
    size_t bytes;
  };
  for (const Expected& e : {Expected{DType::kGgmlQ8_0, 32, 2 + 32},
                            Expected{DType::kGgmlQ4_0, 32, 2 + 16},
                            Expected{DType::kGgmlQ4_1, 32, 2 + 2 + 16},
                            Expected{DType::kGgmlQ5_0, 32, 2 + 4 + 16},
                            Expected{DType::kGgmlQ5_1, 32, 2 + 2 + 4 + 16},
                            Expected{DType::kGgmlQ4_K, 256, 2 + 2 + 12 + 128},
                            Expected{DType::kGgmlQ5_K, 256, 2 + 2 + 12 + 32 + 128},
                            Expected{DType::kGgmlQ6_K, 256, 128 + 64 + 16 + 2}}) {
    EXPECT_TRUE(IsGgmlBlockDType(e.dtype)) << DTypeName(e.dtype);
    EXPECT_EQ(GgmlBlockWeights(e.dtype), e.weights) << DTypeName(e.dtype);
    EXPECT_EQ(GgmlBlockBytes(e.dtype), e.bytes) << DTypeName(e.dtype);
    EXPECT_EQ(StoredRowBytes(e.dtype, 4 * e.weights), 4 * e.bytes) << DTypeName(e.dtype);
    EXPECT_EQ(ParseDTypeName(DTypeName(e.dtype)), e.dtype);
  }
  EXPECT_FALSE(IsGgmlBlockDType(DType::kQ4));
  EXPECT_FALSE(IsGgmlBlockDType(DType::kF16));
  EXPECT_EQ(StoredRowBytes(DType::kBF16, 10), 20u);
  EXPECT_DEATH(StoredRowBytes(DType::kGgmlQ4_K, 100), "q4_k row of 100");
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType dtype : kAllDTypes) {
    const std::string_view name = DTypeName(dtype);
    const std::string_view st_name = SafetensorsDTypeName(dtype);
    EXPECT_EQ(ParseDTypeName(name), dtype) << name;
    EXPECT_EQ(ParseSafetensorsDType(st_name), dtype) << st_name;
    // The two spellings differ only in case.
    ASSERT_EQ(name.size(), st_name.size());
    for (size_t i = 0; i < name.size(); ++i) {
      EXPECT_EQ(std::toupper(static_cast<unsigned char>(name[i])), st_name[i]) << name;
    }
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(SafetensorsDTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(ParseSafetensorsDType("BOOL"), DType::kBool);
}

TEST(DTypeTest, UnknownNamesAreRejected) {
  EXPECT_EQ(ParseSafetensorsDType("bf16"), std::nullopt);  // safetensors spelling is upper case
  EXPECT_EQ(ParseSafetensorsDType("F4"), std::nullopt);
  EXPECT_EQ(ParseSafetensorsDType(""), std::nullopt);
  EXPECT_EQ(ParseDTypeName("BF16"), std::nullopt);
  EXPECT_EQ(ParseDTypeName("float32"), std::nullopt);
}

TEST(DTypeTest, ComputeDTypes) {
  for (DType dtype : kAllDTypes) {
    const bool want = dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 ||
                      dtype == DType::kI8 || dtype == DType::kI32;
    EXPECT_EQ(IsComputeDType(dtype), want) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace moeserve
