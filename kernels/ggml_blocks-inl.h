// Per-target bodies of kernels::DequantizeGgmlRow (kernels/ggml_blocks.h), for inclusion from
// foreach_target translation units: kernels/ggml_blocks.cc dispatches to them,
// kernels/ggml_blocks_test.cc calls them on every compiled target.
//
// Each vector of up to 16 weights lies in one (sub-)block: its codes are widened from bytes to
// 32-bit lanes, assembled with integer shifts and masks, converted to f32 (exact: small
// integers) and scaled with the twin's operations in the twin's order
// (kernels/ref/ggml_blocks_ref.cc), the per-block factors (d sc, dmin m) formed in scalar exactly
// as there. Both files are compiled with -ffp-contract=off, so no multiply-add is fused and every
// target gives the twin's bits.
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "hwy/highway.h"

#if defined(MOESERVE_KERNELS_GGML_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_GGML_BLOCKS_INL_H_
#undef MOESERVE_KERNELS_GGML_BLOCKS_INL_H_
#else
#define MOESERVE_KERNELS_GGML_BLOCKS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace ggml_blocks {

// At most 16 f32 lanes, so that a vector never straddles a sub-block (Q6_K's are 16 weights):
// 16 on AVX-512, 8 on AVX2, 4 on the 128-bit targets, 1 on HWY_SCALAR.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;
using DI = hn::RebindToSigned<DF>;

// Lanes(DF) bytes at p, zero-extended to 32-bit lanes.
HWY_INLINE VU LoadBytes(const uint8_t* HWY_RESTRICT p) {
  return hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<uint8_t, DF>(), p));
}

// Lanes(DF) bytes at p shifted right by `shift`, masked to `mask`.
HWY_INLINE VU BitsOfBytes(const uint8_t* HWY_RESTRICT p, int shift, uint32_t mask) {
  return hn::And(hn::ShiftRightSame(LoadBytes(p), shift), hn::Set(DU(), mask));
}

// Non-negative 32-bit integers below 2^24 as f32 (exact).
HWY_INLINE VF ToF32(VU u) { return hn::ConvertTo(DF(), hn::BitCast(DI(), u)); }

// The 16 bits at p (any alignment).
HWY_INLINE uint16_t U16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}
HWY_INLINE float F16At(const uint8_t* p) { return F16ToF32(U16At(p)); }

// Q8_0: f16 d at 0, 32 int8 at 2; w = q d.
HWY_INLINE void BlockQ8_0(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  const DF df;
  const hn::Rebind<int8_t, DF> d8;
  const VF d = hn::Set(df, F16At(b));
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (size_t i = 0; i < 32; i += hn::Lanes(df)) {
    const VF v = hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(d8, q + i)));
    hn::StoreU(hn::Mul(v, d), df, y + i);
  }
}

// Fifth bits first .. first + Lanes - 1 of `bits`, each moved to bit 4 of its lane.
HWY_INLINE VU FifthBits(uint32_t bits, uint32_t first) {
  const DU du;
  return hn::ShiftLeft<4>(hn::And(hn::Set(du, bits) >> hn::Iota(du, first), hn::Set(du, 1u)));
}

// Q4_0, Q4_1, Q5_0, Q5_1 (kFifth: 5-bit codes, their fifth bits a u32 at `high`; kAffine:
// q d + m, else (q - bias) d with bias 16 or 8). Nibbles at qs: byte i holds weights i and i + 16.
template <bool kFifth, bool kAffine>
HWY_INLINE void BlockSmall(const uint8_t* HWY_RESTRICT b, size_t high, size_t qs,
                           float* HWY_RESTRICT y) {
  const DF df;
  const VF d = hn::Set(df, F16At(b));
  const VF m = hn::Set(df, kAffine ? F16At(b + 2) : 0.0f);
  const VF bias = hn::Set(df, kFifth ? 16.0f : 8.0f);
  uint32_t fifth = 0;
  if (kFifth) std::memcpy(&fifth, b + high, sizeof(fifth));
  for (size_t i = 0; i < 16; i += hn::Lanes(df)) {
    const VU bytes = LoadBytes(b + qs + i);
    VU codes[2] = {hn::And(bytes, hn::Set(DU(), 15u)), hn::ShiftRight<4>(bytes)};
    for (size_t half = 0; half < 2; ++half) {
      if (kFifth) {
        codes[half] = hn::Or(codes[half], FifthBits(fifth, static_cast<uint32_t>(16 * half + i)));
      }
      const VF q = ToF32(codes[half]);
      VF w;
      if (kAffine) {
        // q d + m; q d's NaN wins over m's (kernels/ref/ggml_blocks_ref.h).
        const VF qd = hn::Mul(q, d);
        w = hn::IfThenElse(hn::IsNaN(qd), qd, hn::Add(qd, m));
      } else {
        w = hn::Mul(hn::Sub(q, bias), d);  // q - bias is exact, as the twin's integer
      }
      hn::StoreU(w, df, y + 16 * half + i);
    }
  }
}

// Q4_K (kFive false) and Q5_K: f16 d at 0, f16 dmin at 2, 12 bytes of 6-bit scales and mins at
// 4, [Q5_K: 32 bytes of fifth bits at 16,] 128 bytes of nibbles; sub-block j: (d sc) q - (dmin m).
template <bool kFive>
HWY_INLINE void BlockQ4_KOrQ5_K(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  const DF df;
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* high = b + 16;
  const uint8_t* qs = b + (kFive ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    // ScaleAndMin of the twin.
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    const VF step = hn::Set(df, d * static_cast<float>(sc));
    const VF offset = hn::Set(df, dmin * static_cast<float>(mn));
    const uint8_t* nibbles = qs + 32 * (j / 2);
    for (size_t i = 0; i < 32; i += hn::Lanes(df)) {
      VU q = BitsOfBytes(nibbles + i, 4 * (j % 2), 15u);
      if (kFive) q = hn::Or(q, hn::ShiftLeft<4>(BitsOfBytes(high + i, j, 1u)));
      hn::StoreU(hn::Sub(hn::Mul(step, ToF32(q)), offset), df, y + 32 * j + i);
    }
  }
}

// Q6_K: low nibbles at 0, high bit pairs at 128, int8 scales at 192, f16 d at 208; weight
// w = 128 h + 32 t + i is (d sc[w / 16]) (q - 32) (the twin says where its bits are).
HWY_INLINE void BlockQ6_K(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  const DF df;
  const float d = F16At(b + 208);
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const VF bias = hn::Set(df, 32.0f);
  for (size_t w = 0; w < 256; w += hn::Lanes(df)) {
    const size_t h = w / 128, t = (w / 32) % 4, i = w % 32;
    const VU low = BitsOfBytes(b + 64 * h + 32 * (t % 2) + i, static_cast<int>(4 * (t / 2)), 15u);
    const VU top = BitsOfBytes(b + 128 + 32 * h + i, static_cast<int>(2 * t), 3u);
    const VF q = hn::Sub(ToF32(hn::Or(low, hn::ShiftLeft<4>(top))), bias);
    const VF step = hn::Set(df, d * static_cast<float>(scales[w / 16]));
    hn::StoreU(hn::Mul(step, q), df, y + w);
  }
}

// n bf16 values widened (exact).
HWY_INLINE void RowBF16(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y, size_t n) {
  const DF df;
  const hn::Rebind<uint16_t, DF> d16;
  const size_t N = hn::Lanes(df);
  const auto* h = reinterpret_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(DU(), hn::LoadU(d16, h + i)))), df,
               y + i);
  }
  for (; i < n; ++i) y[i] = BF16ToF32(U16At(b + 2 * i));
}

// n f16 values widened exactly, as F16ToF32: normal, infinite and NaN values by moving the bits
// and rebiasing the exponent, subnormals as their integer significand times 2^-24.
HWY_INLINE void RowF16(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y, size_t n) {
  const DF df;
  const DU du;
  const DI di;
  const hn::Rebind<uint16_t, DF> d16;
  const size_t N = hn::Lanes(df);
  const auto* h = reinterpret_cast<const uint16_t*>(b);
  const VU rebias = hn::Set(du, 112u << 23);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VU v = hn::PromoteTo(du, hn::LoadU(d16, h + i));
    const VU magnitude = hn::And(v, hn::Set(du, 0x7fffu));
    const auto mi = hn::BitCast(di, magnitude);  // below 2^15: signed comparisons are right
    VU bits = hn::Add(hn::ShiftLeft<13>(magnitude), rebias);
    bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(mi, hn::Set(di, 0x7bff))),
                          hn::Add(bits, rebias), bits);  // exponent 31: f32's 255
    const VF subnormal = hn::Mul(ToF32(magnitude), hn::Set(df, 1.0f / 16777216.0f));
    bits = hn::IfThenElse(hn::RebindMask(du, hn::Lt(mi, hn::Set(di, 0x400))),
                          hn::BitCast(du, subnormal), bits);
    const VU sign = hn::ShiftLeft<16>(hn::And(v, hn::Set(du, 0x8000u)));
    hn::StoreU(hn::BitCast(df, hn::Or(bits, sign)), df, y + i);
  }
  for (; i < n; ++i) y[i] = F16ToF32(U16At(b + 2 * i));
}

// `blocks` blocks of `bytes` bytes at b, each decoded by kBlock into `weights` values.
template <void (*kBlock)(const uint8_t*, float*)>
HWY_INLINE void EachBlock(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y, size_t blocks,
                          size_t bytes, size_t weights) {
  for (size_t k = 0; k < blocks; ++k) kBlock(b + k * bytes, y + k * weights);
}

HWY_INLINE void BlockQ4_0(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  BlockSmall<false, false>(b, 0, 2, y);
}
HWY_INLINE void BlockQ4_1(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  BlockSmall<false, true>(b, 0, 4, y);
}
HWY_INLINE void BlockQ5_0(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  BlockSmall<true, false>(b, 2, 6, y);
}
HWY_INLINE void BlockQ5_1(const uint8_t* HWY_RESTRICT b, float* HWY_RESTRICT y) {
  BlockSmall<true, true>(b, 4, 8, y);
}

}  // namespace ggml_blocks

// out[0, n) from a row of n weights of `dtype` at src: a GGML block format (n a multiple of its
// block's weights), f32, f16 or bf16. The caller checks the arguments.
inline void DequantizeGgmlRowImpl(DType dtype, const std::byte* src, float* out, size_t n) {
  namespace g = ggml_blocks;
  const auto* b = reinterpret_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      if (n != 0) std::memcpy(out, src, n * sizeof(float));
      return;
    case DType::kBF16:
      return g::RowBF16(b, out, n);
    case DType::kF16:
      return g::RowF16(b, out, n);
    default:
      break;
  }
  const size_t weights = static_cast<size_t>(GgmlBlockWeights(dtype));
  const size_t bytes = GgmlBlockBytes(dtype), blocks = n / weights;
  switch (dtype) {
    case DType::kGgmlQ8_0:
      return g::EachBlock<g::BlockQ8_0>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ4_0:
      return g::EachBlock<g::BlockQ4_0>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ4_1:
      return g::EachBlock<g::BlockQ4_1>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ5_0:
      return g::EachBlock<g::BlockQ5_0>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ5_1:
      return g::EachBlock<g::BlockQ5_1>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ4_K:
      return g::EachBlock<g::BlockQ4_KOrQ5_K<false>>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ5_K:
      return g::EachBlock<g::BlockQ4_KOrQ5_K<true>>(b, out, blocks, bytes, weights);
    case DType::kGgmlQ6_K:
      return g::EachBlock<g::BlockQ6_K>(b, out, blocks, bytes, weights);
    default:
      return;
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
