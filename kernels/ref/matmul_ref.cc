#include "kernels/ref/matmul_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/quantize.h"
#include "kernels/ref/ggml_blocks_ref.h"

namespace moeserve::kernels::ref {

int32_t QuantizeActivationRow(const float* x, int64_t K, int32_t levels, int32_t* p, float* scale) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    finite = finite && std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  if (!finite || amax < kMinQ8A8Scale) {
    std::fill(p, p + K, 0);
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return 0;
  }
  const float top = static_cast<float>(levels);
  const float inv = top / amax;
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    p[k] = static_cast<int32_t>(std::clamp(std::nearbyint(x[k] * inv), -top, top));
    sum += p[k];
  }
  *scale = amax / top;
  return sum;
}

int32_t QuantizeActivationRow(const float* x, int64_t K, int8_t* p, float* scale) {
  std::vector<int32_t> wide(static_cast<size_t>(K));
  const int32_t sum = QuantizeActivationRow(x, K, 127, wide.data(), scale);
  std::copy(wide.begin(), wide.end(), p);
  return sum;
}

namespace {

// w4a8 (levels 127) and int4 (kQ4Levels) as kernels/quantize.h defines them: per group an exact
// integer sum, added into 16 accumulators in group order, then a tree.
void MatMulQ4(const float* x, int64_t x_stride, int64_t M, const Tensor& W, int32_t levels,
              float* y, int64_t y_stride) {
  const int64_t N = W.dim(0), K = W.dim(1), groups = K / kQ4Group;
  CHECK_EQ(K % kQ4A8Block, 0);
  std::vector<int32_t> p(static_cast<size_t>(K));
  const uint8_t* bytes = W.data_as<const uint8_t>();
  const uint16_t* w_scales = PackedGroupScales(W);
  for (int64_t m = 0; m < M; ++m) {
    float x_scale = 0.0f;
    QuantizeActivationRow(x + m * x_stride, K, levels, p.data(), &x_scale);
    for (int64_t n = 0; n < N; ++n) {
      float acc[kQ4A8Lanes] = {};
      const int64_t padded = (groups + kQ4A8Lanes - 1) / kQ4A8Lanes * kQ4A8Lanes;
      for (int64_t g = 0; g < padded; ++g) {
        int64_t sum = 0;
        float scale = 0.0f;
        if (g < groups) {
          scale = F16ToF32(w_scales[n * groups + g]);
          // Group g's 16 bytes: byte j holds weight j (low nibble) and j + 16 (high).
          const uint8_t* group = bytes + (n * K + g * kQ4Group) / 2;
          for (int64_t j = 0; j < kQ4Group; ++j) {
            const int nibble = j < kQ4Group / 2 ? group[j] & 15 : group[j - kQ4Group / 2] >> 4;
            sum += int64_t{p[g * kQ4Group + j]} * (nibble - 8);
          }
        }
        acc[g % kQ4A8Lanes] = std::fma(static_cast<float>(sum), scale, acc[g % kQ4A8Lanes]);
      }
      for (int64_t width = kQ4A8Lanes / 2; width >= 1; width /= 2) {
        for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
      }
      y[m * y_stride + n] = acc[0] * x_scale;
    }
  }
}

// ---- GGML block formats with int8 activations (kernels/matmul_ggml.h).

uint32_t Bits(const uint8_t* block, int64_t byte, int64_t shift, uint32_t mask) {
  return (static_cast<uint32_t>(block[byte]) >> shift) & mask;
}

// Weight k of a block as kernels/matmul_ggml.h's integers: its code times its sub-block's scale
// (the code unsigned, Q8_0's int8), the scale alone and the sub-block's min (K-quants), read from
// the layouts kernels/ggml_blocks.h documents.
struct IntegerWeight {
  int64_t code_term;
  int64_t scale;
  int64_t min;
};
IntegerWeight WeightAt(DType dtype, const uint8_t* b, int64_t k) {
  switch (dtype) {
    case DType::kGgmlQ8_0:
      return {static_cast<int8_t>(b[2 + k]), 1, 0};
    case DType::kGgmlQ4_0:
    case DType::kGgmlQ4_1:
    case DType::kGgmlQ5_0:
    case DType::kGgmlQ5_1: {
      const bool affine = dtype == DType::kGgmlQ4_1 || dtype == DType::kGgmlQ5_1;
      const bool fifth = dtype == DType::kGgmlQ5_0 || dtype == DType::kGgmlQ5_1;
      const int64_t qh = affine ? 4 : 2;        // the u32 of fifth bits (Q5)
      const int64_t qs = qh + (fifth ? 4 : 0);  // 16 bytes of nibbles
      int64_t q = Bits(b, qs + k % 16, k < 16 ? 0 : 4, 15);
      if (fifth) q += 16 * Bits(b, qh + k / 8, k % 8, 1);
      return {q, 1, 0};
    }
    case DType::kGgmlQ4_K:
    case DType::kGgmlQ5_K: {
      const bool five = dtype == DType::kGgmlQ5_K;
      const int64_t j = k / 32, i = k % 32;
      const uint8_t* s = b + 4;
      const int64_t sc = j < 4 ? (s[j] & 63) : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
      const int64_t m = j < 4 ? (s[j + 4] & 63) : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      int64_t q = Bits(b, (five ? 48 : 16) + 32 * (j / 2) + i, 4 * (j % 2), 15);
      if (five) q += 16 * Bits(b, 16 + i, j, 1);
      return {sc * q, sc, m};
    }
    case DType::kGgmlQ6_K: {
      const int64_t h = k / 128, t = (k / 32) % 4, i = k % 32;
      const int64_t low = Bits(b, 64 * h + 32 * (t % 2) + i, 4 * (t / 2), 15);
      const int64_t high = Bits(b, 128 + 32 * h + i, 2 * t, 3);
      const int64_t sc = static_cast<int8_t>(b[192 + k / 16]);
      return {sc * (low + 16 * high), sc, 0};
    }
    default:
      CHECK(false) << DTypeName(dtype);
      __builtin_unreachable();
  }
}

bool HasOffset(DType dtype) {
  return dtype == DType::kGgmlQ4_1 || dtype == DType::kGgmlQ5_1 || dtype == DType::kGgmlQ4_K ||
         dtype == DType::kGgmlQ5_K;
}

// The block's f16 factors: d (s = d a) and the offset's o (t = o a), m or dmin.
void BlockFactors(DType dtype, const uint8_t* b, float* d, float* o) {
  auto half = [&](int64_t at) { return F16ToF32(static_cast<uint16_t>(b[at] | b[at + 1] << 8)); };
  *d = half(dtype == DType::kGgmlQ6_K ? 208 : 0);
  *o = HasOffset(dtype) ? half(2) : 0.0f;
}

void MatMulGgmlInt8(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
                    int64_t y_stride) {
  const DType dtype = W.dtype();
  const int64_t N = W.dim(0), K = W.dim(1), B = GgmlBlockWeights(dtype);
  const size_t row_bytes = StoredRowBytes(dtype, K), block_bytes = GgmlBlockBytes(dtype);
  std::vector<int32_t> p(static_cast<size_t>(K));
  std::vector<float> a(static_cast<size_t>(K / B));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K / B; ++b) {
      QuantizeActivationRow(x + m * x_stride + b * B, B, 127, p.data() + b * B, &a[b]);
    }
    for (int64_t n = 0; n < N; ++n) {
      float acc[8] = {};
      for (int64_t b = 0; b < K / B; ++b) {
        const uint8_t* block = W.data_as<const uint8_t>() + n * row_bytes + b * block_bytes;
        const int32_t* pb = p.data() + b * B;
        // The 8 lanes of kernels/matmul_ggml.h: weight k in lane (k % 32) / 4.
        int64_t I[8] = {}, J[8] = {};
        for (int64_t k = 0; k < B; ++k) {
          const IntegerWeight w = WeightAt(dtype, block, k);
          I[k % 32 / 4] += w.code_term * pb[k];
          switch (dtype) {
            case DType::kGgmlQ4_0: I[k % 32 / 4] -= 8 * pb[k]; break;
            case DType::kGgmlQ5_0: I[k % 32 / 4] -= 16 * pb[k]; break;
            case DType::kGgmlQ4_1:
            case DType::kGgmlQ5_1: J[k % 32 / 4] += pb[k]; break;
            case DType::kGgmlQ4_K:
            case DType::kGgmlQ5_K: J[k / 32] -= w.min * pb[k]; break;
            case DType::kGgmlQ6_K: I[k / 32] -= 32 * w.scale * pb[k]; break;
            default: break;
          }
        }
        float d = 0.0f, o = 0.0f;
        BlockFactors(dtype, block, &d, &o);
        const float s = d * a[b], t = o * a[b];
        for (int l = 0; l < 8; ++l) {
          CHECK(I[l] == static_cast<int32_t>(I[l]) && J[l] == static_cast<int32_t>(J[l]));
          acc[l] = std::fma(static_cast<float>(I[l]), s, acc[l]);
          if (HasOffset(dtype)) acc[l] = std::fma(static_cast<float>(J[l]), t, acc[l]);
        }
      }
      const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5];
      const float t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
      y[m * y_stride + n] = (t0 + t2) + (t1 + t3);
    }
  }
}

}  // namespace

void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride, GgmlActivations activations) {
  CHECK_EQ(W.rank(), size_t{2}) << "ref::MatMul: W must be [N, K], got " << W.ShapeString();
  CHECK(W.dtype() == DType::kBF16 || W.dtype() == DType::kF32 || IsPackedDType(W.dtype()) ||
        IsGgmlBlockDType(W.dtype()))
      << "ref::MatMul: W dtype " << DTypeName(W.dtype())
      << " is unsupported (bf16, f32, int8, int4, w8a8, w4a8 or a GGML block format)";
  CHECK(activations == GgmlActivations::kF32 || IsGgmlBlockDType(W.dtype()))
      << "ref::MatMul: int8 activations are for GGML block formats";
  CHECK(W.contiguous()) << "ref::MatMul: W " << W.ShapeString() << " must be contiguous";
  CHECK_GE(M, 0);
  const int64_t N = W.dim(0);
  const int64_t K = W.dim(1);
  if (M > 0) CHECK_GE(x_stride, K);
  if (M > 1) CHECK_GE(y_stride, N);
  if (IsGgmlBlockDType(W.dtype()) && activations == GgmlActivations::kInt8) {
    MatMulGgmlInt8(x, x_stride, M, W, y, y_stride);
    return;
  }
  if (W.dtype() == DType::kQ8A8) {
    CHECK_LE(K, kMaxQ8A8K);
    const int8_t* q = W.data_as<const int8_t>();
    const float* w_scales = PackedRowScales(W);
    std::vector<int8_t> p(static_cast<size_t>(K));
    for (int64_t m = 0; m < M; ++m) {
      float x_scale = 0.0f;
      QuantizeActivationRow(x + m * x_stride, K, p.data(), &x_scale);
      for (int64_t n = 0; n < N; ++n) {
        int64_t sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += int64_t{p[k]} * q[n * K + k];
        y[m * y_stride + n] = static_cast<float>(sum) * x_scale * w_scales[n];
      }
    }
    return;
  }
  if (IsInt4RowsDType(W.dtype())) {
    MatMulQ4(x, x_stride, M, W, W.dtype() == DType::kQ4 ? kQ4Levels : 127, y, y_stride);
    return;
  }
  const bool bf16 = W.dtype() == DType::kBF16;
  const uint16_t* w16 = W.data_as<const uint16_t>();
  const float* w32 = W.data_as<const float>();
  const bool ggml = IsGgmlBlockDType(W.dtype());
  std::vector<float> row(IsPackedDType(W.dtype()) || ggml ? K : 0);
  for (int64_t n = 0; n < N; ++n) {
    // A packed or GGML row as the weights it stands for (kernels/quantize.h and
    // kernels/ggml_blocks.h define them).
    if (ggml) {
      DequantizeGgmlRowRef(W.dtype(),
                           W.data_as<const std::byte>() + n * StoredRowBytes(W.dtype(), K),
                           row.data(), K);
    } else if (!row.empty()) {
      DequantizeRow(W, n, row.data());
    }
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * x_stride;
      // In order, in double: each product of two floats is exact in double, and the sum keeps
      // 29 more bits than f32, far more accurate than any f32 order the SIMD kernel may use.
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const float w = !row.empty() ? row[k] : bf16 ? BF16ToF32(w16[n * K + k]) : w32[n * K + k];
        sum += static_cast<double>(xm[k]) * static_cast<double>(w);
      }
      y[m * y_stride + n] = static_cast<float>(sum);
    }
  }
}

}  // namespace moeserve::kernels::ref
