// What the matmul kernels of every weight format share, per target (kernels/matmul-inl.h
// includes them all): the register budget and tile shapes, the order in which a range of W rows
// meets the rows of x (ForEachPass), and, for the formats that quantize activations (w8a8, w4a8,
// int4), the row quantizer and the range loop over a kernel's table of tiles.
//
// Batch invariance (docs/design.md principle 2). Every format computes each output y[m, n] in an
// order that depends on K, the data and the SIMD target only (w8a8, w4a8, int4: on K and the data
// only): never on the tile shape chosen for it (which depends on M, on n_begin/n_end and on N),
// nor on the thread that computes it. Each format's file states its order: matmul_float-inl.h
// (f32 / bf16, and the int8 weights it widens), matmul_int8-inl.h (w8a8),
// matmul_int4-inl.h (w4a8, int4).
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "hwy/highway.h"
#include "kernels/quantize.h"

#if defined(MOESERVE_KERNELS_MATMUL_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_COMMON_INL_H_
#undef MOESERVE_KERNELS_MATMUL_COMMON_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_COMMON_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// Highway 1.0.3's AVX3_DL target enables "avxvnni" (the VEX form), not the AVX-512 VNNI that
// its CPU check requires and that the w8a8, w4a8 and int4 kernels use. Every matmul file compiles
// with the same attributes, so that its functions inline into one another.
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

// Small M is memory-bound: as many rows per tile as fit (more concurrent W streams), with all of
// M in one pass. Larger M is compute-bound: passes of several x rows over a tile of W rows, each
// pass after the first re-reading its tile of W from L1/L2, not from memory. With 32 registers
// (AVX-512) passes of 4 x rows over 6 W rows, which measured faster than 3 over 8 at every M
// tried from 6 to 128 (docs/log/kernel-comments.md): 4 x vectors + 24 accumulators + 1 W vector
// fill the 32 registers, and a W row converted from bf16 serves 4 FMAs. With 16 registers (AVX2)
// passes of 3 x rows over 4 W rows.
inline TileShape ChooseTileShape(size_t M) {
  if (M * 8 <= kMaxAccumulators) return {8, M};
  if (M * 6 <= kMaxAccumulators) return {6, M};
  if (kMaxAccumulators >= 24) return {6, 4};
  return {kMaxAccumulators / 3, 3};
}

// "No next tile to prefetch."
inline constexpr size_t kNoRow = ~size_t{0};

// Bytes of x rows that the passes over a W tile cover before the next tile (ForEachPass): half
// of the 1 MiB L2 of Zen 4 and 5, which keeps x in L2 while the W tiles stream past it (the
// blocks' sizes measured against one another: docs/log/kernel-comments.md). On AVX2 (half the
// FMA rate) the block size made no difference beyond noise.
inline constexpr size_t kXBlockBytes = size_t{512} << 10;

// How far ahead of the tile being read its first pass prefetches W: at least this many bytes of
// rows (whole tiles; at least the next one). A W range is one contiguous run of rows, so this
// keeps that many bytes of requests in flight ahead of the kernel. One tile ahead left short rows
// (an expert's down projection: K = 512 or 768) waiting on memory at each tile
// (docs/log/kernel-comments.md).
inline constexpr size_t kPrefetchAheadBytes = size_t{8} << 10;

// The order in which a range of W rows [n_begin, n_end) meets M rows of x: blocks of x rows of
// at most kXBlockBytes (x_row_bytes each; at least one pass), and in each block the W tiles of
// shape.rows rows in order, each read by passes of shape.m x rows. So a tile is streamed from
// memory once per block and re-read from L1/L2 by the block's other passes, and the block's x
// rows are re-read from L2 by every tile, not from L3 or memory. on_tile(n, rows) is called
// before a tile's first pass in each block; on_pass(n, rows, next, m, ms, first) for each pass,
// next being the first row of the tile kPrefetchAheadBytes ahead (w_row_bytes per W row) when it
// is a whole one inside the range (kNoRow if not) and first whether this is the tile's first pass
// in the block (the one that prefetches: later passes find this tile in cache and the one ahead
// already on its way).
template <class OnTile, class OnPass>
HWY_INLINE void ForEachPass(size_t M, size_t n_begin, size_t n_end, TileShape shape,
                            size_t x_row_bytes, size_t w_row_bytes, const OnTile& on_tile,
                            const OnPass& on_pass) {
  const size_t block_rows =
      std::max<size_t>(1, kXBlockBytes / std::max<size_t>(1, x_row_bytes) / shape.m) * shape.m;
  const size_t tile_bytes = std::max<size_t>(1, shape.rows * w_row_bytes);
  const size_t ahead =
      std::max<size_t>(1, (kPrefetchAheadBytes + tile_bytes - 1) / tile_bytes) * shape.rows;
  for (size_t m_block = 0; m_block < M; m_block += block_rows) {
    const size_t m_end = std::min(M, m_block + block_rows);
    for (size_t n = n_begin; n < n_end; n += shape.rows) {
      const size_t rows = std::min(shape.rows, n_end - n);
      const size_t next = n + ahead + shape.rows <= n_end ? n + ahead : kNoRow;
      on_tile(n, rows);
      for (size_t m = m_block; m < m_end; m += shape.m) {
        on_pass(n, rows, next, m, std::min(shape.m, m_end - m), m == m_block);
      }
    }
  }
}

// ---- Activations quantized to integers (w8a8, w4a8, int4; kernels/quantize.h).

// The largest magnitude of x[0, K) and whether every element is finite (exact on every target).
inline float RowAbsMax(const float* HWY_RESTRICT x, size_t K, bool* finite) {
  const DF df;
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
  *finite = !std::isnan(hn::GetLane(hn::SumOfLanes(df, poison)));
  for (size_t j = k; j < K; ++j) {
    *finite = *finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  return amax;
}

// The scale of row x[0, K) quantized to `levels` (kernels/quantize.h) into *scale: 0 for a row
// below kMinQ8A8Scale, NaN for one holding Inf or NaN, else max|x| / levels. Returns
// levels / max|x|, or 0 when the row quantizes to p = 0 (the first two cases).
inline float ActivationScale(const float* HWY_RESTRICT x, size_t K, float levels,
                             float* HWY_RESTRICT scale) {
  bool finite = true;
  const float amax = RowAbsMax(x, K, &finite);
  *scale = !finite                ? std::numeric_limits<float>::quiet_NaN()
           : amax < kMinQ8A8Scale ? 0.0f
                                  : amax / levels;
  return finite && amax >= kMinQ8A8Scale ? levels / amax : 0.0f;
}

// Row x[0, K) quantized into p[0, K); its scale into *scale; returns sum_k p[k]. Bit-identical
// to ref::QuantizeActivationRow on every target: max and the int32 sum are exact, and each p is
// the same f32 product rounded half to even (NearestInt here, nearbyint there).
inline int32_t QuantizeActivationRow(const float* HWY_RESTRICT x, size_t K, int8_t* HWY_RESTRICT p,
                                     float* HWY_RESTRICT scale) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t L = hn::Lanes(df);
  const float inv = ActivationScale(x, K, 127.0f, scale);
  if (inv == 0.0f) {
    std::fill(p, p + K, int8_t{0});
    return 0;
  }
  size_t k = 0;
  const VF vinv = hn::Set(df, inv);
  const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
  auto vsum = hn::Zero(di);
  for (; k + L <= K; k += L) {
    const auto q = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, x + k), vinv)), lo), hi);
    vsum = hn::Add(vsum, q);
    hn::StoreU(hn::DemoteTo(d8, q), d8, p + k);
  }
  int32_t sum = hn::GetLane(hn::SumOfLanes(di, vsum));
  for (; k < K; ++k) {
    p[k] = static_cast<int8_t>(std::clamp(std::nearbyint(x[k] * inv), -127.0f, 127.0f));
    sum += p[k];
  }
  return sum;
}

template <class Kernel>
using QuantizedTileFn = void (*)(const Int8Rows&, size_t,
                                 const typename Kernel::Weight* HWY_RESTRICT,
                                 const typename Kernel::Scale* HWY_RESTRICT, size_t, size_t, size_t,
                                 float* HWY_RESTRICT, size_t);

// A kernel's tiles, indexed as the float ones (TileAt, matmul_float-inl.h).
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
// kernel's weights (Q8A8Kernel, Q4A8Kernel: weight and scale types, Tile<kRows, kM, kPrefetch> and
// Shape(M)), in ForEachPass's order.
template <class Kernel>
void MatMulRangeQuantized(const Int8Rows& xq, size_t M,
                          const typename Kernel::Weight* HWY_RESTRICT w,
                          const typename Kernel::Scale* HWY_RESTRICT w_scales, size_t K,
                          size_t n_begin, size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  using Tiles = std::array<QuantizedTileFn<Kernel>, kMaxTileRows * kMaxTileM>;
  static constexpr Tiles kTiles =
      MakeQuantizedTiles<Kernel, false>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  static constexpr Tiles kPrefetchingTiles =
      MakeQuantizedTiles<Kernel, true>(std::make_index_sequence<kMaxTileRows * kMaxTileM>());
  ForEachPass(
      M, n_begin, n_end, Kernel::Shape(M), xq.stride, Kernel::RowBytes(K), [](size_t, size_t) {},
      [&](size_t n, size_t rows, size_t next, size_t m, size_t ms, bool first) {
        const Tiles& tiles = first && next != kNoRow ? kPrefetchingTiles : kTiles;
        tiles[(rows - 1) * kMaxTileM + (ms - 1)](xq, m, w, w_scales, K, n, next,
                                                 y + m * y_stride + n, y_stride);
      });
}

}  // namespace matmul_internal
}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_COMMON_INL_H_
