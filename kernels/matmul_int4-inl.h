// int4 weights (kernels/quantize.h), per target: the kernel of w4a8 (int8 activations times int4
// weights, exact per group) and of int4 (15-bit activations as two int8 planes, the same kernel
// with each block's products of the two planes combined before the group sums), with its AVX-512
// (VNNI where the CPU has it) and AVX2 intrinsic kernels and a scalar one for the other targets,
// all three with the same bits.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "hwy/highway.h"
#include "kernels/matmul_common-inl.h"
#include "kernels/quantize.h"

#if defined(MOESERVE_KERNELS_MATMUL_INT4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_INT4_INL_H_
#undef MOESERVE_KERNELS_MATMUL_INT4_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_INT4_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// AVX-512 VNNI on AVX3_DL, as in every matmul file (matmul_common-inl.h).
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

namespace matmul_internal {  // helpers (ODR: see matmul_common-inl.h)

namespace hn = hwy::HWY_NAMESPACE;

// A group's scale (f16 bits, kernels/quantize.h) as f32: exact, as moeserve::F16ToF32.
HWY_INLINE float GroupScale(uint16_t bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(bits);  // F16C, part of every x86 target from AVX2 on
#else
  return F16ToF32(bits);
#endif
}

// ---- w4a8 and int4: int8 (or 15-bit) activations times int4 weights, exact per group.
//
// Layout. A w4a8 W row stores int4's groups: 16 bytes per group of 32, byte j holding weights j
// (low nibble) and j + 16 (high). A vector of 64 bytes (a block: 4 groups, kQ4A8Block weights)
// thus splits into a vector of its 64 low nibbles and one of its 64 high ones. The quantized x
// rows are reordered to match (ToQ4A8Layout, kernels/quantize.h): per block, p of the 4 groups'
// first halves, then of their second halves, so that each nibble vector meets its x bytes in one
// load. The kernels multiply nibbles (0 .. 15, unsigned) by p (signed): sum nibble * p over a
// group, less 8 * sum p over the group (xq.sums), is the group's exact sum i_g. int4's p has two
// planes (kPlanes = 2), each laid out so: a block's int32 lane sums are those of the high plane
// times 128 plus those of the low plane, exact (|lane| <= 8 * 15 * kQ4Levels), and from there on
// the kernel is w4a8's.
//
// Order. A superblock is 16 groups (4 blocks): their 16 sums i_g become one vector of 16 ints in
// group order (per target below), then acc[g] = fma(float(i_g), s_g, acc[g]) for the 16 lanes,
// zeros past the row's end; at the end the 16 lanes are added as a tree. The same operations in
// the same order on every target (kQ4A8Lanes accumulators), hence the same bits.

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// A tile's rows, located once: W row r's nibbles and scales, the tile ahead's row r (prefetch),
// x row i's reordered p and group sums.
template <size_t kRows, size_t kM>
struct Q4A8Tile {
  const uint8_t* HWY_RESTRICT w[kRows];
  const uint8_t* HWY_RESTRICT next_w[kRows];
  const uint16_t* HWY_RESTRICT next_scales[kRows];
  const uint16_t* HWY_RESTRICT scales[kRows];  // f16
  const int8_t* HWY_RESTRICT p[kM];            // int4: the high plane
  const int8_t* HWY_RESTRICT p_low[kM];        // int4: the low plane
  const int32_t* HWY_RESTRICT sums[kM];
};

// The 16 lanes added as the tree i + 8, i + 4, i + 2, i + 1.
HWY_INLINE float ReduceQ4A8Lanes(__m256 low8, __m256 high8) {
  const __m256 eight = _mm256_add_ps(low8, high8);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// A 512-bit vector holds a block: 64 low and 64 high nibbles, 4 groups.
using Q4A8Acc = __m512;
HWY_INLINE Q4A8Acc ZeroQ4A8Acc() { return _mm512_setzero_ps(); }
HWY_INLINE float ReduceQ4A8(Q4A8Acc acc) {
  return ReduceQ4A8Lanes(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
}

// The int32 sums of one block (its low and high nibbles, x's 128 reordered bytes at p): lanes
// 4t .. 4t + 3 hold parts of group t's sum of nibble * p.
HWY_INLINE __m512i BlockDotQ4A8(__m512i low, __m512i high, const int8_t* HWY_RESTRICT p) {
  const __m512i p_low = _mm512_loadu_si512(p), p_high = _mm512_loadu_si512(p + 64);
#if HWY_TARGET == HWY_AVX3_DL
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), low, p_low), high, p_high);
#else
  // A pair is at most 2 * 15 * 127 and two pairs 7620 < 2^15: no saturation.
  const __m512i pairs =
      _mm512_add_epi16(_mm512_maddubs_epi16(low, p_low), _mm512_maddubs_epi16(high, p_high));
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}

// Two blocks' lanes (a, b as BlockDotQ4A8 gives them) half added: per 128-bit lane t,
// [a lanes 0 + 2, 1 + 3, b lanes 0 + 2, 1 + 3] of group t.
HWY_INLINE __m512i PairQ4A8(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

// Blocks 0, 1 (ab) and 2, 3 (cd) as PairQ4A8 gives them: the superblock's 16 group sums in
// group order (block b's group t is group 4b + t).
HWY_INLINE __m512i GroupSumsQ4A8(__m512i ab, __m512i cd) {
  const __m512 abf = _mm512_castsi512_ps(ab), cdf = _mm512_castsi512_ps(cd);
  // Lane 4t + b: group 4b + t.
  const __m512i sums =
      _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(abf, cdf, _MM_SHUFFLE(2, 0, 2, 0))),
                       _mm512_castps_si512(_mm512_shuffle_ps(abf, cdf, _MM_SHUFFLE(3, 1, 3, 1))));
  const __m512i transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(transpose, sums);
}

// The superblock at column k, of which kBlocks blocks lie inside the row, for every output of
// a tile: the W row's nibbles unpacked once per block, used by the tile's kM x rows.
// As BlockDotQ4A8 for kPlanes planes of x at offset `at` (int4: high * 128 + low).
template <size_t kPlanes, size_t kRows, size_t kM>
HWY_INLINE __m512i PlanesDotQ4A8(__m512i low, __m512i high, const Q4A8Tile<kRows, kM>& t, size_t i,
                                 size_t at) {
  const __m512i part = BlockDotQ4A8(low, high, t.p[i] + at);
  if constexpr (kPlanes == 1) {
    return part;
  } else {
    return _mm512_add_epi32(_mm512_slli_epi32(part, 7), BlockDotQ4A8(low, high, t.p_low[i] + at));
  }
}

template <size_t kBlocks, size_t kRows, size_t kM, bool kPrefetch, size_t kPlanes>
HWY_INLINE void SuperblockQ4A8(const Q4A8Tile<kRows, kM>& t, size_t k, Q4A8Acc (&acc)[kM][kRows]) {
  constexpr __mmask16 kValid = static_cast<__mmask16>((1u << (4 * kBlocks)) - 1);
  const size_t g0 = k / kQ4Group;
  const __m512i nibble = _mm512_set1_epi8(15);
#pragma GCC unroll 8
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kPrefetch) {
      for (size_t j = 0; j < kBlocks; ++j) __builtin_prefetch(t.next_w[r] + k / 2 + 64 * j, 0, 2);
      __builtin_prefetch(t.next_scales[r] + g0, 0, 2);
    }
    __m512i pending[kM], pairs[kM][2];
    for (size_t b = 0; b < 4; ++b) {
      __m512i low = _mm512_setzero_si512(), high = low;
      if (b < kBlocks) {
        const __m512i v = _mm512_loadu_si512(t.w[r] + k / 2 + 64 * b);
        low = _mm512_and_si512(v, nibble);
        high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      }
      for (size_t i = 0; i < kM; ++i) {
        const __m512i part = b < kBlocks ? PlanesDotQ4A8<kPlanes>(low, high, t, i, k + 128 * b)
                                         : _mm512_setzero_si512();
        if (b % 2 == 0) {
          pending[i] = part;
        } else {
          pairs[i][b / 2] = PairQ4A8(pending[i], part);
        }
      }
    }
    const __m512 scales = _mm512_cvtph_ps(
        kBlocks == 4 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.scales[r] + g0))
                     : _mm256_maskz_loadu_epi16(kValid, t.scales[r] + g0));
    for (size_t i = 0; i < kM; ++i) {
      const __m512i p_sums = kBlocks == 4 ? _mm512_loadu_si512(t.sums[i] + g0)
                                          : _mm512_maskz_loadu_epi32(kValid, t.sums[i] + g0);
      const __m512i sums =
          _mm512_sub_epi32(GroupSumsQ4A8(pairs[i][0], pairs[i][1]), _mm512_slli_epi32(p_sums, 3));
      acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scales, acc[i][r]);
    }
  }
}

#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// As the AVX-512 kernel with 32-byte vectors: half a block (2 groups) per vector, the
// superblock as two quarters of 8 groups each, the 16 lanes as two vectors.
struct Q4A8Acc {
  __m256 half[2];  // groups 0 .. 7 and 8 .. 15 of each superblock
};
HWY_INLINE Q4A8Acc ZeroQ4A8Acc() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
HWY_INLINE float ReduceQ4A8(const Q4A8Acc& acc) {
  return ReduceQ4A8Lanes(acc.half[0], acc.half[1]);
}

// The int32 sums of half a block: lanes 4t .. 4t + 3 hold parts of its group t (0, 1).
HWY_INLINE __m256i HalfBlockDotQ4A8(__m256i low, __m256i high, const int8_t* HWY_RESTRICT p_low,
                                    const int8_t* HWY_RESTRICT p_high) {
  const __m256i pairs = _mm256_add_epi16(
      _mm256_maddubs_epi16(low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p_low))),
      _mm256_maddubs_epi16(high, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p_high))));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

HWY_INLINE __m256i PairQ4A8(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

// Half blocks 0, 1 (ab) and 2, 3 (cd) of 8 groups as 8 group sums in order (half h's group t
// is group 2h + t).
HWY_INLINE __m256i GroupSumsQ4A8(__m256i ab, __m256i cd) {
  const __m256 abf = _mm256_castsi256_ps(ab), cdf = _mm256_castsi256_ps(cd);
  // Lane 4t + h: group 2h + t.
  const __m256i sums =
      _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(abf, cdf, _MM_SHUFFLE(2, 0, 2, 0))),
                       _mm256_castps_si256(_mm256_shuffle_ps(abf, cdf, _MM_SHUFFLE(3, 1, 3, 1))));
  return _mm256_permutevar8x32_epi32(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The first kCount (4 or 8) ints at `from`, zeros after.
template <size_t kCount>
HWY_INLINE __m256i LoadFirstQ4A8(const void* from) {
  if constexpr (kCount == 8) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(from));
  } else {
    return _mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(from)));
  }
}

// The first kCount (4 or 8) f16 scales at `from`, zeros after.
template <size_t kCount>
HWY_INLINE __m128i LoadScalesQ4A8(const uint16_t* from) {
  if constexpr (kCount == 8) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
  } else {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(from));
  }
}

// As HalfBlockDotQ4A8 for kPlanes planes of x at offset `at` (int4: high * 128 + low).
template <size_t kPlanes, size_t kRows, size_t kM>
HWY_INLINE __m256i HalfPlanesDotQ4A8(__m256i low, __m256i high, const Q4A8Tile<kRows, kM>& t,
                                     size_t i, size_t at) {
  const __m256i part = HalfBlockDotQ4A8(low, high, t.p[i] + at, t.p[i] + at + 64);
  if constexpr (kPlanes == 1) {
    return part;
  } else {
    return _mm256_add_epi32(_mm256_slli_epi32(part, 7),
                            HalfBlockDotQ4A8(low, high, t.p_low[i] + at, t.p_low[i] + at + 64));
  }
}

template <size_t kBlocks, size_t kRows, size_t kM, bool kPrefetch, size_t kPlanes>
HWY_INLINE void SuperblockQ4A8(const Q4A8Tile<kRows, kM>& t, size_t k, Q4A8Acc (&acc)[kM][kRows]) {
  const size_t g0 = k / kQ4Group;
  const __m256i nibble = _mm256_set1_epi8(15);
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kPrefetch) {
      for (size_t j = 0; j < kBlocks; ++j) __builtin_prefetch(t.next_w[r] + k / 2 + 64 * j, 0, 2);
      __builtin_prefetch(t.next_scales[r] + g0, 0, 2);
    }
    // Quarter q: groups 8q .. 8q + 7, blocks 2q and 2q + 1; half block h of it is half h % 2
    // of block 2q + h / 2. A quarter past the row's end adds nothing (fma(0, 0, acc) = acc:
    // no accumulator is ever -0).
    for (size_t q = 0; q < 2 && 2 * q < kBlocks; ++q) {
      const size_t blocks = std::min<size_t>(2, kBlocks - 2 * q);
      __m256i pending[kM], pairs[kM][2];
      for (size_t h = 0; h < 4; ++h) {
        __m256i low = _mm256_setzero_si256(), high = low;
        if (h / 2 < blocks) {
          const uint8_t* HWY_RESTRICT bytes = t.w[r] + k / 2 + 128 * q + 32 * h;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
          low = _mm256_and_si256(v, nibble);
          high = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        for (size_t i = 0; i < kM; ++i) {
          const size_t at = k + 256 * q + 128 * (h / 2) + 32 * (h % 2);
          const __m256i part = h / 2 < blocks ? HalfPlanesDotQ4A8<kPlanes>(low, high, t, i, at)
                                              : _mm256_setzero_si256();
          if (h % 2 == 0) {
            pending[i] = part;
          } else {
            pairs[i][h / 2] = PairQ4A8(pending[i], part);
          }
        }
      }
      const __m256 scales =
          _mm256_cvtph_ps(blocks == 2 ? LoadScalesQ4A8<8>(t.scales[r] + g0 + 8 * q)
                                      : LoadScalesQ4A8<4>(t.scales[r] + g0 + 8 * q));
      for (size_t i = 0; i < kM; ++i) {
        const __m256i p_sums = blocks == 2 ? LoadFirstQ4A8<8>(t.sums[i] + g0 + 8 * q)
                                           : LoadFirstQ4A8<4>(t.sums[i] + g0 + 8 * q);
        const __m256i sums =
            _mm256_sub_epi32(GroupSumsQ4A8(pairs[i][0], pairs[i][1]), _mm256_slli_epi32(p_sums, 3));
        acc[i][r].half[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scales, acc[i][r].half[q]);
      }
    }
  }
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
template <size_t kRows, size_t kM, bool kPrefetch, size_t kPlanes>
void TileQ4A8(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
              const uint16_t* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
              float* HWY_RESTRICT y, size_t y_stride) {
  constexpr size_t kSuper = 4 * kQ4A8Block;
  const size_t groups = K / kQ4Group;
  Q4A8Tile<kRows, kM> t;
  for (size_t r = 0; r < kRows; ++r) {
    t.w[r] = w + (n0 + r) * K / 2;
    t.next_w[r] = kPrefetch ? w + (next + r) * K / 2 : nullptr;
    t.next_scales[r] = kPrefetch ? w_scales + (next + r) * groups : nullptr;
    t.scales[r] = w_scales + (n0 + r) * groups;
  }
  for (size_t i = 0; i < kM; ++i) {
    t.p[i] = xq.q + (m0 + i) * xq.stride;
    t.p_low[i] = t.p[i] + xq.low_plane;
    t.sums[i] = xq.sums + (m0 + i) * xq.sums_stride;
  }
  Q4A8Acc acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = ZeroQ4A8Acc();
  }
  size_t k = 0;
  for (; k + kSuper <= K; k += kSuper) SuperblockQ4A8<4, kRows, kM, kPrefetch, kPlanes>(t, k, acc);
  switch ((K - k) / kQ4A8Block) {
    case 1:
      SuperblockQ4A8<1, kRows, kM, kPrefetch, kPlanes>(t, k, acc);
      break;
    case 2:
      SuperblockQ4A8<2, kRows, kM, kPrefetch, kPlanes>(t, k, acc);
      break;
    case 3:
      SuperblockQ4A8<3, kRows, kM, kPrefetch, kPlanes>(t, k, acc);
      break;
    default:
      break;
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      y[i * y_stride + r] = ReduceQ4A8(acc[i][r]) * xq.scales[m0 + i];
    }
  }
}

#else
// p at `at` of a row whose high plane is at p (int4: high * 128 + low).
template <size_t kPlanes>
int32_t PlanesValue(const Int8Rows& xq, const int8_t* HWY_RESTRICT p, size_t at) {
  if constexpr (kPlanes == 1) {
    return p[at];
  } else {
    return 128 * p[at] + p[xq.low_plane + at];
  }
}

// Other targets: one group at a time in scalar code, std::fma for the step every target takes.
template <size_t kRows, size_t kM, bool kPrefetch, size_t kPlanes>
void TileQ4A8(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
              const uint16_t* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t /*next*/,
              float* HWY_RESTRICT y, size_t y_stride) {
  const size_t groups = K / kQ4Group;
  const size_t padded = (groups + kQ4A8Lanes - 1) / kQ4A8Lanes * kQ4A8Lanes;
  for (size_t i = 0; i < kM; ++i) {
    const int8_t* HWY_RESTRICT p = xq.q + (m0 + i) * xq.stride;
    const int32_t* HWY_RESTRICT p_sums = xq.sums + (m0 + i) * xq.sums_stride;
    for (size_t r = 0; r < kRows; ++r) {
      const uint8_t* HWY_RESTRICT bytes = w + (n0 + r) * K / 2;
      float acc[kQ4A8Lanes] = {};
      for (size_t g = 0; g < padded; ++g) {
        int32_t sum = 0;
        float scale = 0.0f;
        if (g < groups) {
          // Group g is group t of block b: its nibbles at 16 g, its p at 128 b + 16 t (+ 64).
          const size_t b = g / 4, t = g % 4;
          for (size_t j = 0; j < 16; ++j) {
            const int byte = bytes[16 * g + j];
            const size_t at = 128 * b + 16 * t + j;  // of the low nibble's p; the high's + 64
            sum += (byte & 15) * PlanesValue<kPlanes>(xq, p, at) +
                   (byte >> 4) * PlanesValue<kPlanes>(xq, p, at + 64);
          }
          sum -= 8 * p_sums[g];
          scale = GroupScale(w_scales[(n0 + r) * groups + g]);
        }
        acc[g % kQ4A8Lanes] = std::fma(static_cast<float>(sum), scale, acc[g % kQ4A8Lanes]);
      }
      for (size_t width = kQ4A8Lanes / 2; width >= 1; width /= 2) {
        for (size_t l = 0; l < width; ++l) acc[l] += acc[l + width];
      }
      y[i * y_stride + r] = acc[0] * xq.scales[m0 + i];
    }
  }
}
#endif

// w4a8 tile shapes: per output a 512-bit accumulator (two 256-bit ones on AVX2), and per x row
// three vectors of partial sums while a W row's superblock is worked on.
inline TileShape ChooseTileShapeQ4A8(size_t M) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return M < 4 ? TileShape{4, M} : TileShape{2, 4};
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  // M = 1: {4, 1} measured faster than {2, 1}, and AVX-512's {8, 1} slower than its {4, 1}
  // (docs/log/kernel-comments.md).
  return M == 1 ? TileShape{4, 1} : TileShape{1, 2};
#else
  (void)M;
  return {1, 1};
#endif
}

// w4a8 (kPlanes = 1) and int4 (kPlanes = 2).
template <size_t kPlanes>
struct Q4Kernel {
  using Weight = uint8_t;
  using Scale = uint16_t;  // f16
  static size_t RowBytes(size_t K) { return K / 2; }
  // The largest tile ChooseTileShapeQ4A8 picks (the table holds no larger ones: each tile is
  // compiled four times, per number of blocks in a superblock).
  static constexpr size_t kMaxRows = 4, kMaxM = 4;
  template <size_t kRows, size_t kM, bool kPrefetch>
  static void Tile(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
                   const uint16_t* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
                   float* HWY_RESTRICT y, size_t y_stride) {
    TileQ4A8<kRows, kM, kPrefetch, kPlanes>(xq, m0, w, w_scales, K, n0, next, y, y_stride);
  }
  static TileShape Shape(size_t M) { return ChooseTileShapeQ4A8(M); }
};

// Row x[0, K) quantized for int4 (kernels/quantize.h: p in [-kQ4Levels, kQ4Levels]) as its two
// planes, high[k] = p >> 7 and low[k] = p & 127; its scale into *scale. Bit-identical to
// ref::QuantizeActivationRow with kQ4Levels, as QuantizeActivationRow is with 127.
inline void QuantizeActivationRowQ4(const float* HWY_RESTRICT x, size_t K,
                                    int8_t* HWY_RESTRICT high, int8_t* HWY_RESTRICT low,
                                    float* HWY_RESTRICT scale) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t L = hn::Lanes(df);
  const float inv = ActivationScale(x, K, static_cast<float>(kQ4Levels), scale);
  if (inv == 0.0f) {
    std::fill(high, high + K, int8_t{0});
    std::fill(low, low + K, int8_t{0});
    return;
  }
  const VF vinv = hn::Set(df, inv);
  const auto lo = hn::Set(di, -kQ4Levels), hi = hn::Set(di, kQ4Levels), mask = hn::Set(di, 127);
  size_t k = 0;
  for (; k + L <= K; k += L) {
    const auto q = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, x + k), vinv)), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, hn::ShiftRight<7>(q)), d8, high + k);
    hn::StoreU(hn::DemoteTo(d8, hn::And(q, mask)), d8, low + k);
  }
  for (; k < K; ++k) {
    const auto q = static_cast<int32_t>(std::clamp(
        std::nearbyint(x[k] * inv), static_cast<float>(-kQ4Levels), static_cast<float>(kQ4Levels)));
    high[k] = static_cast<int8_t>(q >> 7);
    low[k] = static_cast<int8_t>(q & 127);
  }
}

}  // namespace matmul_internal

// Quantizes M rows of x for w4a8 as QuantizeActivationsImpl (matmul_int8-inl.h) does, then
// reorders each row into the w4a8 layout with its group sums at sums + m * sums_stride
// (ToQ4A8Layout).
inline void QuantizeActivationsQ4A8Impl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                        size_t K, int8_t* HWY_RESTRICT q, size_t q_stride,
                                        float* HWY_RESTRICT scales, int32_t* HWY_RESTRICT sums,
                                        size_t sums_stride) {
  for (size_t m = 0; m < M; ++m) {
    matmul_internal::QuantizeActivationRow(x + m * x_stride, K, q + m * q_stride, &scales[m]);
    ToQ4A8Layout(q + m * q_stride, static_cast<int64_t>(K), sums + m * sums_stride);
  }
}

// Quantizes M rows of x for int4: row m's high plane at q + m * q_stride, its low plane
// low_plane bytes after it, each in the w4a8 layout (ToQ4A8Layout), the group sums of
// p = 128 * high + low at sums + m * sums_stride.
inline void QuantizeActivationsQ4Impl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                      size_t K, int8_t* HWY_RESTRICT q, size_t q_stride,
                                      size_t low_plane, float* HWY_RESTRICT scales,
                                      int32_t* HWY_RESTRICT sums, size_t sums_stride) {
  thread_local std::vector<int32_t> low_sums;
  low_sums.resize(K / kQ4Group);
  for (size_t m = 0; m < M; ++m) {
    int8_t* high = q + m * q_stride;
    int8_t* low = high + low_plane;
    int32_t* row_sums = sums + m * sums_stride;
    matmul_internal::QuantizeActivationRowQ4(x + m * x_stride, K, high, low, &scales[m]);
    ToQ4A8Layout(high, static_cast<int64_t>(K), row_sums);
    ToQ4A8Layout(low, static_cast<int64_t>(K), low_sums.data());
    for (size_t g = 0; g < K / kQ4Group; ++g) row_sums[g] = 128 * row_sums[g] + low_sums[g];
  }
}

// y[m, n] against w4a8 weights (int4 [N, K] at w with w_scales), from activations quantized by
// QuantizeActivationsQ4A8Impl.
inline void MatMulRangeQ4A8Impl(const Int8Rows& xq, size_t M, const uint8_t* HWY_RESTRICT w,
                                const uint16_t* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                                size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  matmul_internal::MatMulRangeQuantized<matmul_internal::Q4Kernel<1>>(xq, M, w, w_scales, K,
                                                                      n_begin, n_end, y, y_stride);
}

// y[m, n] against int4 weights, from activations quantized by QuantizeActivationsQ4Impl.
inline void MatMulRangeQ4Impl(const Int8Rows& xq, size_t M, const uint8_t* HWY_RESTRICT w,
                              const uint16_t* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                              size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  matmul_internal::MatMulRangeQuantized<matmul_internal::Q4Kernel<2>>(xq, M, w, w_scales, K,
                                                                      n_begin, n_end, y, y_stride);
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_INT4_INL_H_
