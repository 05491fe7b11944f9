// int8 weights (kernels/quantize.h), per target: Q8Rows, the weight-only rows the float tiles
// widen to f32 (matmul_float-inl.h), and the w8a8 kernel, int8 activations times int8 weights
// summed exactly in int32, with its AVX-512 VNNI and AVX2 intrinsic twins of the Highway code.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/matmul_common-inl.h"
#include "kernels/quantize.h"

#if defined(MOESERVE_KERNELS_MATMUL_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_INT8_INL_H_
#undef MOESERVE_KERNELS_MATMUL_INT8_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_INT8_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// AVX-512 VNNI on AVX3_DL, as in every matmul file (matmul_common-inl.h).
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

namespace matmul_internal {  // helpers (ODR: see matmul_common-inl.h)

namespace hn = hwy::HWY_NAMESPACE;

// int8 rows with one scale per row (weight-only, f32 activations; a format of the float tiles):
// sums q * x, times the scale at the end.
struct Q8Rows {
  const int8_t* HWY_RESTRICT w;
  const float* HWY_RESTRICT scales;  // [N]
  size_t K;
  static constexpr bool kRowScaled = true;
  HWY_INLINE VF Load(DF df, size_t row, size_t k) const {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, w + row * K + k)));
  }
  float At(size_t row, size_t k) const { return static_cast<float>(w[row * K + k]); }
  uintptr_t Address(size_t row, size_t k) const {
    return reinterpret_cast<uintptr_t>(w + row * K + k);
  }
  static size_t BytesPer(size_t lanes) { return lanes; }
  float RowScale(size_t row) const { return scales[row]; }
};

// ---- w8a8: int8 activations times int8 weights, summed exactly in int32.

// One tile of w8a8 outputs: y[i, r] for i < kM, r < kRows, from quantized x rows m0 + i and W
// rows n0 + r (int8 [N, K] at w, scales w_scales). Integer sums, so the order is free: per step
// of K each W vector is loaded once and used for kM rows of x, as in the float Tile
// (matmul_float-inl.h), and the K % step tail is added one product at a time. kPrefetch /
// next: as in that Tile.
//   AVX3_DL (AVX-512 VNNI): one vpdpbusd per 64 products. It multiplies unsigned by signed
//     bytes, so the weights go in as q + 128 (an xor of the sign bit) and each output subtracts
//     128 * sum of its x row's p over the vector steps, in wrapping uint32 arithmetic (exact:
//     the true sum fits in int32).
//   Elsewhere: int8 widened to int16, pairs multiplied and added into int32 (vpmaddwd on x86).
#if HWY_TARGET == HWY_AVX3_DL
inline constexpr size_t kVnniStep = 64;

// TileQ8A8's vector steps with AVX-512 VNNI, k in [0, k_end) (a multiple of kVnniStep): sums[i][r]
// = sum_k (q[n0 + r, k] + 128) * p[m0 + i, k], wrapping in uint32. Raw intrinsics on raw
// vectors, compiled without "avxvnni" (the VEX form, which Zen 4 lacks): written with Highway's
// types, GCC 12 stored every accumulator to the stack after each vpdpbusd, and M = 128 ran
// slower (docs/log/kernel-comments.md). It still copies each accumulator through a register
// around it.
#if HWY_COMPILER_GCC_ACTUAL
#define MOESERVE_NO_AVXVNNI __attribute__((target("no-avxvnni")))
#else
#define MOESERVE_NO_AVXVNNI
#endif
template <size_t kRows, size_t kM, bool kPrefetch>
MOESERVE_NO_AVXVNNI inline void VnniSteps(const Int8Rows& xq, size_t m0,
                                          const int8_t* HWY_RESTRICT w, size_t K, size_t k_end,
                                          size_t n0, size_t next, int32_t (&sums)[kM][kRows]) {
  __m512i acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = _mm512_setzero_si512();
  }
  const __m512i sign_bit = _mm512_set1_epi8(static_cast<char>(0x80));
  for (size_t k = 0; k < k_end; k += kVnniStep) {
    __m512i xv[kM];
    for (size_t i = 0; i < kM; ++i) xv[i] = _mm512_loadu_si512(xq.q + (m0 + i) * xq.stride + k);
    for (size_t r = 0; r < kRows; ++r) {
      if constexpr (kPrefetch) {
        const uintptr_t line = reinterpret_cast<uintptr_t>(w + (next + r) * K + k);
        for (size_t j = 0; j < kVnniStep / 16; ++j) {
          __builtin_prefetch(reinterpret_cast<const void*>(line + kLineBytes * j), 0, 2);
        }
      }
      const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(w + (n0 + r) * K + k), sign_bit);
      for (size_t i = 0; i < kM; ++i) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], wv, xv[i]);
    }
  }
  // Lanes added with vector adds, which wrap: _mm512_reduce_add_epi32 adds as int, and a partial
  // sum of (q + 128) * p may exceed int32 (UBSan: signed overflow) before the offset comes off.
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(acc[i][r]),
                                            _mm512_extracti64x4_epi64(acc[i][r], 1));
      __m128i quad = _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
      quad = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
      quad = _mm_add_epi32(quad, _mm_shuffle_epi32(quad, 1));
      sums[i][r] = _mm_cvtsi128_si32(quad);
    }
  }
}
#endif

// Prefetches a step's worth of a W row of the next tile, as the float Tile does.
HWY_INLINE void PrefetchQ8A8Row(const int8_t* row, size_t step_bytes) {
  const uintptr_t line = reinterpret_cast<uintptr_t>(row);
  for (size_t j = 0; j < std::max<size_t>(1, step_bytes / 16); ++j) {
    __builtin_prefetch(reinterpret_cast<const void*>(line + kLineBytes * j), 0, 2);
  }
}

template <size_t kRows, size_t kM, bool kPrefetch>
void TileQ8A8(const Int8Rows& xq, size_t m0, const int8_t* HWY_RESTRICT w,
              const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
              float* HWY_RESTRICT y, size_t y_stride) {
  int32_t sums[kM][kRows];
  size_t k = 0;
#if HWY_TARGET == HWY_AVX3_DL
  const size_t k_end = K / kVnniStep * kVnniStep;
  VnniSteps<kRows, kM, kPrefetch>(xq, m0, w, K, k_end, n0, next, sums);
  k = k_end;
  for (size_t i = 0; i < kM; ++i) {
    // The vector steps covered p[0, k): the row's sum less the tail's.
    int32_t p_sum = xq.sums[(m0 + i) * xq.sums_stride];
    for (size_t j = k; j < K; ++j) p_sum -= xq.q[(m0 + i) * xq.stride + j];
    const uint32_t offset = 128u * static_cast<uint32_t>(p_sum);
    for (size_t r = 0; r < kRows; ++r) {
      sums[i][r] = static_cast<int32_t>(static_cast<uint32_t>(sums[i][r]) - offset);
    }
  }
#elif HWY_TARGET == HWY_AVX2
  // 32 products per step: vpmaddubsw multiplies unsigned by signed bytes into int16 pairs, so
  // it gets |p| and q * sign(p) (vpsignb; q = -128 never occurs). A pair is at most
  // 2 * 127 * 127 < 2^15: no saturation. vpmaddwd by ones then widens the pairs into int32.
  constexpr size_t kStep = 32;
  __m256i acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = _mm256_setzero_si256();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (; k + kStep <= K; k += kStep) {
    __m256i xv[kM], ax[kM];
    for (size_t i = 0; i < kM; ++i) {
      xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q + (m0 + i) * xq.stride + k));
      ax[i] = _mm256_sign_epi8(xv[i], xv[i]);
    }
    for (size_t r = 0; r < kRows; ++r) {
      if constexpr (kPrefetch) PrefetchQ8A8Row(w + (next + r) * K + k, kStep);
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n0 + r) * K + k));
      for (size_t i = 0; i < kM; ++i) {
        const __m256i pairs = _mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(wv, xv[i]));
        acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      const __m128i half =
          _mm_add_epi32(_mm256_castsi256_si128(acc[i][r]), _mm256_extracti128_si256(acc[i][r], 1));
      const __m128i quad = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
      sums[i][r] = _mm_cvtsi128_si32(_mm_add_epi32(quad, _mm_shuffle_epi32(quad, 1)));
    }
  }
#else
  const hn::ScalableTag<int16_t> d16;
  const hn::RepartitionToWide<decltype(d16)> d32;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const size_t step = hn::Lanes(d16);
  using VI32 = hn::Vec<decltype(d32)>;
  // ReorderWidenMulAccumulate may leave part of a sum in a second accumulator (not on x86).
  VI32 acc[kM][kRows], acc_odd[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = acc_odd[i][r] = hn::Zero(d32);
  }
  for (; k + step <= K; k += step) {
    hn::Vec<decltype(d16)> xv[kM];
    for (size_t i = 0; i < kM; ++i) {
      xv[i] = hn::PromoteTo(d16, hn::LoadU(d8, xq.q + (m0 + i) * xq.stride + k));
    }
    for (size_t r = 0; r < kRows; ++r) {
      if constexpr (kPrefetch) PrefetchQ8A8Row(w + (next + r) * K + k, step);
      const auto wv = hn::PromoteTo(d16, hn::LoadU(d8, w + (n0 + r) * K + k));
      for (size_t i = 0; i < kM; ++i) {
        acc[i][r] = hn::ReorderWidenMulAccumulate(d32, wv, xv[i], acc[i][r], acc_odd[i][r]);
      }
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      sums[i][r] = hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc[i][r], acc_odd[i][r])));
    }
  }
#endif
  for (size_t i = 0; i < kM; ++i) {
    const int8_t* HWY_RESTRICT p = xq.q + (m0 + i) * xq.stride;
    for (size_t r = 0; r < kRows; ++r) {
      const int8_t* HWY_RESTRICT q = w + (n0 + r) * K;
      int32_t sum = sums[i][r];
      for (size_t j = k; j < K; ++j) sum += int32_t{p[j]} * q[j];
      y[i * y_stride + r] = static_cast<float>(sum) * xq.scales[m0 + i] * w_scales[n0 + r];
    }
  }
}

// w8a8 tile shapes. With 32 registers (AVX-512) as the float tiles. With 16, a float tile of
// 12 accumulators fits because its MulAdd reads W from memory; the int8 tile also holds the W and
// x vectors it widened, and 4 x 3 spilled accumulators to the stack (AVX2, Zen 4 measured), so
// at most 8 accumulators.
inline TileShape ChooseTileShapeQ8A8(size_t M) {
#if HWY_TARGET == HWY_AVX3_DL
  if (M >= 16) return {4, 4};
#endif
  if (kMaxAccumulators >= 24) return ChooseTileShape(M);
  return M == 1 ? TileShape{8, 1} : TileShape{4, 2};
}

// The quantized-activation kernels (w8a8 here, w4a8 in matmul_int4-inl.h) as types, for one
// tile table and range loop (MatMulRangeQuantized, matmul_common-inl.h).
struct Q8A8Kernel {
  using Weight = int8_t;
  using Scale = float;
  static size_t RowBytes(size_t K) { return K; }
  static constexpr size_t kMaxRows = kMaxTileRows, kMaxM = kMaxTileM;
  template <size_t kRows, size_t kM, bool kPrefetch>
  static void Tile(const Int8Rows& xq, size_t m0, const int8_t* HWY_RESTRICT w,
                   const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
                   float* HWY_RESTRICT y, size_t y_stride) {
    TileQ8A8<kRows, kM, kPrefetch>(xq, m0, w, w_scales, K, n0, next, y, y_stride);
  }
  static TileShape Shape(size_t M) { return ChooseTileShapeQ8A8(M); }
};

}  // namespace matmul_internal

// Quantizes M rows of x (row m at x + m * x_stride, K floats) for w8a8 into out: row m's values
// at out.q + m * out.stride, its scale and sum at out.scales[m] and out.sums[m].
inline void QuantizeActivationsImpl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                    size_t K, int8_t* HWY_RESTRICT q, size_t q_stride,
                                    float* HWY_RESTRICT scales, int32_t* HWY_RESTRICT sums) {
  for (size_t m = 0; m < M; ++m) {
    sums[m] =
        matmul_internal::QuantizeActivationRow(x + m * x_stride, K, q + m * q_stride, &scales[m]);
  }
}

// y[m, n] for m < M and n in [n_begin, n_end) against w8a8 weights (int8 [N, K] at w with
// w_scales), from activations already quantized (xq).
inline void MatMulRangeQ8A8Impl(const Int8Rows& xq, size_t M, const int8_t* HWY_RESTRICT w,
                                const float* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                                size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  matmul_internal::MatMulRangeQuantized<matmul_internal::Q8A8Kernel>(xq, M, w, w_scales, K, n_begin,
                                                                     n_end, y, y_stride);
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_INT8_INL_H_
