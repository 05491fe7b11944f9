// The float tiles, per target: f32 activations against weights read as f32 vectors, bf16 and
// f32 rows here (FloatRows) and the weight-only int8 rows of matmul_int8-inl.h (Q8Rows).
// kernels/matmul-inl.h picks the format by dtype.
//
// Reduction order (what makes results batch invariant). Let L = Lanes(ScalableTag<float>) of the
// target. Every output y[m, n] has its own single accumulator vector acc, and
//   acc = 0
//   for k0 = 0, L, 2L, ... while k0 + L <= K:
//     acc = MulAdd(W[n, k0 .. k0+L), x[m, k0 .. k0+L), acc)
//   if K % L != 0:
//     acc = MulAdd(W tail zero-padded to L lanes, x tail zero-padded to L lanes, acc)
//   y[m, n] = GetLane(SumOfLanes(acc))
// MulAdd is one fused multiply-add where the target has FMA (AVX2, AVX-512) and a multiply then
// an add elsewhere: either way the same operation for every output. Tiles of several W rows and
// several x rows only interleave these chains; no two outputs ever share an accumulator, so
// neither the tile shape chosen for an output (which depends on M, on n_begin/n_end and on N) nor
// the thread that computes it can change a single bit of it. The bits depend on K, on the data
// and on the SIMD target only. Packed weights keep this order: int8 rows convert each vector of
// weights exactly and multiply y[m, n] by the row's scale once at the end.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "hwy/highway.h"
#include "kernels/matmul_common-inl.h"

#if defined(MOESERVE_KERNELS_MATMUL_FLOAT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_FLOAT_INL_H_
#undef MOESERVE_KERNELS_MATMUL_FLOAT_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_FLOAT_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// AVX-512 VNNI on AVX3_DL, as in every matmul file (matmul_common-inl.h).
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

namespace matmul_internal {  // helpers (ODR: see matmul_common-inl.h)

// Weight formats: how a tile reads W. Each gives Load(df, row, k), the L weights of row `row`
// from column k as f32 (k a multiple of L), At(row, k), the same for one weight (the tail: the
// same value the vector conversion gives), Address(row, k) for prefetching, the bytes a row
// spends per L weights, and RowScale(row), by which an output is multiplied once at the end
// (kRowScaled; 1 otherwise). Rows are indices into the whole matrix.

// f32 or bf16 rows (bf16 widened to f32: zero-extend and shift left by 16, exact).
template <typename T>
struct FloatRows {
  const T* HWY_RESTRICT w;
  size_t K;
  static constexpr bool kRowScaled = false;
  HWY_INLINE VF Load(DF df, size_t row, size_t k) const {
    if constexpr (std::is_same_v<T, float>) {
      return hn::LoadU(df, w + row * K + k);
    } else {
      const hn::Rebind<hwy::bfloat16_t, DF> dbf;
      return hn::PromoteTo(df, hn::LoadU(dbf, w + row * K + k));
    }
  }
  float At(size_t row, size_t k) const {
    if constexpr (std::is_same_v<T, float>) {
      return w[row * K + k];
    } else {
      return hwy::F32FromBF16(w[row * K + k]);
    }
  }
  uintptr_t Address(size_t row, size_t k) const {
    return reinterpret_cast<uintptr_t>(w + row * K + k);
  }
  static size_t BytesPer(size_t lanes) { return lanes * sizeof(T); }
  float RowScale(size_t) const { return 1.0f; }
};

// One tile: outputs y[i, r] for i < kM, r < kRows (y row i at y + i * y_stride), from x rows
// x + i * x_stride and W rows n0 + r of `fmt`. x_tail [kM, L] and w_tail [kRows, L] hold the last
// K % L elements of each row, zero-padded to L lanes (unused when L divides K).
//
// kPrefetch: next is the first row of a tile ahead (rows next + r: ForEachPass), prefetched into
// L2 as this tile is read. Every W row is its own stream, and hardware prefetchers do not follow
// a stream into the next 4 KiB page, so without this each new tile starts with kRows cold
// streams. Per step of K and row, one prefetch is issued per 16 bytes the step reads from the
// row, for consecutive lines from the current column on, so each line of the tile ahead is
// requested several times (prefetches that find the miss queues full are dropped).
// It raised the weight bandwidth of M = 1 on every target but AVX2 bf16 (unchanged), and
// prefetching into L1 (T0) was slower than into L2 (docs/log/kernel-comments.md). A template
// parameter rather than a test of next in the loop, which slowed the compute-bound passes
// (M = 128).
template <size_t kRows, size_t kM, class Fmt, bool kPrefetch>
void Tile(const float* HWY_RESTRICT x, size_t x_stride, const Fmt& fmt, size_t n0,
          const float* HWY_RESTRICT x_tail, const float* HWY_RESTRICT w_tail, size_t next,
          float* HWY_RESTRICT y, size_t y_stride) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t K = fmt.K;
  const size_t prefetches = std::max<size_t>(1, Fmt::BytesPer(L) / 16);
  VF acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = hn::Zero(df);
  }
  size_t k = 0;
  for (; k + L <= K; k += L) {
    VF xv[kM];
    for (size_t i = 0; i < kM; ++i) xv[i] = hn::LoadU(df, x + i * x_stride + k);
    for (size_t r = 0; r < kRows; ++r) {
      if constexpr (kPrefetch) {
        // Addresses as integers: the last lines may lie past the next tile's end, outside W,
        // where no pointer may point (a prefetch never faults, so they are harmless).
        const uintptr_t line = fmt.Address(next + r, k);
        for (size_t j = 0; j < prefetches; ++j) {
          __builtin_prefetch(reinterpret_cast<const void*>(line + kLineBytes * j), /*rw=*/0,
                             /*locality=*/2);
        }
      }
      const VF wv = fmt.Load(df, n0 + r, k);
      for (size_t i = 0; i < kM; ++i) acc[i][r] = hn::MulAdd(wv, xv[i], acc[i][r]);
    }
  }
  if (k < K) {
    for (size_t r = 0; r < kRows; ++r) {
      const VF wv = hn::Load(df, w_tail + r * L);
      for (size_t i = 0; i < kM; ++i) {
        acc[i][r] = hn::MulAdd(wv, hn::Load(df, x_tail + i * L), acc[i][r]);
      }
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      const float sum = hn::GetLane(hn::SumOfLanes(df, acc[i][r]));
      y[i * y_stride + r] = Fmt::kRowScaled ? sum * fmt.RowScale(n0 + r) : sum;
    }
  }
}

template <class Fmt>
using TileFn = void (*)(const float* HWY_RESTRICT, size_t, const Fmt&, size_t,
                        const float* HWY_RESTRICT, const float* HWY_RESTRICT, size_t,
                        float* HWY_RESTRICT, size_t);

// Entry (rows - 1) * kMaxTileM + (m - 1) is Tile<rows, m>, for the shapes whose accumulators fit
// (every shape ChooseTileShape returns, and all smaller ones used at the edges of N and M); the
// others are null and never instantiated.
template <class Fmt, bool kPrefetch, size_t kI>
constexpr TileFn<Fmt> TileAt() {
  constexpr size_t kRows = kI / kMaxTileM + 1;
  constexpr size_t kM = kI % kMaxTileM + 1;
  if constexpr (kRows * kM <= kMaxAccumulators) {
    return &Tile<kRows, kM, Fmt, kPrefetch>;
  } else {
    return nullptr;
  }
}
template <class Fmt, bool kPrefetch, size_t... kI>
constexpr std::array<TileFn<Fmt>, sizeof...(kI)> MakeTiles(std::index_sequence<kI...>) {
  return {TileAt<Fmt, kPrefetch, kI>()...};
}

template <class Fmt>
void MatMulRangeT(const float* HWY_RESTRICT x, size_t x_stride, size_t M, const Fmt& fmt,
                  size_t n_begin, size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  using Tiles = std::array<TileFn<Fmt>, kMaxTileRows * kMaxTileM>;
  static constexpr Tiles kTiles =
      MakeTiles<Fmt, false>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  static constexpr Tiles kPrefetchingTiles =
      MakeTiles<Fmt, true>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  const size_t K = fmt.K;
  const DF df;
  const size_t L = hn::Lanes(df);
  const TileShape shape = ChooseTileShape(M);
  const size_t k_tail = K - K % L;  // first element of the partial vector
  const size_t tail = K - k_tail;
  // Lanes at and past `tail` stay zero; only the first `tail` lanes of each row are rewritten.
  HWY_ALIGN float w_tail[kMaxTileRows * kMaxLanes] = {};
  HWY_ALIGN float x_tail[kMaxTileM * kMaxLanes] = {};

  ForEachPass(
      M, n_begin, n_end, shape, K * sizeof(float), Fmt::BytesPer(K),
      [&](size_t n, size_t rows) {
        for (size_t r = 0; r < rows; ++r) {
          for (size_t j = 0; j < tail; ++j) w_tail[r * L + j] = fmt.At(n + r, k_tail + j);
        }
      },
      [&](size_t n, size_t rows, size_t next, size_t m, size_t ms, bool first) {
        const float* HWY_RESTRICT xm = x + m * x_stride;
        for (size_t i = 0; i < ms; ++i) {
          for (size_t j = 0; j < tail; ++j) x_tail[i * L + j] = xm[i * x_stride + k_tail + j];
        }
        const Tiles& tiles = first && next != kNoRow ? kPrefetchingTiles : kTiles;
        tiles[(rows - 1) * kMaxTileM + (ms - 1)](xm, x_stride, fmt, n, x_tail, w_tail, next,
                                                 y + m * y_stride + n, y_stride);
      });
}

}  // namespace matmul_internal
}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_FLOAT_INL_H_
