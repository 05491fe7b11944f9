#include "kernels/ref/ggml_blocks_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace moeserve::kernels::ref {
namespace {

// ---- Reading blocks: every field little-endian at its byte offset. ----

float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return F16ToF32(h);
}

uint32_t U32At(const uint8_t* p) {
  uint32_t u;
  std::memcpy(&u, p, sizeof(u));
  return u;
}

// a + b, except that a NaN a is the result even when b is NaN too (ggml_blocks_ref.h).
float AddKeepingFirstNaN(float a, float b) { return std::isnan(a) ? a : a + b; }

// Sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes of Q4_K and Q5_K: sub-blocks
// 0..3 keep theirs in the low 6 bits of bytes j (scale) and j + 4 (min); sub-blocks 4..7 keep the
// low 4 bits in byte j + 4 (scale low nibble, min high nibble) and the top 2 bits in bits 6..7 of
// byte j - 4 (scale) and of byte j (min).
void ScaleAndMin(const uint8_t* packed, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// ---- One block each. Layouts (byte offsets) are those of ggml-common.h. ----

// Q8_0, 34 bytes: f16 d at 0, 32 int8 at 2.
void DequantizeQ8_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

// Q4_0, 18 bytes: f16 d at 0, 16 bytes at 2; byte i holds weight i (low nibble) and i + 16.
void DequantizeQ4_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = static_cast<float>((qs[i] & 15) - 8) * d;
    y[i + 16] = static_cast<float>((qs[i] >> 4) - 8) * d;
  }
}

// Q4_1, 20 bytes: f16 d at 0, f16 m at 2, nibbles at 4 as Q4_0.
void DequantizeQ4_1(const uint8_t* b, float* y) {
  const float d = F16At(b), m = F16At(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = AddKeepingFirstNaN(static_cast<float>(qs[i] & 15) * d, m);
    y[i + 16] = AddKeepingFirstNaN(static_cast<float>(qs[i] >> 4) * d, m);
  }
}

// Q5_0, 22 bytes: f16 d at 0, u32 of fifth bits at 2 (bit i for weight i), nibbles at 6.
void DequantizeQ5_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint32_t high = U32At(b + 2);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | static_cast<int>((high >> i) & 1) << 4;
    const int hi = (qs[i] >> 4) | static_cast<int>((high >> (i + 16)) & 1) << 4;
    y[i] = static_cast<float>(lo - 16) * d;
    y[i + 16] = static_cast<float>(hi - 16) * d;
  }
}

// Q5_1, 24 bytes: f16 d at 0, f16 m at 2, fifth bits at 4, nibbles at 8.
void DequantizeQ5_1(const uint8_t* b, float* y) {
  const float d = F16At(b), m = F16At(b + 2);
  const uint32_t high = U32At(b + 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | static_cast<int>((high >> i) & 1) << 4;
    const int hi = (qs[i] >> 4) | static_cast<int>((high >> (i + 16)) & 1) << 4;
    y[i] = AddKeepingFirstNaN(static_cast<float>(lo) * d, m);
    y[i + 16] = AddKeepingFirstNaN(static_cast<float>(hi) * d, m);
  }
}

// Q4_K, 144 bytes: f16 d at 0, f16 dmin at 2, 12 bytes of scales and mins at 4, 128 bytes of
// nibbles at 16. Sub-block j (weights 32j ..) reads the nibbles of bytes 32 (j / 2) .., low for
// even j, high for odd j.
// Q5_K, 176 bytes: as Q4_K with 32 bytes of fifth bits at 16 (bit j of byte i for weight 32j + i)
// and the nibbles at 48.
void DequantizeQ4_KOrQ5_K(bool five, const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* high = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleAndMin(scales, j, &sc, &m);
    const float step = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
    const uint8_t* nibbles = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int i = 0; i < 32; ++i) {
      int q = (nibbles[i] >> shift) & 15;
      if (five) q |= ((high[i] >> j) & 1) << 4;
      y[32 * j + i] = step * static_cast<float>(q) - offset;
    }
  }
}

// Q6_K, 210 bytes: 128 bytes of low nibbles at 0, 64 bytes of high bit pairs at 128, 16 int8
// scales at 192 (one per 16 weights), f16 d at 208. Weight w = 128 h + 32 t + i (h in 0..1, t in
// 0..3, i in 0..31): low nibble of byte 64 h + 32 (t % 2) + i (low for t < 2, else high), high
// bits 2t, 2t + 1 of byte 128 + 32 h + i.
void DequantizeQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16At(b + 208);
  for (int w = 0; w < 256; ++w) {
    const int h = w / 128, t = (w / 32) % 4, i = w % 32;
    const int low = (ql[64 * h + 32 * (t % 2) + i] >> (4 * (t / 2))) & 15;
    const int top = (qh[32 * h + i] >> (2 * t)) & 3;
    const float step = d * static_cast<float>(scales[w / 16]);
    y[w] = step * static_cast<float>((low | top << 4) - 32);
  }
}

// ---- Quantizing. ----

// v truncated toward zero and clamped to [lo, hi] (NaN: lo). For v in range this is C's
// conversion, which ggml's quantizers use; out of range that would be undefined.
int TruncClamped(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// round(v) (halves away from zero) clamped to [lo, hi] (NaN: 0 if in range, else lo).
int RoundClamped(float v, int lo, int hi) {
  if (std::isnan(v)) return std::clamp(0, lo, hi);
  return TruncClamped(std::round(v), lo, hi);
}

// ceil(v) clamped to [0, hi] (NaN: 0).
int CeilClamped(float v, int hi) { return TruncClamped(std::ceil(v), 0, hi); }

void PutF16(uint8_t* p, float f) {
  const uint16_t h = F32ToF16(f);
  std::memcpy(p, &h, sizeof(h));
}

// The smallest f16 >= f (f >= 0 and finite), widened.
float F16AtLeast(float f) {
  uint16_t h = F32ToF16(f);
  if (F16ToF32(h) < f) ++h;
  return F16ToF32(h);
}

// Q8_0 as quantize_row_q8_0_ref.
void QuantizeQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = amax > std::fabs(x[i]) ? amax : std::fabs(x[i]);
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutF16(b, d);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(RoundClamped(x[i] * id, -128, 127));
}

// Q4_0 (levels 16, bias 8) and Q5_0 (32, 16) as quantize_row_q4_0_ref / q5_0_ref: the weights'
// codes before packing.
float SymmetricCodes(const float* x, int bias, int codes[32]) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  const float d = max / static_cast<float>(-bias);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) {
    codes[i] = TruncClamped(x[i] * id + (static_cast<float>(bias) + 0.5f), 0, 2 * bias - 1);
  }
  return d;
}

// Q4_1 (top code 15) and Q5_1 (31) as quantize_row_q4_1_ref / q5_1_ref; *min the block's min.
float AffineCodes(const float* x, int top, int codes[32], float* min) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int i = 0; i < 32; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  const float d = (hi - lo) / static_cast<float>(top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) codes[i] = TruncClamped((x[i] - lo) * id + 0.5f, 0, top);
  *min = lo;
  return d;
}

// 32 codes of 4 (or 5) bits as Q4_0's nibble bytes at qs (and fifth bits at high).
void PackNibbles(const int codes[32], uint8_t* qs, uint8_t* high) {
  uint32_t bits = 0;
  for (int i = 0; i < 16; ++i) {
    qs[i] = static_cast<uint8_t>((codes[i] & 15) | (codes[i + 16] & 15) << 4);
  }
  for (int i = 0; i < 32; ++i) bits |= static_cast<uint32_t>((codes[i] >> 4) & 1) << i;
  if (high != nullptr) std::memcpy(high, &bits, sizeof(bits));
}

// Q4_K (top code 15) or Q5_K (31), one super-block of 256 (ggml_blocks_ref.h says how).
void QuantizeQ4_KOrQ5_K(bool five, const float* x, uint8_t* b) {
  const float top = five ? 31.0f : 15.0f;
  float neg_min[8], hi[8];
  float largest_neg_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, h = -FLT_MAX;
    for (int i = 0; i < 32; ++i) {
      const float v = x[32 * j + i];
      if (v < lo) lo = v;
      if (v > h) h = v;
    }
    neg_min[j] = -lo;
    hi[j] = std::max(h, lo);  // all NaN: an empty range
    largest_neg_min = std::max(largest_neg_min, neg_min[j]);
  }
  const float dmin = F16AtLeast(largest_neg_min / 63);
  int mins[8], scales[8];
  float offset[8], span[8], largest_span = 0.0f;
  for (int j = 0; j < 8; ++j) {
    mins[j] = dmin > 0.0f ? CeilClamped(neg_min[j] / dmin, 63) : 0;
    offset[j] = dmin * static_cast<float>(mins[j]);
    span[j] = std::max((hi[j] + offset[j]) / top, 0.0f);
    largest_span = std::max(largest_span, span[j]);
  }
  const float d = F16AtLeast(largest_span / 63);
  for (int j = 0; j < 8; ++j) {
    scales[j] = d > 0.0f ? CeilClamped(span[j] / d, 63) : 0;
  }
  PutF16(b, d);
  PutF16(b + 2, dmin);
  // The inverse of ScaleAndMin.
  uint8_t* packed = b + 4;
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(scales[j] | (scales[j + 4] >> 4) << 6);
    packed[j + 4] = static_cast<uint8_t>(mins[j] | (mins[j + 4] >> 4) << 6);
    packed[j + 8] = static_cast<uint8_t>((scales[j + 4] & 15) | (mins[j + 4] & 15) << 4);
  }
  uint8_t* high = b + 16;
  uint8_t* qs = b + (five ? 48 : 16);
  if (five) std::memset(high, 0, 32);
  std::memset(qs, 0, 128);
  for (int j = 0; j < 8; ++j) {
    const float step = d * static_cast<float>(scales[j]);
    for (int i = 0; i < 32; ++i) {
      const int q = step > 0.0f
                        ? RoundClamped((x[32 * j + i] + offset[j]) / step, 0, static_cast<int>(top))
                        : 0;
      qs[32 * (j / 2) + i] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
      if (five) high[i] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
    }
  }
}

// Q6_K, one super-block of 256 (ggml_blocks_ref.h says how).
void QuantizeQ6_K(const float* x, uint8_t* b) {
  float span[16], largest_span = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * j + i]));  // NaN skipped
    span[j] = amax / 31;
    largest_span = std::max(largest_span, span[j]);
  }
  const float d = F16AtLeast(largest_span / 127);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  std::memset(b, 0, 192);
  for (int j = 0; j < 16; ++j) {
    scales[j] = static_cast<int8_t>(d > 0.0f ? CeilClamped(span[j] / d, 127) : 0);
  }
  for (int w = 0; w < 256; ++w) {
    const float step = d * static_cast<float>(scales[w / 16]);
    const int q = (step > 0.0f ? RoundClamped(x[w] / step, -32, 31) : 0) + 32;
    const int h = w / 128, t = (w / 32) % 4, i = w % 32;
    ql[64 * h + 32 * (t % 2) + i] |= static_cast<uint8_t>((q & 15) << (4 * (t / 2)));
    qh[32 * h + i] |= static_cast<uint8_t>((q >> 4) << (2 * t));
  }
  PutF16(b + 208, d);
}

}  // namespace

void DequantizeGgmlRowRef(DType dtype, const std::byte* blocks, float* out, int64_t n) {
  CHECK_GE(n, 0);
  const bool plain = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  CHECK(plain || IsGgmlBlockDType(dtype)) << "DequantizeGgmlRowRef: " << DTypeName(dtype)
                                          << " is not a GGML block format, f32, f16 or bf16";
  const int64_t block = GgmlBlockWeights(dtype);  // 1 for the plain ones
  CHECK_EQ(n % block, 0) << DTypeName(dtype) << " row of " << n << " weights";
  if (n == 0) return;  // a row of nothing may have null pointers (memcpy may not)
  const auto* b = reinterpret_cast<const uint8_t*>(blocks);
  if (plain) {  // as ConvertToF32, from any alignment
    if (dtype == DType::kF32) {
      std::memcpy(out, blocks, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, sizeof(h));
      out[i] = dtype == DType::kF16 ? F16ToF32(h) : BF16ToF32(h);
    }
    return;
  }
  const size_t bytes = GgmlBlockBytes(dtype);
  for (int64_t i = 0; i < n / block; ++i, b += bytes, out += block) {
    switch (dtype) {
      case DType::kGgmlQ8_0:
        DequantizeQ8_0(b, out);
        break;
      case DType::kGgmlQ4_0:
        DequantizeQ4_0(b, out);
        break;
      case DType::kGgmlQ4_1:
        DequantizeQ4_1(b, out);
        break;
      case DType::kGgmlQ5_0:
        DequantizeQ5_0(b, out);
        break;
      case DType::kGgmlQ5_1:
        DequantizeQ5_1(b, out);
        break;
      case DType::kGgmlQ4_K:
        DequantizeQ4_KOrQ5_K(false, b, out);
        break;
      case DType::kGgmlQ5_K:
        DequantizeQ4_KOrQ5_K(true, b, out);
        break;
      case DType::kGgmlQ6_K:
        DequantizeQ6_K(b, out);
        break;
      default:
        __builtin_unreachable();
    }
  }
}

void QuantizeGgmlRowRef(DType dtype, const float* x, std::byte* blocks, int64_t n) {
  CHECK_GE(n, 0);
  const bool plain = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  CHECK(plain || IsGgmlBlockDType(dtype)) << "QuantizeGgmlRowRef: " << DTypeName(dtype)
                                          << " is not a GGML block format, f32, f16 or bf16";
  const int64_t block = GgmlBlockWeights(dtype);  // 1 for the plain ones
  CHECK_EQ(n % block, 0) << DTypeName(dtype) << " row of " << n << " weights";
  if (n == 0) return;  // a row of nothing may have null pointers (memcpy may not)
  if (plain) {
    ConvertFromF32(x, dtype, blocks, static_cast<size_t>(n));
    return;
  }
  const size_t bytes = GgmlBlockBytes(dtype);
  auto* b = reinterpret_cast<uint8_t*>(blocks);
  for (int64_t i = 0; i < n / block; ++i, b += bytes, x += block) {
    int codes[32];
    float min;
    switch (dtype) {
      case DType::kGgmlQ8_0:
        QuantizeQ8_0(x, b);
        break;
      case DType::kGgmlQ4_0:
        PutF16(b, SymmetricCodes(x, 8, codes));
        PackNibbles(codes, b + 2, nullptr);
        break;
      case DType::kGgmlQ5_0:
        PutF16(b, SymmetricCodes(x, 16, codes));
        PackNibbles(codes, b + 6, b + 2);
        break;
      case DType::kGgmlQ4_1:
        PutF16(b, AffineCodes(x, 15, codes, &min));
        PutF16(b + 2, min);
        PackNibbles(codes, b + 4, nullptr);
        break;
      case DType::kGgmlQ5_1:
        PutF16(b, AffineCodes(x, 31, codes, &min));
        PutF16(b + 2, min);
        PackNibbles(codes, b + 8, b + 4);
        break;
      case DType::kGgmlQ4_K:
        QuantizeQ4_KOrQ5_K(false, x, b);
        break;
      case DType::kGgmlQ5_K:
        QuantizeQ4_KOrQ5_K(true, x, b);
        break;
      case DType::kGgmlQ6_K:
        QuantizeQ6_K(x, b);
        break;
      default:
        __builtin_unreachable();
    }
  }
}

}  // namespace moeserve::kernels::ref
