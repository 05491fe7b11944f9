// Per-target body of the matmul kernel (kernels/matmul.h), for inclusion from foreach_target
// translation units: kernels/matmul.cc dispatches to it, and kernels/matmul_test.cc calls it on
// every compiled target.
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
// weights exactly and multiply y[m, n] by the row's scale once at the end; int4 rows convert each
// vector to (nibble - 8) * group scale (one rounding) before its MulAdd.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "hwy/highway.h"
#include "kernels/quantize.h"

#if defined(MOESERVE_KERNELS_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_INL_H_
#undef MOESERVE_KERNELS_MATMUL_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// Highway 1.0.3's AVX3_DL target enables "avxvnni" (the VEX form), not the AVX-512 VNNI that
// its CPU check requires and that the w8a8 kernel below uses.
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

// Helpers live in their own namespace: kernels_test links the -inl.h files of every kernel, and
// inline functions of the same name and target there would be one entity (ODR).
namespace matmul_internal {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Upper bound of Lanes(DF) on any target: sizes the zero-padded tail buffers.
inline constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
inline constexpr size_t kLineBytes = 64;  // cache line of the x86 and Arm cores we target

// Tile shapes. A tile computes kRows W rows x kM x rows with kRows * kM accumulators; for each
// step of K it converts each W vector once and reuses it for kM rows of x. The accumulators, the
// kM x vectors and one W vector should fit the register file: 32 vectors with AVX-512, 16 on
// the other targets. Shapes never change results (see the top of this file), only speed.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr size_t kMaxAccumulators = 24;
#else
inline constexpr size_t kMaxAccumulators = 12;
#endif
inline constexpr size_t kMaxTileRows = 8;
inline constexpr size_t kMaxTileM = std::max<size_t>(kMaxAccumulators / 6, 3);

struct TileShape {
  size_t rows;  // W rows per tile
  size_t m;     // x rows per pass over a tile of W rows
};

// Small M is memory-bound: as many rows per tile as fit (more concurrent W streams; eight rows
// measured ~20% faster than four for M = 1 on Zen 4), with all of M in one pass. Larger M is
// compute-bound: passes of several x rows over a tile of W rows, each pass after the first
// re-reading its tile of W from L1/L2, not from memory. On Zen 4 with AVX-512 (GFLOP/s for
// [8192, 2048] bf16, 2 threads) passes of 4 x rows over 6 W rows beat 3 over 8: M = 6: 160 vs
// 154, M = 7: 171 vs 157, M = 8: 177 vs 164, M = 16: 196 vs 174, M = 128: 203 vs 178 (4 x
// vectors + 24 accumulators + 1 W vector fill the 32 registers; a W row converted from bf16
// serves 4 FMAs). With 16 registers (AVX2) passes of 3 x rows over 4 W rows.
inline TileShape ChooseTileShape(size_t M) {
  if (M * 8 <= kMaxAccumulators) return {8, M};
  if (M * 6 <= kMaxAccumulators) return {6, M};
  if (kMaxAccumulators >= 24) return {6, 4};
  return {kMaxAccumulators / 3, 3};
}

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

// int8 rows with one scale per row (kernels/quantize.h): sums q * x, times the scale at the end.
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

// 4-bit rows in groups of kQ4Group with a scale per group (kernels/quantize.h): weights
// (nibble - 8) * scale, one rounding. Two ways to read them, with the same bits:
//   Load: L weights from k. L divides 16 on every target, so they lie in one half of a group:
//     one load of L bytes, then the low (first half) or high (second half) nibbles.
//   LoadGroup (kGroupWise): a whole group, its 16 bytes loaded once as 16 / L loads of L bytes,
//     each giving L low nibbles (weights j) and L high ones (weights j + 16). With 16 lanes the
//     weights are a lookup of the nibble in the group's table of (-8 .. 7) * scale: one permute
//     instead of subtract, convert and multiply.
// K is a multiple of kQ4Group, so there is no tail.
struct Q4Rows {
  const uint8_t* HWY_RESTRICT w;     // row r at w + r * K / 2
  const float* HWY_RESTRICT scales;  // [N, K / kQ4Group]
  size_t K;
  static constexpr bool kRowScaled = false;
  static constexpr bool kGroupWise = true;
  static constexpr size_t kGroup = static_cast<size_t>(kQ4Group);
  // Vectors per group.
  static size_t GroupVectors(DF df) { return kGroup / hn::Lanes(df); }
  // The kGroup weights of row `row` from column k (a multiple of kGroup) as GroupVectors f32
  // vectors, in order, into out.
  HWY_INLINE void LoadGroup(DF df, size_t row, size_t k, VF* HWY_RESTRICT out) const {
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    const size_t L = hn::Lanes(df), half = kGroup / 2;
    const uint8_t* HWY_RESTRICT bytes = w + (row * K + k) / 2;
    const float scale = scales[(row * K + k) / kGroup];
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    static_assert(HWY_LANES(float) == 16, "one permute covers the 16 nibble values");
    // (nibble - 8) * scale for every nibble value, then a lookup per weight.
    alignas(64) static constexpr float kValues[16] = {-8, -7, -6, -5, -4, -3, -2, -1,
                                                      0,  1,  2,  3,  4,  5,  6,  7};
    const VF table = hn::Mul(hn::Load(df, kValues), hn::Set(df, scale));
    const auto packed = hn::PromoteTo(d32, hn::LoadU(d8, bytes));
    out[0] = hn::TableLookupLanes(table, hn::IndicesFromVec(df, hn::And(packed, hn::Set(d32, 15))));
    out[1] = hn::TableLookupLanes(table, hn::IndicesFromVec(df, hn::ShiftRight<4>(packed)));
    (void)L;
    (void)half;
#else
    const VF s = hn::Set(df, scale);
    const auto eight = hn::Set(d32, 8);
    for (size_t j = 0; j < half; j += L) {
      const auto packed = hn::PromoteTo(d32, hn::LoadU(d8, bytes + j));
      out[j / L] = hn::Mul(hn::ConvertTo(df, hn::Sub(hn::And(packed, hn::Set(d32, 15)), eight)), s);
      out[(half + j) / L] = hn::Mul(hn::ConvertTo(df, hn::Sub(hn::ShiftRight<4>(packed), eight)), s);
    }
#endif
  }
  HWY_INLINE VF Load(DF df, size_t row, size_t k) const {
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    const size_t g = k / kGroup, j = k % kGroup;
    const auto bytes = hn::PromoteTo(d32, hn::LoadU(d8, w + row * K / 2 + g * kGroup / 2 +
                                                         j % (kGroup / 2)));
    const auto nibbles =
        j < kGroup / 2 ? hn::And(bytes, hn::Set(d32, 15)) : hn::ShiftRight<4>(bytes);
    return hn::Mul(hn::ConvertTo(df, hn::Sub(nibbles, hn::Set(d32, 8))),
                   hn::Set(df, scales[row * (K / kGroup) + g]));
  }
  float At(size_t row, size_t k) const {
    const uint8_t b = w[row * K / 2 + k / kGroup * kGroup / 2 + k % (kGroup / 2)];
    const int nibble = k % kGroup < kGroup / 2 ? (b & 15) : (b >> 4);
    return static_cast<float>(nibble - 8) * scales[row * (K / kGroup) + k / kGroup];
  }
  uintptr_t Address(size_t row, size_t k) const {
    return reinterpret_cast<uintptr_t>(w + row * K / 2 + k / 2);
  }
  static size_t BytesPer(size_t lanes) { return lanes / 2; }
  float RowScale(size_t) const { return 1.0f; }
};

// Formats that can also read a group of vectors at a time (LoadGroup).
template <class Fmt, class = void>
struct IsGroupWise : std::false_type {};
template <class Fmt>
struct IsGroupWise<Fmt, std::void_t<decltype(Fmt::kGroupWise)>>
    : std::bool_constant<Fmt::kGroupWise> {};

// Tiles of up to this many x rows read group-wise formats a group at a time. That converts each
// group once per row with fewer loads, but re-reads x for every W row of the tile; with 16 lanes
// it pays only while the tile has few x rows. int4, [8192, 2048], 2 threads, microseconds per
// call (old: a vector at a time; new: a group at a time):
//   AVX-512 M = 1: 488 / 602 -> 408 / 507; M = 8: 1121 / 1369 -> 1135 / 1508;
//           M = 128: 19610 / 19751 -> 23985 / 22548
//   AVX2    M = 1: 1560 / 1624 -> 1050 / 982; M = 8: 4938 / 4007 -> 3188 / 3140;
//           M = 128: 72252 / 61604 -> 45503 / 50506
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr size_t kMaxGroupWiseM = 3;
#else
inline constexpr size_t kMaxGroupWiseM = kMaxTileM;
#endif

// "No next tile to prefetch."
inline constexpr size_t kNoRow = ~size_t{0};

// Bytes of x rows that the passes over a W tile cover before the next tile (ForEachPass): half
// of the 1 MiB L2 of Zen 4 and 5. Measured on Zen 5, [8192, 2048] bf16, M = 1024, 2 threads,
// GFLOP/s: x in one block (8 MiB) 284-297, blocks of 768 KiB 305-311, 512 KiB 327-353, 384 KiB
// 314-323; M = 128 (1 MiB) 310-331 -> 326-342. AVX2 (half the FMA rate) is flat within noise.
inline constexpr size_t kXBlockBytes = size_t{512} << 10;

// The order in which a range of W rows [n_begin, n_end) meets M rows of x: blocks of x rows of
// at most kXBlockBytes (x_row_bytes each; at least one pass), and in each block the W tiles of
// shape.rows rows in order, each read by passes of shape.m x rows. So a tile is streamed from
// memory once per block and re-read from L1/L2 by the block's other passes, and the block's x
// rows are re-read from L2 by every tile, not from L3 or memory. on_tile(n, rows) is called
// before a tile's first pass in each block; on_pass(n, rows, next, m, ms, first) for each pass,
// next being the next tile's first row when it is a whole one inside the range (kNoRow if not)
// and first whether this is the tile's first pass in the block (the one that prefetches the
// next tile: later passes find this tile in cache and the next already on its way).
template <class OnTile, class OnPass>
HWY_INLINE void ForEachPass(size_t M, size_t n_begin, size_t n_end, TileShape shape,
                            size_t x_row_bytes, const OnTile& on_tile, const OnPass& on_pass) {
  const size_t block_rows =
      std::max<size_t>(1, kXBlockBytes / std::max<size_t>(1, x_row_bytes) / shape.m) * shape.m;
  for (size_t m_block = 0; m_block < M; m_block += block_rows) {
    const size_t m_end = std::min(M, m_block + block_rows);
    for (size_t n = n_begin; n < n_end; n += shape.rows) {
      const size_t rows = std::min(shape.rows, n_end - n);
      const size_t next = n + 2 * shape.rows <= n_end ? n + shape.rows : kNoRow;
      on_tile(n, rows);
      for (size_t m = m_block; m < m_end; m += shape.m) {
        on_pass(n, rows, next, m, std::min(shape.m, m_end - m), m == m_block);
      }
    }
  }
}

// One tile: outputs y[i, r] for i < kM, r < kRows (y row i at y + i * y_stride), from x rows
// x + i * x_stride and W rows n0 + r of `fmt`. x_tail [kM, L] and w_tail [kRows, L] hold the last
// K % L elements of each row, zero-padded to L lanes (unused when L divides K).
//
// kPrefetch: next is the next tile's first row (rows next + r), which are then prefetched into
// L2 as this tile is read, one tile ahead. Every W row is its own stream, and hardware
// prefetchers do not follow a stream into the next 4 KiB page, so without this each new tile
// starts with kRows cold streams. Per step of K and row, one prefetch is issued per 16 bytes the
// step reads from the row, for consecutive lines from the current column on, so each line of the
// next tile is requested several times (prefetches that find the miss queues full are dropped).
// Measured on Zen 4, M = 1, [8192, 2048], 1 thread, weight GB/s: bf16 AVX-512 22 (one prefetch
// per step) -> 30, f32 AVX-512 31 -> 32, f32 AVX2 27 -> 32, bf16 AVX2 29 -> 28; none at all:
// bf16 AVX-512 20. Prefetching into L1 (T0) was slower than into L2. A template parameter rather
// than a test of next in the loop, which cost the compute-bound passes (M = 128) 13%.
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
  constexpr bool kByGroup = IsGroupWise<Fmt>::value && kM <= kMaxGroupWiseM;
  if constexpr (kByGroup) {
    // A group of V vectors per row at a time, each row's vectors fed to its accumulators in
    // order of k: the same chain of MulAdds per output as one vector at a time.
    constexpr size_t kMaxGroupVectors = Fmt::kGroup;  // L = 1 at the least
    const size_t V = Fmt::GroupVectors(df);
    for (; k < K; k += Fmt::kGroup) {
      for (size_t r = 0; r < kRows; ++r) {
        if constexpr (kPrefetch) {
          __builtin_prefetch(reinterpret_cast<const void*>(fmt.Address(next + r, k)), 0, 2);
        }
        VF wv[kMaxGroupVectors];
        fmt.LoadGroup(df, n0 + r, k, wv);
        for (size_t v = 0; v < V; ++v) {
          for (size_t i = 0; i < kM; ++i) {
            acc[i][r] = hn::MulAdd(wv[v], hn::LoadU(df, x + i * x_stride + k + v * L), acc[i][r]);
          }
        }
      }
    }
  }
  if constexpr (!kByGroup) {
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
      M, n_begin, n_end, shape, K * sizeof(float),
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

// ---- w8a8 (kernels/quantize.h): int8 activations times int8 weights, summed exactly in int32.

// Row x[0, K) quantized into p[0, K); its scale into *scale; returns sum_k p[k]. Bit-identical
// to ref::QuantizeActivationRow on every target: max and the int32 sum are exact, and each p is
// the same f32 product rounded half to even (NearestInt here, nearbyint there).
inline int32_t QuantizeActivationRow(const float* HWY_RESTRICT x, size_t K, int8_t* HWY_RESTRICT p,
                                     float* HWY_RESTRICT scale) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t L = hn::Lanes(df);
  // Largest magnitude, and v * 0 summed: NaN if any element is Inf or NaN.
  VF vmax = hn::Zero(df), poison = hn::Zero(df);
  size_t k = 0;
  for (; k + L <= K; k += L) {
    const VF v = hn::LoadU(df, x + k);
    vmax = hn::Max(vmax, hn::Abs(v));
    poison = hn::MulAdd(v, hn::Zero(df), poison);
  }
  float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
  bool finite = !std::isnan(hn::GetLane(hn::SumOfLanes(df, poison)));
  for (size_t j = k; j < K; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!finite || amax < kMinQ8A8Scale) {
    std::fill(p, p + K, int8_t{0});
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return 0;
  }
  const float inv = 127.0f / amax;
  const VF vinv = hn::Set(df, inv);
  const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
  auto vsum = hn::Zero(di);
  for (k = 0; k + L <= K; k += L) {
    const auto q = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, x + k), vinv)), lo), hi);
    vsum = hn::Add(vsum, q);
    hn::StoreU(hn::DemoteTo(d8, q), d8, p + k);
  }
  int32_t sum = hn::GetLane(hn::SumOfLanes(di, vsum));
  for (; k < K; ++k) {
    p[k] = static_cast<int8_t>(std::clamp(std::nearbyint(x[k] * inv), -127.0f, 127.0f));
    sum += p[k];
  }
  *scale = amax / 127.0f;
  return sum;
}

// One tile of w8a8 outputs: y[i, r] for i < kM, r < kRows, from quantized x rows m0 + i and W
// rows n0 + r (int8 [N, K] at w, scales w_scales). Integer sums, so the order is free: per step
// of K each W vector is loaded once and used for kM rows of x, as in Tile above, and the K % step
// tail is added one product at a time. kPrefetch / next: as in Tile.
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
// types, GCC 12 stored every accumulator to the stack after each vpdpbusd. It still copies each
// accumulator through a register around it; [8192, 2048] x 128 rows, 2 threads, this EPYC
// AVX-512: 10.2 ms (Highway types, tiles 6 x 4) -> 5.2-8.4 ms (this, 4 x 4; a noisy VM).
#if HWY_COMPILER_GCC_ACTUAL
#define MOESERVE_NO_AVXVNNI __attribute__((target("no-avxvnni")))
#else
#define MOESERVE_NO_AVXVNNI
#endif
template <size_t kRows, size_t kM, bool kPrefetch>
MOESERVE_NO_AVXVNNI inline void VnniSteps(
    const Int8Rows& xq, size_t m0, const int8_t* HWY_RESTRICT w, size_t K, size_t k_end,
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

// Prefetches a step's worth of a W row of the next tile, as Tile does.
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
      xv[i] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(xq.q + (m0 + i) * xq.stride + k));
      ax[i] = _mm256_sign_epi8(xv[i], xv[i]);
    }
    for (size_t r = 0; r < kRows; ++r) {
      if constexpr (kPrefetch) PrefetchQ8A8Row(w + (next + r) * K + k, kStep);
      const __m256i wv =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n0 + r) * K + k));
      for (size_t i = 0; i < kM; ++i) {
        const __m256i pairs = _mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(wv, xv[i]));
        acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(acc[i][r]),
                                         _mm256_extracti128_si256(acc[i][r], 1));
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
      y[i * y_stride + r] =
          static_cast<float>(sum) * xq.scales[m0 + i] * w_scales[n0 + r];
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

// The quantized-activation kernels (w8a8, w4a8) as types, for one tile table and range loop.
struct Q8A8Kernel {
  using Weight = int8_t;
  static constexpr size_t kMaxRows = kMaxTileRows, kMaxM = kMaxTileM;
  template <size_t kRows, size_t kM, bool kPrefetch>
  static void Tile(const Int8Rows& xq, size_t m0, const int8_t* HWY_RESTRICT w,
                   const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
                   float* HWY_RESTRICT y, size_t y_stride) {
    TileQ8A8<kRows, kM, kPrefetch>(xq, m0, w, w_scales, K, n0, next, y, y_stride);
  }
  static TileShape Shape(size_t M) { return ChooseTileShapeQ8A8(M); }
};

// ---- w4a8 (kernels/quantize.h): int8 activations times int4 weights, exact per group.
//
// Layout. A w4a8 W row stores int4's groups: 16 bytes per group of 32, byte j holding weights j
// (low nibble) and j + 16 (high). A vector of 64 bytes (a block: 4 groups, kQ4A8Block weights)
// thus splits into a vector of its 64 low nibbles and one of its 64 high ones. The quantized x
// rows are reordered to match (ToQ4A8Layout, kernels/quantize.h): per block, p of the 4 groups'
// first halves, then of their second halves, so that each nibble vector meets its x bytes in one
// load. The kernels multiply nibbles (0 .. 15, unsigned) by p (signed): sum nibble * p over a
// group, less 8 * sum p over the group (xq.sums), is the group's exact sum i_g.
//
// Order. A superblock is 16 groups (4 blocks): their 16 sums i_g become one vector of 16 ints in
// group order (per target below), then acc[g] = fma(float(i_g), s_g, acc[g]) for the 16 lanes,
// zeros past the row's end; at the end the 16 lanes are added as a tree. The same operations in
// the same order on every target (kQ4A8Lanes accumulators), hence the same bits.

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// A tile's rows, located once: W row r's nibbles and scales, the next tile's row r (prefetch),
// x row i's reordered p and group sums.
template <size_t kRows, size_t kM>
struct Q4A8Tile {
  const uint8_t* HWY_RESTRICT w[kRows];
  const uint8_t* HWY_RESTRICT next_w[kRows];
  const float* HWY_RESTRICT scales[kRows];
  const int8_t* HWY_RESTRICT p[kM];
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
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), low, p_low), high,
                             p_high);
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
  const __m512i sums = _mm512_add_epi32(
      _mm512_castps_si512(_mm512_shuffle_ps(abf, cdf, _MM_SHUFFLE(2, 0, 2, 0))),
      _mm512_castps_si512(_mm512_shuffle_ps(abf, cdf, _MM_SHUFFLE(3, 1, 3, 1))));
  const __m512i transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(transpose, sums);
}

// The superblock at column k, of which kBlocks blocks lie inside the row, for every output of
// a tile: the W row's nibbles unpacked once per block, used by the tile's kM x rows.
template <size_t kBlocks, size_t kRows, size_t kM, bool kPrefetch>
HWY_INLINE void SuperblockQ4A8(const Q4A8Tile<kRows, kM>& t, size_t k,
                               Q4A8Acc (&acc)[kM][kRows]) {
  constexpr __mmask16 kValid = static_cast<__mmask16>((1u << (4 * kBlocks)) - 1);
  const size_t g0 = k / kQ4Group;
  const __m512i nibble = _mm512_set1_epi8(15);
#pragma GCC unroll 8
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kPrefetch) {
      for (size_t j = 0; j < kBlocks; ++j) __builtin_prefetch(t.next_w[r] + k / 2 + 64 * j, 0, 2);
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
        const __m512i part =
            b < kBlocks ? BlockDotQ4A8(low, high, t.p[i] + k + 128 * b) : _mm512_setzero_si512();
        if (b % 2 == 0) {
          pending[i] = part;
        } else {
          pairs[i][b / 2] = PairQ4A8(pending[i], part);
        }
      }
    }
    const __m512 scales = kBlocks == 4 ? _mm512_loadu_ps(t.scales[r] + g0)
                                       : _mm512_maskz_loadu_ps(kValid, t.scales[r] + g0);
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
  const __m256i sums = _mm256_add_epi32(
      _mm256_castps_si256(_mm256_shuffle_ps(abf, cdf, _MM_SHUFFLE(2, 0, 2, 0))),
      _mm256_castps_si256(_mm256_shuffle_ps(abf, cdf, _MM_SHUFFLE(3, 1, 3, 1))));
  return _mm256_permutevar8x32_epi32(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The first `count` (4 or 8) ints or floats at `from`, zeros after.
template <size_t kCount>
HWY_INLINE __m256i LoadFirstQ4A8(const void* from) {
  if constexpr (kCount == 8) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(from));
  } else {
    return _mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(from)));
  }
}

template <size_t kBlocks, size_t kRows, size_t kM, bool kPrefetch>
HWY_INLINE void SuperblockQ4A8(const Q4A8Tile<kRows, kM>& t, size_t k,
                               Q4A8Acc (&acc)[kM][kRows]) {
  const size_t g0 = k / kQ4Group;
  const __m256i nibble = _mm256_set1_epi8(15);
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kPrefetch) {
      for (size_t j = 0; j < kBlocks; ++j) __builtin_prefetch(t.next_w[r] + k / 2 + 64 * j, 0, 2);
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
          const int8_t* HWY_RESTRICT p = t.p[i] + k + 256 * q + 128 * (h / 2) + 32 * (h % 2);
          const __m256i part =
              h / 2 < blocks ? HalfBlockDotQ4A8(low, high, p, p + 64) : _mm256_setzero_si256();
          if (h % 2 == 0) {
            pending[i] = part;
          } else {
            pairs[i][h / 2] = PairQ4A8(pending[i], part);
          }
        }
      }
      const __m256 scales = _mm256_castsi256_ps(
          blocks == 2 ? LoadFirstQ4A8<8>(t.scales[r] + g0 + 8 * q)
                      : LoadFirstQ4A8<4>(t.scales[r] + g0 + 8 * q));
      for (size_t i = 0; i < kM; ++i) {
        const __m256i p_sums = blocks == 2 ? LoadFirstQ4A8<8>(t.sums[i] + g0 + 8 * q)
                                           : LoadFirstQ4A8<4>(t.sums[i] + g0 + 8 * q);
        const __m256i sums = _mm256_sub_epi32(GroupSumsQ4A8(pairs[i][0], pairs[i][1]),
                                              _mm256_slli_epi32(p_sums, 3));
        acc[i][r].half[q] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scales, acc[i][r].half[q]);
      }
    }
  }
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
template <size_t kRows, size_t kM, bool kPrefetch>
void TileQ4A8(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
              const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
              float* HWY_RESTRICT y, size_t y_stride) {
  constexpr size_t kSuper = 4 * kQ4A8Block;
  const size_t groups = K / kQ4Group;
  Q4A8Tile<kRows, kM> t;
  for (size_t r = 0; r < kRows; ++r) {
    t.w[r] = w + (n0 + r) * K / 2;
    t.next_w[r] = kPrefetch ? w + (next + r) * K / 2 : nullptr;
    t.scales[r] = w_scales + (n0 + r) * groups;
  }
  for (size_t i = 0; i < kM; ++i) {
    t.p[i] = xq.q + (m0 + i) * xq.stride;
    t.sums[i] = xq.sums + (m0 + i) * xq.sums_stride;
  }
  Q4A8Acc acc[kM][kRows];
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) acc[i][r] = ZeroQ4A8Acc();
  }
  size_t k = 0;
  for (; k + kSuper <= K; k += kSuper) SuperblockQ4A8<4, kRows, kM, kPrefetch>(t, k, acc);
  switch ((K - k) / kQ4A8Block) {
    case 1: SuperblockQ4A8<1, kRows, kM, kPrefetch>(t, k, acc); break;
    case 2: SuperblockQ4A8<2, kRows, kM, kPrefetch>(t, k, acc); break;
    case 3: SuperblockQ4A8<3, kRows, kM, kPrefetch>(t, k, acc); break;
    default: break;
  }
  for (size_t i = 0; i < kM; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      y[i * y_stride + r] = ReduceQ4A8(acc[i][r]) * xq.scales[m0 + i];
    }
  }
}

#else
// Other targets: one group at a time in scalar code, std::fma for the step every target takes.
template <size_t kRows, size_t kM, bool kPrefetch>
void TileQ4A8(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
              const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t /*next*/,
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
            const int8_t* HWY_RESTRICT p_low = p + 128 * b + 16 * t;
            sum += (byte & 15) * p_low[j] + (byte >> 4) * p_low[64 + j];
          }
          sum -= 8 * p_sums[g];
          scale = w_scales[(n0 + r) * groups + g];
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
  // M = 1 measured ({4, 1} against {2, 1}, [8192, 2048], alternating: 298, 304, 292 against
  // 350, 354, 379 us; AVX-512's {8, 1} was slower than its {4, 1}).
  return M == 1 ? TileShape{4, 1} : TileShape{1, 2};
#else
  (void)M;
  return {1, 1};
#endif
}

struct Q4A8Kernel {
  using Weight = uint8_t;
  // The largest tile ChooseTileShapeQ4A8 picks (the table holds no larger ones: each tile is
  // compiled four times, per number of blocks in a superblock).
  static constexpr size_t kMaxRows = 4, kMaxM = 4;
  template <size_t kRows, size_t kM, bool kPrefetch>
  static void Tile(const Int8Rows& xq, size_t m0, const uint8_t* HWY_RESTRICT w,
                   const float* HWY_RESTRICT w_scales, size_t K, size_t n0, size_t next,
                   float* HWY_RESTRICT y, size_t y_stride) {
    TileQ4A8<kRows, kM, kPrefetch>(xq, m0, w, w_scales, K, n0, next, y, y_stride);
  }
  static TileShape Shape(size_t M) { return ChooseTileShapeQ4A8(M); }
};

template <class Kernel>
using QuantizedTileFn = void (*)(const Int8Rows&, size_t,
                                 const typename Kernel::Weight* HWY_RESTRICT,
                                 const float* HWY_RESTRICT, size_t, size_t, size_t,
                                 float* HWY_RESTRICT, size_t);

// A kernel's tiles, indexed as the float ones (TileAt).
template <class Kernel, bool kPrefetch, size_t kI>
constexpr QuantizedTileFn<Kernel> QuantizedTileAt() {
  constexpr size_t kRows = kI / kMaxTileM + 1;
  constexpr size_t kM = kI % kMaxTileM + 1;
  if constexpr (kRows * kM <= kMaxAccumulators && kRows <= Kernel::kMaxRows &&
                kM <= Kernel::kMaxM) {
    return &Kernel::template Tile<kRows, kM, kPrefetch>;
  } else {
    return nullptr;
  }
}
template <class Kernel, bool kPrefetch, size_t... kI>
constexpr std::array<QuantizedTileFn<Kernel>, sizeof...(kI)> MakeQuantizedTiles(
    std::index_sequence<kI...>) {
  return {QuantizedTileAt<Kernel, kPrefetch, kI>()...};
}

// y[m, n] for m < M and n in [n_begin, n_end) from quantized activations xq against a
// kernel's weights, in ForEachPass's order.
template <class Kernel>
void MatMulRangeQuantized(const Int8Rows& xq, size_t M,
                          const typename Kernel::Weight* HWY_RESTRICT w,
                          const float* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                          size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  using Tiles = std::array<QuantizedTileFn<Kernel>, kMaxTileRows * kMaxTileM>;
  static constexpr Tiles kTiles =
      MakeQuantizedTiles<Kernel, false>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  static constexpr Tiles kPrefetchingTiles =
      MakeQuantizedTiles<Kernel, true>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  ForEachPass(
      M, n_begin, n_end, Kernel::Shape(M), xq.stride, [](size_t, size_t) {},
      [&](size_t n, size_t rows, size_t next, size_t m, size_t ms, bool first) {
        const Tiles& tiles = first && next != kNoRow ? kPrefetchingTiles : kTiles;
        tiles[(rows - 1) * kMaxTileM + (ms - 1)](xq, m, w, w_scales, K, n, next,
                                                 y + m * y_stride + n, y_stride);
      });
}

}  // namespace matmul_internal

// Quantizes M rows of x (row m at x + m * x_stride, K floats) for w8a8 into out: row m's values
// at out.q + m * out.stride, its scale and sum at out.scales[m] and out.sums[m].
inline void QuantizeActivationsImpl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                    size_t K, int8_t* HWY_RESTRICT q, size_t q_stride,
                                    float* HWY_RESTRICT scales, int32_t* HWY_RESTRICT sums) {
  for (size_t m = 0; m < M; ++m) {
    sums[m] = matmul_internal::QuantizeActivationRow(x + m * x_stride, K, q + m * q_stride,
                                                     &scales[m]);
  }
}

// y[m, n] for m < M and n in [n_begin, n_end) against w8a8 weights (int8 [N, K] at w with
// w_scales), from activations already quantized (xq).
inline void MatMulRangeQ8A8Impl(const Int8Rows& xq, size_t M, const int8_t* HWY_RESTRICT w,
                                const float* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                                size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  matmul_internal::MatMulRangeQuantized<matmul_internal::Q8A8Kernel>(xq, M, w, w_scales, K,
                                                                     n_begin, n_end, y, y_stride);
}

// Quantizes M rows of x for w4a8 as QuantizeActivationsImpl does, then reorders each row into
// the w4a8 layout with its group sums at sums + m * sums_stride (ToQ4A8Layout).
inline void QuantizeActivationsQ4A8Impl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                                        size_t K, int8_t* HWY_RESTRICT q, size_t q_stride,
                                        float* HWY_RESTRICT scales, int32_t* HWY_RESTRICT sums,
                                        size_t sums_stride) {
  for (size_t m = 0; m < M; ++m) {
    matmul_internal::QuantizeActivationRow(x + m * x_stride, K, q + m * q_stride, &scales[m]);
    ToQ4A8Layout(q + m * q_stride, static_cast<int64_t>(K), sums + m * sums_stride);
  }
}

// y[m, n] against w4a8 weights (int4 [N, K] at w with w_scales), from activations quantized by
// QuantizeActivationsQ4A8Impl.
inline void MatMulRangeQ4A8Impl(const Int8Rows& xq, size_t M, const uint8_t* HWY_RESTRICT w,
                                const float* HWY_RESTRICT w_scales, size_t K, size_t n_begin,
                                size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  matmul_internal::MatMulRangeQuantized<matmul_internal::Q4A8Kernel>(xq, M, w, w_scales, K,
                                                                     n_begin, n_end, y, y_stride);
}

// y[m, n] = sum_k x[m, k] * W[n, k] for m < M and n in [n_begin, n_end), on this target. w is
// row-major [N, K] of w_dtype (kBF16, kF32, or packed kQ8 / kQ4 / kQ8A8 / kQ4A8 with their
// `scales`, core/tensor.h); x row m at x + m * x_stride, y row m at y + m * y_stride. The
// caller has validated the arguments (kernels/matmul.cc). kQ8A8 and kQ4A8 quantize x here, per
// call; MatMul and MatMulGroup quantize once per call instead and call MatMulRangeQ8A8Impl /
// MatMulRangeQ4A8Impl.
//
// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes its address, which forces an out-of-line definition per target.
inline void MatMulRangeImpl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                            const void* HWY_RESTRICT w, DType w_dtype, const float* scales,
                            size_t K, size_t n_begin, size_t n_end, float* HWY_RESTRICT y,
                            size_t y_stride) {
  namespace mi = matmul_internal;
  switch (w_dtype) {
    case DType::kBF16:
      mi::MatMulRangeT(x, x_stride, M,
                       mi::FloatRows<hwy::bfloat16_t>{static_cast<const hwy::bfloat16_t*>(w), K},
                       n_begin, n_end, y, y_stride);
      return;
    case DType::kQ8:
      mi::MatMulRangeT(x, x_stride, M, mi::Q8Rows{static_cast<const int8_t*>(w), scales, K},
                       n_begin, n_end, y, y_stride);
      return;
    case DType::kQ4:
      mi::MatMulRangeT(x, x_stride, M, mi::Q4Rows{static_cast<const uint8_t*>(w), scales, K},
                       n_begin, n_end, y, y_stride);
      return;
    case DType::kQ8A8:
    case DType::kQ4A8: {
      // Quantizes x here, on this thread (kernels/matmul.cc quantizes once per call instead).
      const size_t groups = K / static_cast<size_t>(kQ4Group);
      thread_local std::vector<int8_t> q;
      thread_local std::vector<float> x_scales;
      thread_local std::vector<int32_t> x_sums;
      q.resize(M * K);
      x_scales.resize(M);
      if (w_dtype == DType::kQ8A8) {
        x_sums.resize(M);
        QuantizeActivationsImpl(x, x_stride, M, K, q.data(), K, x_scales.data(), x_sums.data());
        MatMulRangeQ8A8Impl(Int8Rows{q.data(), K, x_scales.data(), x_sums.data(), 1}, M,
                            static_cast<const int8_t*>(w), scales, K, n_begin, n_end, y, y_stride);
      } else {
        x_sums.resize(M * groups);
        QuantizeActivationsQ4A8Impl(x, x_stride, M, K, q.data(), K, x_scales.data(),
                                    x_sums.data(), groups);
        MatMulRangeQ4A8Impl(Int8Rows{q.data(), K, x_scales.data(), x_sums.data(), groups}, M,
                            static_cast<const uint8_t*>(w), scales, K, n_begin, n_end, y, y_stride);
      }
      return;
    }
    default:
      mi::MatMulRangeT(x, x_stride, M, mi::FloatRows<float>{static_cast<const float*>(w), K},
                       n_begin, n_end, y, y_stride);
      return;
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_INL_H_
