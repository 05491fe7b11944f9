#include "kernels/ref/matmul_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/quantize.h"

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

}  // namespace

void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride) {
  CHECK_EQ(W.rank(), size_t{2}) << "ref::MatMul: W must be [N, K], got " << W.ShapeString();
  CHECK(W.dtype() == DType::kBF16 || W.dtype() == DType::kF32 || IsPackedDType(W.dtype()))
      << "ref::MatMul: W dtype " << DTypeName(W.dtype())
      << " is unsupported (bf16, f32, int8, int4, w8a8 or w4a8)";
  CHECK(W.contiguous()) << "ref::MatMul: W " << W.ShapeString() << " must be contiguous";
  CHECK_GE(M, 0);
  const int64_t N = W.dim(0);
  const int64_t K = W.dim(1);
  if (M > 0) CHECK_GE(x_stride, K);
  if (M > 1) CHECK_GE(y_stride, N);
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
  std::vector<float> row(IsPackedDType(W.dtype()) ? K : 0);
  for (int64_t n = 0; n < N; ++n) {
    // A packed row as the weights it stands for (kernels/quantize.h defines them).
    if (!row.empty()) DequantizeRow(W, n, row.data());
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
