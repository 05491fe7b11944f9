// Per-target bodies of the GGML block-format matmul (kernels/matmul_ggml.h has the arithmetic of
// both activation modes), for inclusion from foreach_target translation units:
// kernels/matmul_ggml.cc dispatches to them. The tiles walk a range of W rows with
// matmul_common-inl.h's ForEachPass, like every other format's.
//
//   kF32: each block of a tile's W rows is decoded by ggml_blocks-inl.h's block functions (the
//     bits of DequantizeGgmlRow) into an L1 buffer of the tile, then multiplied into the f32
//     accumulators one vector at a time for every x row of the pass.
//   kInt8: per block, the codes meet the quantized activations in integer dot products: on x86
//     from AVX2 on, vpmaddubsw (unsigned codes times signed p, pairs into int16) then vpmaddwd by
//     the sub-block's scale (pairs into int32, scaled), which leaves the spec's 8 lanes (bytes
//     4l .. 4l + 3 of each 32) in a vector's 8 int32 lanes: converted and fused into the 8 f32
//     accumulators with no horizontal sum until the output's end; elsewhere scalar loops. A pass
//     of several x rows decodes each K-quant block once for all of them (LanesBatch).
//
// Tiles never have fewer rows than their shape: a tile at the end of the range (or a pass at the
// end of the batch) repeats its last W row (x row) for the missing ones and does not store their
// outputs, so each format compiles one tile per x-row count, not one per shape.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/dtype.h"
#include "hwy/highway.h"
#include "kernels/ggml_blocks-inl.h"
#include "kernels/matmul_common-inl.h"
#include "kernels/matmul_ggml.h"

#if defined(MOESERVE_KERNELS_MATMUL_GGML_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_GGML_INL_H_
#undef MOESERVE_KERNELS_MATMUL_GGML_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_GGML_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// AVX-512 VNNI on AVX3_DL, as in every matmul file (matmul_common-inl.h).
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

namespace ggml_matmul_internal {  // helpers (ODR: see matmul_common-inl.h)

namespace hn = hwy::HWY_NAMESPACE;
namespace mi = matmul_internal;
namespace gb = ggml_blocks;

#undef MOESERVE_GGML_X86_INT8
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define MOESERVE_GGML_X86_INT8 1
#else
#define MOESERVE_GGML_X86_INT8 0
#endif

// ---- Formats: a block's weights and bytes, and its exact f32 decoding (ggml_blocks-inl.h).

template <DType kDType>
struct Format;
#define MOESERVE_GGML_FORMAT(dtype, weights, bytes, decode)                      \
  template <>                                                                    \
  struct Format<DType::dtype> {                                                  \
    static constexpr size_t kWeights = weights, kBytes = bytes;                  \
    static HWY_INLINE void Decode(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT out) { \
      decode(b, out);                                                            \
    }                                                                            \
  };
MOESERVE_GGML_FORMAT(kGgmlQ8_0, 32, 34, gb::BlockQ8_0)
MOESERVE_GGML_FORMAT(kGgmlQ4_0, 32, 18, gb::BlockQ4_0)
MOESERVE_GGML_FORMAT(kGgmlQ4_1, 32, 20, gb::BlockQ4_1)
MOESERVE_GGML_FORMAT(kGgmlQ5_0, 32, 22, gb::BlockQ5_0)
MOESERVE_GGML_FORMAT(kGgmlQ5_1, 32, 24, gb::BlockQ5_1)
MOESERVE_GGML_FORMAT(kGgmlQ4_K, 256, 144, gb::BlockQ4_KOrQ5_K<false>)
MOESERVE_GGML_FORMAT(kGgmlQ5_K, 256, 176, gb::BlockQ4_KOrQ5_K<true>)
MOESERVE_GGML_FORMAT(kGgmlQ6_K, 256, 210, gb::BlockQ6_K)
#undef MOESERVE_GGML_FORMAT

// Prefetches block `b` of W row `row` (bytes per row, block bytes) into L2.
HWY_INLINE void PrefetchBlock(const uint8_t* w, size_t row, size_t row_bytes, size_t b,
                              size_t block_bytes) {
  // An integer address: the last line may lie past W's end, where no pointer may point (a
  // prefetch never faults).
  const uintptr_t at = reinterpret_cast<uintptr_t>(w) + row * row_bytes + b * block_bytes;
  for (size_t off = 0; off < block_bytes; off += mi::kLineBytes) {
    __builtin_prefetch(reinterpret_cast<const void*>(at + off), 0, 2);
  }
}

// Tile shapes: kM x rows per pass (1 .. kMaxM) over RowsFor(kM) W rows. Passes of fewer x rows
// than the shape (the batch's last) use the tile of their own kM with the shape's rows.
inline constexpr size_t kMaxM = mi::kMaxAccumulators >= 24 ? 4 : 3;
constexpr size_t RowsFor(size_t m) { return std::min<size_t>(8, mi::kMaxAccumulators / m); }
inline mi::TileShape ChooseShape(size_t M) {
  const size_t m = std::min(M, kMaxM);
  return {RowsFor(m), m};
}
// The int8 tiles hold a ymm accumulator per output and the block's decoded codes and scales.
// With 32 registers (AVX-512) the f32 tiles' shapes. With 16 (AVX2, and the scalar targets
// below it), passes of up to 8 x rows over 4 W rows, though their accumulators do not all fit:
// each spilled one costs a load and a store per block, while every extra x row of a pass saves
// a decoding of the block (most of a K-quant block's work); 8 is also an expert's share of a
// 128-token prefill under top-8 of 128. The best of 3..16 x rows by 1..4 W rows measured
// (docs/performance.md, "GGML block kernels on AVX2").
inline constexpr size_t kMaxInt8M = mi::kMaxAccumulators >= 24 ? kMaxM : 8;
constexpr size_t Int8RowsFor(size_t m) { return mi::kMaxAccumulators >= 24 ? RowsFor(m) : 4; }
inline mi::TileShape ChooseInt8Shape(size_t M) {
  const size_t m = std::min(M, kMaxInt8M);
  return {Int8RowsFor(m), m};
}

// ---- kF32.

using DF = hn::CappedTag<float, 16>;  // as ggml_blocks-inl.h: a vector never straddles a block
using VF = hn::Vec<DF>;

// y[i, r] for i < ms, r < rows from x rows m0 + i (x + i * x_stride) and W rows n0 + r, with
// kM >= ms, kRows >= rows (missing rows repeat the last one; their outputs are not stored).
template <DType kDType, size_t kRows, size_t kM>
void TileF32(const float* HWY_RESTRICT x, size_t x_stride, size_t ms, const uint8_t* HWY_RESTRICT w,
             size_t row_bytes, size_t K, size_t n0, size_t rows, size_t next,
             float* HWY_RESTRICT y, size_t y_stride) {
  using Fmt = Format<kDType>;
  const DF df;
  const size_t L = hn::Lanes(df);
  const uint8_t* HWY_RESTRICT wr[kRows];
  for (size_t r = 0; r < kRows; ++r) wr[r] = w + (n0 + std::min(r, rows - 1)) * row_bytes;
  const float* HWY_RESTRICT xr[kM];
  for (size_t i = 0; i < kM; ++i) xr[i] = x + std::min(i, ms - 1) * x_stride;
  HWY_ALIGN float buf[kRows][Fmt::kWeights];
  VF acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = hn::Zero(df);
  }
  const size_t blocks = K / Fmt::kWeights;
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t r = 0; r < kRows; ++r) {
      if (next != mi::kNoRow) PrefetchBlock(w, next + r, row_bytes, b, Fmt::kBytes);
      Fmt::Decode(wr[r] + b * Fmt::kBytes, buf[r]);
    }
    const size_t k0 = b * Fmt::kWeights;
    for (size_t v = 0; v < Fmt::kWeights; v += L) {
      VF xv[kM];
      for (size_t i = 0; i < kM; ++i) xv[i] = hn::LoadU(df, xr[i] + k0 + v);
      for (size_t r = 0; r < kRows; ++r) {
        const VF wv = hn::Load(df, buf[r] + v);
        for (size_t i = 0; i < kM; ++i) acc[i][r] = hn::MulAdd(wv, xv[i], acc[i][r]);
      }
    }
  }
  for (size_t i = 0; i < ms; ++i) {
    for (size_t r = 0; r < rows; ++r) {
      y[i * y_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[i][r]));
    }
  }
}

template <DType kDType>
void MatMulRangeF32T(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                     const uint8_t* HWY_RESTRICT w, size_t K, size_t n_begin, size_t n_end,
                     float* HWY_RESTRICT y, size_t y_stride) {
  using Fmt = Format<kDType>;
  const size_t row_bytes = K / Fmt::kWeights * Fmt::kBytes;
  const mi::TileShape shape = ChooseShape(M);
  mi::ForEachPass(
      M, n_begin, n_end, shape, K * sizeof(float), row_bytes, [](size_t, size_t) {},
      [&](size_t n, size_t rows, size_t next, size_t m, size_t ms, bool first) {
        const float* xm = x + m * x_stride;
        float* ym = y + m * y_stride + n;
        const size_t ahead = first ? next : mi::kNoRow;
        // The shape's rows with the pass's own x-row count (ms <= shape.m).
        switch (shape.m * 8 + ms) {
#define MOESERVE_GGML_F32_TILE(kShapeM, kMs)                                                   \
  case kShapeM * 8 + kMs:                                                                      \
    return TileF32<kDType, RowsFor(kShapeM), kMs>(xm, x_stride, ms, w, row_bytes, K, n, rows, \
                                                  ahead, ym, y_stride);
          MOESERVE_GGML_F32_TILE(1, 1)
          MOESERVE_GGML_F32_TILE(2, 2)
          MOESERVE_GGML_F32_TILE(3, 3)
          MOESERVE_GGML_F32_TILE(3, 1)
          MOESERVE_GGML_F32_TILE(3, 2)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
          MOESERVE_GGML_F32_TILE(4, 4)
          MOESERVE_GGML_F32_TILE(4, 1)
          MOESERVE_GGML_F32_TILE(4, 2)
          MOESERVE_GGML_F32_TILE(4, 3)
#endif
#undef MOESERVE_GGML_F32_TILE
          default:
            HWY_ASSERT(false);
        }
      });
}

// ---- kInt8.

// An f16 at p (any alignment) widened exactly; NaN payloads may come out quieted here and not in
// F16ToF32, which no result can tell apart: every f16 is multiplied before it is used.
HWY_INLINE float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
#if MOESERVE_GGML_X86_INT8
  return _cvtsh_ss(h);
#else
  return F16ToF32(h);
#endif
}

// Q4_K / Q5_K's 8 six-bit scales and mins from their 12 bytes (kernels/ggml_blocks.h): sub-block
// j < 4 keeps scale and min in the low 6 bits of bytes j and j + 4; j >= 4 has the low 4 bits in
// byte j + 4 (scale low nibble, min high nibble) and the top 2 in bits 6, 7 of bytes j - 4 (scale)
// and j (min). Byte j of *scales, *mins: sub-block j's.
HWY_INLINE void UnpackScalesAndMins(const uint8_t* s, uint64_t* scales, uint64_t* mins) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t scale_low = a & 0x3f3f3f3fu, min_low = b & 0x3f3f3f3fu;
  const uint32_t scale_high = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
  const uint32_t min_high = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
  *scales = scale_low | uint64_t{scale_high} << 32;
  *mins = min_low | uint64_t{min_high} << 32;
}
HWY_INLINE int32_t ByteOf(uint64_t bytes, size_t j) {
  return static_cast<int32_t>((bytes >> (8 * j)) & 0xff);
}

template <DType kDType>
inline constexpr bool kHasOffset = kDType == DType::kGgmlQ4_1 || kDType == DType::kGgmlQ5_1 ||
                                   kDType == DType::kGgmlQ4_K || kDType == DType::kGgmlQ5_K;

// The block's f32 factors: d (s = d a) and the offset's o (t = o a): m or dmin.
struct BlockFactors {
  float d, offset;
};
template <DType kDType>
HWY_INLINE BlockFactors Factors(const uint8_t* HWY_RESTRICT b) {
  if constexpr (kDType == DType::kGgmlQ6_K) {
    return {HalfAt(b + 208), 0.0f};
  } else if constexpr (kHasOffset<kDType>) {
    return {HalfAt(b), HalfAt(b + 2)};
  } else {
    return {HalfAt(b), 0.0f};
  }
}

// One activation block of an x row: p, and its sums over runs of 4 and of 16.
struct ActivationBlock {
  const int8_t* HWY_RESTRICT p;
  const int16_t* HWY_RESTRICT sums4;
  const int16_t* HWY_RESTRICT sums16;
};

// The lane sums I[8], J[8] (kernels/matmul_ggml.h) of one weight block against one activation
// block, in scalar code: what the targets below AVX2 run.
template <DType kDType>
HWY_INLINE void ScalarLanes(const uint8_t* HWY_RESTRICT b, const ActivationBlock& x,
                            int32_t (&I)[8], int32_t (&J)[8]) {
  for (size_t l = 0; l < 8; ++l) I[l] = J[l] = 0;
  const int8_t* HWY_RESTRICT p = x.p;
  if constexpr (kDType == DType::kGgmlQ8_0) {
    for (size_t k = 0; k < 32; ++k) I[k / 4] += static_cast<int8_t>(b[2 + k]) * p[k];
  } else if constexpr (kDType == DType::kGgmlQ4_0 || kDType == DType::kGgmlQ4_1 ||
                       kDType == DType::kGgmlQ5_0 || kDType == DType::kGgmlQ5_1) {
    constexpr bool kFifth = kDType == DType::kGgmlQ5_0 || kDType == DType::kGgmlQ5_1;
    constexpr bool kAffine = kHasOffset<kDType>;
    constexpr size_t kHigh = kAffine ? 4 : 2, kQs = kHigh + (kFifth ? 4 : 0);
    uint32_t fifth = 0;
    if (kFifth) std::memcpy(&fifth, b + kHigh, 4);
    constexpr int32_t kBias = kAffine ? 0 : kFifth ? 16 : 8;
    for (size_t k = 0; k < 32; ++k) {
      int32_t q = k < 16 ? b[kQs + k] & 15 : b[kQs + k - 16] >> 4;
      if (kFifth) q |= static_cast<int32_t>((fifth >> k) & 1) << 4;
      I[k / 4] += (q - kBias) * p[k];
      J[k / 4] += p[k];
    }
  } else if constexpr (kDType == DType::kGgmlQ4_K || kDType == DType::kGgmlQ5_K) {
    constexpr bool kFive = kDType == DType::kGgmlQ5_K;
    uint64_t scales, mins;
    UnpackScalesAndMins(b + 4, &scales, &mins);
    const uint8_t* qs = b + (kFive ? 48 : 16);
    for (size_t j = 0; j < 8; ++j) {
      int32_t p_sum = 0;
      for (size_t i = 0; i < 32; ++i) {
        int32_t q = (qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 15;
        if (kFive) q |= ((b[16 + i] >> j) & 1) << 4;
        I[i / 4] += ByteOf(scales, j) * q * p[32 * j + i];
        p_sum += p[32 * j + i];
      }
      J[j] = -ByteOf(mins, j) * p_sum;
    }
  } else {
    static_assert(kDType == DType::kGgmlQ6_K);
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    for (size_t k = 0; k < 256; ++k) {
      const size_t h = k / 128, t = (k / 32) % 4, i = k % 32;
      const int32_t low = (b[64 * h + 32 * (t % 2) + i] >> (4 * (t / 2))) & 15;
      const int32_t top = (b[128 + 32 * h + i] >> (2 * t)) & 3;
      I[i / 4] += scales[k / 16] * (low | top << 4) * p[k];
      I[k / 32] -= 32 * scales[k / 16] * p[k];
    }
  }
}

#if MOESERVE_GGML_X86_INT8
// 32 unsigned codes times 32 signed p, summed in pairs (int16, no saturation: |pair| <= 2 * 63 *
// 127) and then, times `scale` (int16 lanes), in pairs into 8 int32 lanes: lane l holds bytes
// 4l .. 4l + 3.
HWY_INLINE __m256i ScaledDot(__m256i codes, const int8_t* HWY_RESTRICT p, __m256i scale) {
  const __m256i pairs =
      _mm256_maddubs_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm256_madd_epi16(pairs, scale);
}
HWY_INLINE __m256i LoadSums(const int16_t* HWY_RESTRICT sums) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums));
}

// A block's codes as unsigned bytes in weight order (32 a vector), decoded once per W row and
// block, with its integer scales as vpmaddwd multipliers; Lanes then takes one activation block.
struct X86Q8_0Block {
  __m256i magnitude, q;  // |q| (unsigned) and q, for vpsignb
  HWY_INLINE explicit X86Q8_0Block(const uint8_t* b) {
    q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    magnitude = _mm256_sign_epi8(q, q);  // -128 -> 0x80, read as unsigned 128
  }
  HWY_INLINE void Lanes(const ActivationBlock& x, __m256i* I, __m256i*) const {
    const __m256i pv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.p));
    // |q| * p sign(q) in pairs: at most 2 * 128 * 127 < 2^15.
    const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(pv, q));
    *I = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
};

// Q4_0, Q4_1, Q5_0, Q5_1: 32 codes from 16 bytes of nibbles (byte i: weights i and i + 16) and,
// for Q5, the u32 of fifth bits at kHigh.
template <bool kFifth, bool kAffine>
struct X86SmallBlock {
  static constexpr size_t kHigh = kAffine ? 4 : 2, kQs = kHigh + (kFifth ? 4 : 0);
  __m256i codes;
  HWY_INLINE explicit X86SmallBlock(const uint8_t* b) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
    const __m128i nibble = _mm_set1_epi8(15);
    codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble),
                             _mm_and_si128(bytes, nibble));
    if constexpr (kFifth) {
      uint32_t fifth;
      std::memcpy(&fifth, b + kHigh, 4);
      // Byte i gets byte i / 8 of the bits, then keeps bit i % 8 as 16.
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int32_t>(fifth)),
          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
  }
  HWY_INLINE void Lanes(const ActivationBlock& x, __m256i* I, __m256i* J) const {
    *I = ScaledDot(codes, x.p, _mm256_set1_epi16(1));
    // Lane l's sum of p (its 4 values).
    const __m256i p_sums =
        _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sums4)));
    if constexpr (kAffine) {
      *J = p_sums;
    } else {
      // The codes' offset: (q - bias) p = q p - bias p, lane by lane.
      *I = _mm256_sub_epi32(*I, _mm256_slli_epi32(p_sums, kFifth ? 4 : 3));
    }
  }
};

// Q4_K, Q5_K: sub-block j's 32 codes are the low (j even) or high nibbles of qs[32 (j / 2) ..],
// [Q5_K: bit j of qh[0 .. 32) as 16]; each vector meets its sub-block's scale in vpmaddwd; the
// mins meet the activation block's 16-sums in pairs (lane j: m_j times sub-block j's sum of p).
// The codes are decoded as Lanes needs them (few live registers: AVX2 has 16), the scales once.
template <bool kFive>
struct X86KBlock {
  const uint8_t* HWY_RESTRICT qs;
  __m256i scales, mins, high;  // scales: int16 lane j (both halves) = sc_j; mins: lanes 2j, 2j + 1
  HWY_INLINE explicit X86KBlock(const uint8_t* b) : qs(b + (kFive ? 48 : 16)) {
    uint64_t sc, mn;
    UnpackScalesAndMins(b + 4, &sc, &mn);
    scales = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m128i m8 = _mm_cvtsi64_si128(static_cast<int64_t>(mn));
    mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    high = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16))
                 : _mm256_setzero_si256();
  }
  // Sub-block j's scale in every int16 lane.
  HWY_INLINE __m256i Scale(size_t j) const {
    const int16_t pick = static_cast<int16_t>((2 * j) | (2 * j + 1) << 8);
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pick));
  }
  HWY_INLINE __m256i WithFifth(__m256i codes, size_t j) const {
    if constexpr (!kFive) return codes;
    const __m256i bit = _mm256_and_si256(
        _mm256_srl_epi16(high, _mm_cvtsi32_si128(static_cast<int>(j))), _mm256_set1_epi8(1));
    return _mm256_or_si256(codes, _mm256_slli_epi16(bit, 4));
  }
  // One x row: the batch of one (as fast as a loop of its own, measured).
  HWY_INLINE void Lanes(const ActivationBlock& x, __m256i* I, __m256i* J) const {
    const ActivationBlock xs[1] = {x};
    __m256i Is[1], Js[1];
    LanesBatch<1>(xs, Is, Js);
    *I = Is[0];
    *J = Js[0];
  }
  // Lanes for kM activation blocks at once: each sub-block's codes and scale are decoded once
  // and meet every x row (a prefill pass).
  template <size_t kM>
  HWY_INLINE void LanesBatch(const ActivationBlock (&x)[kM], __m256i (&I)[kM],
                             __m256i (&J)[kM]) const {
    const __m256i nibble = _mm256_set1_epi8(15);
    for (size_t i = 0; i < kM; ++i) I[i] = _mm256_setzero_si256();
    for (size_t t = 0; t < 4; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * t));
      const __m256i low = WithFifth(_mm256_and_si256(v, nibble), 2 * t);
      const __m256i low_scale = Scale(2 * t);
      for (size_t i = 0; i < kM; ++i) {
        I[i] = _mm256_add_epi32(I[i], ScaledDot(low, x[i].p + 64 * t, low_scale));
      }
      const __m256i top = WithFifth(_mm256_and_si256(_mm256_srli_epi16(v, 4), nibble), 2 * t + 1);
      const __m256i top_scale = Scale(2 * t + 1);
      for (size_t i = 0; i < kM; ++i) {
        I[i] = _mm256_add_epi32(I[i], ScaledDot(top, x[i].p + 64 * t + 32, top_scale));
      }
    }
    for (size_t i = 0; i < kM; ++i) {
      J[i] = _mm256_sub_epi32(_mm256_setzero_si256(),
                              _mm256_madd_epi16(mins, LoadSums(x[i].sums16)));
    }
  }
};

// Q6_K: vector g (weights 32g .. 32g + 31, h = g / 4, t = g % 4) holds low nibbles of
// ql[64h + 32 (t % 2) ..] (high halves if t >= 2) and bits 2t, 2t + 1 of qh[32h ..] as bits 4, 5;
// its two sub-blocks of 16 meet their int8 scales in vpmaddwd; the codes' offset 32 comes off
// lane s / 2 as 32 sc_s (sub-block s's sum of p), from the activation block's 16-sums in pairs.
// Decoded as Lanes needs them, as X86KBlock.
struct X86Q6_KBlock {
  const uint8_t* HWY_RESTRICT b;
  __m256i scales16, first, second;  // the 16 scales as int16; their halves in both halves
  HWY_INLINE explicit X86Q6_KBlock(const uint8_t* block) : b(block) {
    scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    first = _mm256_permute2x128_si256(scales16, scales16, 0x00);
    second = _mm256_permute2x128_si256(scales16, scales16, 0x11);
  }
  // Lanes 0-7: scale 2g, lanes 8-15: scale 2g + 1 (int16 lanes 2 (g % 4) and + 1 of their half).
  HWY_INLINE __m256i Scale(size_t g) const {
    const int16_t lo = static_cast<int16_t>((4 * (g % 4)) | (4 * (g % 4) + 1) << 8);
    const int16_t hi = static_cast<int16_t>((4 * (g % 4) + 2) | (4 * (g % 4) + 3) << 8);
    return _mm256_shuffle_epi8(g < 4 ? first : second,
                               _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
  }
  // Vector t of half h's codes from that half's low-nibble vector (ql[64h + 32 (t % 2) ..]) and
  // its high pairs (qh[32h ..]): bits 2t, 2t + 1 of each byte moved to bits 4, 5 (a 16-bit
  // shift moves bits across bytes only where the mask then clears them).
  template <size_t t>
  static HWY_INLINE __m256i Codes(__m256i source, __m256i top) {
    const __m256i nibble = _mm256_set1_epi8(15), pair = _mm256_set1_epi8(0x30);
    const __m256i low = _mm256_and_si256(t < 2 ? source : _mm256_srli_epi16(source, 4), nibble);
    const __m256i moved = t == 0   ? _mm256_slli_epi16(top, 4)
                          : t == 1 ? _mm256_slli_epi16(top, 2)
                          : t == 2 ? top
                                   : _mm256_srli_epi16(top, 2);
    return _mm256_or_si256(low, _mm256_and_si256(moved, pair));
  }
  HWY_INLINE void Lanes(const ActivationBlock& x, __m256i* I, __m256i*) const {
    __m256i acc = _mm256_setzero_si256();
    for (size_t h = 0; h < 2; ++h) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i codes[4] = {Codes<0>(a, top), Codes<1>(c, top), Codes<2>(a, top),
                                Codes<3>(c, top)};
      for (size_t t = 0; t < 4; ++t) {
        const size_t g = 4 * h + t;
        acc = _mm256_add_epi32(acc, ScaledDot(codes[t], x.p + 32 * g, Scale(g)));
      }
    }
    const __m256i offsets = _mm256_madd_epi16(scales16, LoadSums(x.sums16));
    *I = _mm256_sub_epi32(acc, _mm256_slli_epi32(offsets, 5));
  }
  // Lanes for kM activation blocks at once, as X86KBlock::LanesBatch.
  template <size_t kM>
  HWY_INLINE void LanesBatch(const ActivationBlock (&x)[kM], __m256i (&I)[kM],
                             __m256i (&)[kM]) const {
    // The 8 scale vectors first (AVX2's 16 registers hold the tile's accumulators, not these).
    __m256i scale[8];
    for (size_t g = 0; g < 8; ++g) scale[g] = Scale(g);
    for (size_t i = 0; i < kM; ++i) I[i] = _mm256_setzero_si256();
    const auto meet = [&](size_t g, __m256i codes) {
      for (size_t i = 0; i < kM; ++i) {
        I[i] = _mm256_add_epi32(I[i], ScaledDot(codes, x[i].p + 32 * g, scale[g]));
      }
    };
    for (size_t h = 0; h < 2; ++h) {
      const auto* half = reinterpret_cast<const __m256i*>(b + 64 * h);
      const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      meet(4 * h + 0, Codes<0>(_mm256_loadu_si256(half), top));
      meet(4 * h + 1, Codes<1>(_mm256_loadu_si256(half + 1), top));
      meet(4 * h + 2, Codes<2>(_mm256_loadu_si256(half), top));
      meet(4 * h + 3, Codes<3>(_mm256_loadu_si256(half + 1), top));
    }
    for (size_t i = 0; i < kM; ++i) {
      const __m256i offsets = _mm256_madd_epi16(scales16, LoadSums(x[i].sums16));
      I[i] = _mm256_sub_epi32(I[i], _mm256_slli_epi32(offsets, 5));
    }
  }
};

// The decoder of each format.
template <DType kDType>
struct X86BlockOf;
template <>
struct X86BlockOf<DType::kGgmlQ8_0> {
  using type = X86Q8_0Block;
};
template <>
struct X86BlockOf<DType::kGgmlQ4_0> {
  using type = X86SmallBlock<false, false>;
};
template <>
struct X86BlockOf<DType::kGgmlQ4_1> {
  using type = X86SmallBlock<false, true>;
};
template <>
struct X86BlockOf<DType::kGgmlQ5_0> {
  using type = X86SmallBlock<true, false>;
};
template <>
struct X86BlockOf<DType::kGgmlQ5_1> {
  using type = X86SmallBlock<true, true>;
};
template <>
struct X86BlockOf<DType::kGgmlQ4_K> {
  using type = X86KBlock<false>;
};
template <>
struct X86BlockOf<DType::kGgmlQ5_K> {
  using type = X86KBlock<true>;
};
template <>
struct X86BlockOf<DType::kGgmlQ6_K> {
  using type = X86Q6_KBlock;
};
template <DType kDType>
using X86Block = typename X86BlockOf<kDType>::type;
// Whether a decoder meets several x rows per decoded sub-block (the K-quants: their decoding is
// most of a block's work, so a pass of kM rows decodes each block once, not kM times).
template <class Block, size_t kM>
inline constexpr bool kHasLanesBatch = requires(const Block& block, const ActivationBlock (&x)[kM],
                                                __m256i (&I)[kM], __m256i (&J)[kM]) {
  block.template LanesBatch<kM>(x, I, J);
};

// The spec's f32 step on 8 lanes: acc = fma(float(I), s, acc), then with an offset
// fma(float(J), t, acc).
template <bool kOffset>
HWY_INLINE __m256 AddLanes(__m256 acc, __m256i I, __m256i J, float s, float t) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(s), acc);
  if constexpr (kOffset) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(J), _mm256_set1_ps(t), acc);
  return acc;
}

// The spec's final sum of the 8 lanes: l + 4, then l + 2, then l + 1.
HWY_INLINE float SumAccLanes(__m256 acc) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
#endif  // MOESERVE_GGML_X86_INT8

// y[i, r] for i < ms, r < rows (as TileF32) from quantized x rows m0 + i and W rows n0 + r.
template <DType kDType, size_t kRows, size_t kM>
void TileInt8(const GgmlInt8Rows& xq, size_t m0, size_t ms, const uint8_t* HWY_RESTRICT w,
              size_t row_bytes, size_t K, size_t n0, size_t rows, size_t next,
              float* HWY_RESTRICT y, size_t y_stride) {
  using Fmt = Format<kDType>;
  constexpr size_t B = Fmt::kWeights;
  constexpr bool kOffset = kHasOffset<kDType>;
  const uint8_t* HWY_RESTRICT wr[kRows];
  for (size_t r = 0; r < kRows; ++r) wr[r] = w + (n0 + std::min(r, rows - 1)) * row_bytes;
  const int8_t* HWY_RESTRICT p[kM];
  const float* HWY_RESTRICT a[kM];
  const int16_t* HWY_RESTRICT sums4[kM];
  const int16_t* HWY_RESTRICT sums16[kM];
  for (size_t i = 0; i < kM; ++i) {
    const size_t m = m0 + std::min(i, ms - 1);
    p[i] = xq.p(m);
    a[i] = xq.scales(m);
    sums4[i] = xq.sums4(m);
    sums16[i] = xq.sums16(m);
  }
#if MOESERVE_GGML_X86_INT8
  __m256 acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = _mm256_setzero_ps();
  }
#else
  float acc[kM][kRows][8] = {};
#endif
  const size_t blocks = K / B;
  for (size_t b = 0; b < blocks; ++b) {
    ActivationBlock x[kM];
    for (size_t i = 0; i < kM; ++i) {
      x[i] = {p[i] + b * B, sums4[i] + b * B / 4, sums16[i] + b * B / 16};
    }
    for (size_t r = 0; r < kRows; ++r) {
      if (next != mi::kNoRow) PrefetchBlock(w, next + r, row_bytes, b, Fmt::kBytes);
      const uint8_t* HWY_RESTRICT block = wr[r] + b * Fmt::kBytes;
      const BlockFactors f = Factors<kDType>(block);
#if MOESERVE_GGML_X86_INT8
      const X86Block<kDType> codes(block);
      if constexpr (kM > 1 && kHasLanesBatch<X86Block<kDType>, kM>) {
        __m256i I[kM], J[kM] = {};  // J: only the formats with an offset set it
        codes.template LanesBatch<kM>(x, I, J);
        for (size_t i = 0; i < kM; ++i) {
          acc[i][r] = AddLanes<kOffset>(acc[i][r], I[i], J[i], f.d * a[i][b], f.offset * a[i][b]);
        }
      } else {
        for (size_t i = 0; i < kM; ++i) {
          __m256i I, J = _mm256_setzero_si256();
          codes.Lanes(x[i], &I, &J);
          acc[i][r] = AddLanes<kOffset>(acc[i][r], I, J, f.d * a[i][b], f.offset * a[i][b]);
        }
      }
#else
      for (size_t i = 0; i < kM; ++i) {
        int32_t I[8], J[8];
        ScalarLanes<kDType>(block, x[i], I, J);
        const float s = f.d * a[i][b], t = f.offset * a[i][b];
        for (size_t l = 0; l < 8; ++l) {
          acc[i][r][l] = std::fma(static_cast<float>(I[l]), s, acc[i][r][l]);
          if (kOffset) acc[i][r][l] = std::fma(static_cast<float>(J[l]), t, acc[i][r][l]);
        }
      }
#endif
    }
  }
  for (size_t i = 0; i < ms; ++i) {
    for (size_t r = 0; r < rows; ++r) {
#if MOESERVE_GGML_X86_INT8
      y[i * y_stride + r] = SumAccLanes(acc[i][r]);
#else
      const float* HWY_RESTRICT lanes = acc[i][r];
      const float t0 = lanes[0] + lanes[4], t1 = lanes[1] + lanes[5];
      const float t2 = lanes[2] + lanes[6], t3 = lanes[3] + lanes[7];
      y[i * y_stride + r] = (t0 + t2) + (t1 + t3);
#endif
    }
  }
}

// The pass's tile: shape.m x rows per pass (1 .. kMaxInt8M), ms of them in this pass. A shape
// below kMaxInt8M only occurs when M is that small, so its passes are whole (ms == shape_m); the
// largest shape also ends a batch with a shorter pass.
template <DType kDType, size_t... kIs>
HWY_INLINE void RunInt8Pass(size_t shape_m, size_t ms, std::index_sequence<kIs...>,
                            const GgmlInt8Rows& xq, size_t m, const uint8_t* HWY_RESTRICT w,
                            size_t row_bytes, size_t K, size_t n, size_t rows, size_t ahead,
                            float* HWY_RESTRICT y, size_t y_stride) {
  const bool ran =
      shape_m == kMaxInt8M
          ? ((ms == kIs + 1 &&
              (TileInt8<kDType, Int8RowsFor(kMaxInt8M), kIs + 1>(xq, m, ms, w, row_bytes, K, n,
                                                                 rows, ahead, y, y_stride),
               true)) ||
             ...)
          : ((shape_m == kIs + 1 && ms == kIs + 1 &&
              (TileInt8<kDType, Int8RowsFor(kIs + 1), kIs + 1>(xq, m, ms, w, row_bytes, K, n,
                                                               rows, ahead, y, y_stride),
               true)) ||
             ...);
  HWY_ASSERT(ran);
}

template <DType kDType>
void MatMulRangeInt8T(const GgmlInt8Rows& xq, size_t M, const uint8_t* HWY_RESTRICT w, size_t K,
                      size_t n_begin, size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  using Fmt = Format<kDType>;
  const size_t row_bytes = K / Fmt::kWeights * Fmt::kBytes;
  const mi::TileShape shape = ChooseInt8Shape(M);
  mi::ForEachPass(
      M, n_begin, n_end, shape, xq.stride, row_bytes, [](size_t, size_t) {},
      [&](size_t n, size_t rows, size_t next, size_t m, size_t ms, bool first) {
        float* ym = y + m * y_stride + n;
        const size_t ahead = first ? next : mi::kNoRow;
        RunInt8Pass<kDType>(shape.m, ms, std::make_index_sequence<kMaxInt8M>(), xq, m, w,
                            row_bytes, K, n, rows, ahead, ym, y_stride);
      });
}

// Calls fn.template operator()<dtype>() for a GGML block dtype.
template <class Fn>
HWY_INLINE void WithFormat(DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::kGgmlQ8_0: return fn.template operator()<DType::kGgmlQ8_0>();
    case DType::kGgmlQ4_0: return fn.template operator()<DType::kGgmlQ4_0>();
    case DType::kGgmlQ4_1: return fn.template operator()<DType::kGgmlQ4_1>();
    case DType::kGgmlQ5_0: return fn.template operator()<DType::kGgmlQ5_0>();
    case DType::kGgmlQ5_1: return fn.template operator()<DType::kGgmlQ5_1>();
    case DType::kGgmlQ4_K: return fn.template operator()<DType::kGgmlQ4_K>();
    case DType::kGgmlQ5_K: return fn.template operator()<DType::kGgmlQ5_K>();
    case DType::kGgmlQ6_K: return fn.template operator()<DType::kGgmlQ6_K>();
    default: HWY_ASSERT(false);
  }
}

}  // namespace ggml_matmul_internal

// kernels/matmul_ggml.h's ggml_matmul::MatMulRangeF32 on this target.
inline void MatMulRangeGgmlF32Impl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                   DType dtype, const std::byte* w, size_t K, size_t n_begin,
                                   size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(w);
  ggml_matmul_internal::WithFormat(dtype, [&]<DType kDType>() {
    ggml_matmul_internal::MatMulRangeF32T<kDType>(x, x_stride, M, bytes, K, n_begin, n_end, y,
                                                  y_stride);
  });
}

// ggml_matmul::QuantizeActivations on this target: each block as w8a8 quantizes a row
// (matmul_common-inl.h: QuantizeActivationRow), then the sums of p over each 4 and each 16.
inline void QuantizeGgmlActivationsImpl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                        size_t K, size_t block, std::byte* out) {
  const size_t stride = GgmlInt8Rows::RowBytes(K, block);
  const GgmlInt8Rows rows{out, stride, K, block};
  for (size_t m = 0; m < M; ++m) {
    auto* p = const_cast<int8_t*>(rows.p(m));
    auto* scales = const_cast<float*>(rows.scales(m));
    auto* sums4 = const_cast<int16_t*>(rows.sums4(m));
    auto* sums16 = const_cast<int16_t*>(rows.sums16(m));
    for (size_t b = 0; b < K / block; ++b) {
      matmul_internal::QuantizeActivationRow(x + m * x_stride + b * block, block, p + b * block,
                                             &scales[b]);
    }
    for (size_t s = 0; s < K / 4; ++s) {
      sums4[s] = static_cast<int16_t>(p[4 * s] + p[4 * s + 1] + p[4 * s + 2] + p[4 * s + 3]);
    }
    for (size_t s = 0; s < K / 16; ++s) {
      sums16[s] = static_cast<int16_t>(sums4[4 * s] + sums4[4 * s + 1] + sums4[4 * s + 2] +
                                       sums4[4 * s + 3]);
    }
  }
}

// ggml_matmul::MatMulRangeInt8 on this target.
inline void MatMulRangeGgmlInt8Impl(const GgmlInt8Rows& xq, size_t M, DType dtype,
                                    const std::byte* w, size_t K, size_t n_begin, size_t n_end,
                                    float* HWY_RESTRICT y, size_t y_stride) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(w);
  ggml_matmul_internal::WithFormat(dtype, [&]<DType kDType>() {
    ggml_matmul_internal::MatMulRangeInt8T<kDType>(xq, M, bytes, K, n_begin, n_end, y, y_stride);
  });
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_GGML_INL_H_
