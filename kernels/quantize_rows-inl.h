// Per-target bodies of kernels::QuantizeRows (kernels/quantize.h), for inclusion from
// foreach_target translation units: kernels/quantize_rows.cc dispatches to them,
// kernels/quantize_rows_test.cc calls them on every compiled target.
//
// Each row is widened from bf16 (or read as f32) and quantized in registers, with the arithmetic
// of the scalar twin QuantizeRow (kernels/quantize.cc) step for step, so that the bytes are the
// same: the largest magnitude skipping NaN (a comparison, as MaxAbs does: a NaN lane is never
// greater), 0 when it is infinite; the scale and its inverse computed in scalar from it exactly
// as there (int4's through the f16 rounding of core/dtype.h); then per lane one f32 multiply,
// round to nearest even, NaN to 0 and a clamp to [-limit, limit].
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "hwy/highway.h"

#if defined(MOESERVE_KERNELS_QUANTIZE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_QUANTIZE_ROWS_INL_H_
#undef MOESERVE_KERNELS_QUANTIZE_ROWS_INL_H_
#else
#define MOESERVE_KERNELS_QUANTIZE_ROWS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace packing {

// At most 16 f32 lanes, so that a lane count divides half an int4 group (16 weights) on every
// target: 16 on AVX-512, 8 on AVX2, 4 on the 128-bit targets.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
constexpr size_t kMaxLanes = 16;

// Lanes(df) source values as f32: bf16 shifted into an f32's high half (exact, as BF16ToF32),
// f32 as they are.
HWY_INLINE VF LoadWidened(DF df, const uint16_t* HWY_RESTRICT bf16) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<uint32_t, DF> d32;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, bf16))));
}
HWY_INLINE VF LoadWidened(DF df, const float* HWY_RESTRICT f32) { return hn::LoadU(df, f32); }

// The first count (< Lanes(df)) values of p, the other lanes 0 (which change neither the
// largest magnitude nor anything stored).
template <typename T>
HWY_INLINE VF LoadWidenedTail(DF df, const T* HWY_RESTRICT p, size_t count) {
  HWY_ALIGN T buf[kMaxLanes] = {};
  std::memcpy(buf, p, HWY_MIN(count, kMaxLanes) * sizeof(T));
  return LoadWidened(df, buf);
}

// The running largest magnitude m updated with v's lanes; a NaN lane leaves m as it is.
HWY_INLINE VF MaxAbsStep(VF m, VF v) {
  const VF a = hn::Abs(v);
  return hn::IfThenElse(hn::Gt(a, m), a, m);
}

// The largest lane of m (NaN-free), or 0 when it is infinite: QuantizeRow's MaxAbs.
HWY_INLINE float FiniteMax(DF df, VF m) {
  const float max = hn::GetLane(hn::MaxOfLanes(df, m));
  return std::isfinite(max) ? max : 0.0f;
}

// round(v * inv) in [-limit, limit] as f32 lanes (whole numbers), 0 where the product is NaN.
HWY_INLINE VF QuantizeLanes(VF v, VF inv, VF limit) {
  const VF q = hn::Round(hn::Mul(v, inv));
  return hn::Min(hn::Max(hn::IfThenZeroElse(hn::IsNaN(q), q), hn::Neg(limit)), limit);
}

// Whole-number f32 lanes in the range of T, stored as Lanes(df) values of T.
template <typename T>
HWY_INLINE void StoreNarrowed(DF df, VF q, T* HWY_RESTRICT to) {
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<T, DF> dt;
  hn::StoreU(hn::DemoteTo(dt, hn::ConvertTo(di, q)), dt, to);
}

// One int8 row (int8 and w8a8): K values from `from`, q[0, K) and the row's f32 scale.
template <typename T>
HWY_INLINE void QuantizeInt8Row(const T* HWY_RESTRICT from, size_t K, int8_t* HWY_RESTRICT q,
                                float* HWY_RESTRICT scale) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t whole = K / N * N;
  VF m = hn::Zero(df);
  for (size_t k = 0; k < whole; k += N) m = MaxAbsStep(m, LoadWidened(df, from + k));
  if (whole < K) m = MaxAbsStep(m, LoadWidenedTail(df, from + whole, K - whole));
  const float s = FiniteMax(df, m) / 127.0f;
  const VF inv = hn::Set(df, s > 0.0f ? 1.0f / s : 0.0f), limit = hn::Set(df, 127.0f);
  for (size_t k = 0; k < whole; k += N) {
    StoreNarrowed(df, QuantizeLanes(LoadWidened(df, from + k), inv, limit), q + k);
  }
  if (whole < K) {
    HWY_ALIGN int8_t tail[kMaxLanes];
    StoreNarrowed(df, QuantizeLanes(LoadWidenedTail(df, from + whole, K - whole), inv, limit),
                  tail);
    std::memcpy(q + whole, tail, HWY_MIN(K - whole, kMaxLanes));
  }
  *scale = s;
}

// One int4 row (int4 and w4a8), K a multiple of kQ4Group: per group of 32 values from `from`,
// its f16 scale and 16 bytes of nibbles (byte j: element j low, element j + 16 high, each q + 8).
template <typename T>
HWY_INLINE void QuantizeInt4Row(const T* HWY_RESTRICT from, size_t K, uint8_t* HWY_RESTRICT bytes,
                                uint16_t* HWY_RESTRICT scales) {
  constexpr size_t kHalf = kQ4Group / 2;
  // f16's largest finite value: the group scales saturate there (as in QuantizeRow).
  constexpr float kMaxF16 = 65504.0f;
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF limit = hn::Set(df, 7.0f);
  // A byte from the two quantized values lo and hi: (lo + 8) | (hi + 8) << 4 = lo + 136 + 16 hi,
  // exact in f32.
  const VF bias = hn::Set(df, 136.0f), sixteen = hn::Set(df, 16.0f);
  for (size_t g = 0; g < K / kQ4Group; ++g) {
    const T* v = from + g * kQ4Group;
    VF m = hn::Zero(df);
    for (size_t j = 0; j < kQ4Group; j += N) m = MaxAbsStep(m, LoadWidened(df, v + j));
    const uint16_t stored = F32ToF16(std::min(FiniteMax(df, m) / 7.0f, kMaxF16));
    const float s = F16ToF32(stored);
    const VF inv = hn::Set(df, s > 0.0f ? 1.0f / s : 0.0f);
    for (size_t j = 0; j < kHalf; j += N) {
      const VF lo = QuantizeLanes(LoadWidened(df, v + j), inv, limit);
      const VF hi = QuantizeLanes(LoadWidened(df, v + kHalf + j), inv, limit);
      StoreNarrowed(df, hn::MulAdd(hi, sixteen, hn::Add(lo, bias)), bytes + g * kHalf + j);
    }
    scales[g] = stored;
  }
}

// `rows` rows of K values of T at src + r * stride bytes into packed rows from q / bytes and
// scales (the first row's).
template <typename T>
HWY_INLINE void QuantizeRowsOf(const std::byte* src, size_t stride, size_t rows, size_t K,
                               bool int4, void* packed, void* scales) {
  for (size_t r = 0; r < rows; ++r) {
    const T* from = reinterpret_cast<const T*>(src + r * stride);
    if (int4) {
      QuantizeInt4Row(from, K, static_cast<uint8_t*>(packed) + r * K / 2,
                      static_cast<uint16_t*>(scales) + r * (K / kQ4Group));
    } else {
      QuantizeInt8Row(from, K, static_cast<int8_t*>(packed) + r * K,
                      static_cast<float*>(scales) + r);
    }
  }
}

}  // namespace packing

// `rows` source rows of K values, bf16 (`bf16`) or f32, at src + r * stride bytes, quantized
// into consecutive packed rows: int4 (and w4a8) to nibble bytes `packed` (K / 2 per row) and f16
// group scales (K / kQ4Group per row), else int8 (and w8a8) to `packed` (K per row) and one f32
// scale per row. int4 needs K % kQ4Group == 0.
inline void QuantizeRowsImpl(bool bf16, const std::byte* src, size_t stride, size_t rows, size_t K,
                             bool int4, void* packed, void* scales) {
  if (bf16) {
    packing::QuantizeRowsOf<uint16_t>(src, stride, rows, K, int4, packed, scales);
  } else {
    packing::QuantizeRowsOf<float>(src, stride, rows, K, int4, packed, scales);
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
