#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace moeserve::kernels {
namespace {

// f16's largest finite value: int4 group scales saturate there.
constexpr float kMaxF16 = 65504.0f;

// The largest magnitude of v[0, n), NaN-free (a NaN weight quantizes to 0).
float MaxAbs(const float* v, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(v[i]) > m) m = std::fabs(v[i]);
  }
  return std::isfinite(m) ? m : 0.0f;
}

// round(v / s) in [-limit, limit]; 0 for s == 0 and NaN.
int Quantize(float v, float inv_s, int limit) {
  const float q = std::nearbyint(v * inv_s);
  if (!(q == q)) return 0;
  return static_cast<int>(std::clamp(q, static_cast<float>(-limit), static_cast<float>(limit)));
}

void CheckRow(const Tensor& W, int64_t n) {
  CHECK(IsPackedDType(W.dtype())) << DTypeName(W.dtype()) << " is not a packed weight format";
  CHECK(W.rank() == 2 && W.contiguous());
  CHECK(0 <= n && n < W.dim(0)) << "row " << n << " of " << W.ShapeString();
}

}  // namespace

bool CanPack(DType dtype, int64_t K) {
  switch (dtype) {
    case DType::kQ8:
      return true;
    case DType::kQ8A8:
      return K <= kMaxQ8A8K;
    case DType::kQ4:
    case DType::kQ4A8:
      return K % kQ4A8Block == 0;
    default:
      return false;
  }
}

void QuantizeRow(const float* row, const Tensor& W, int64_t n) {
  CheckRow(W, n);
  const int64_t K = W.dim(1);
  if (IsInt8RowsDType(W.dtype())) {
    int8_t* q = W.data_as<int8_t>() + n * K;
    const float s = MaxAbs(row, K) / 127.0f;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t k = 0; k < K; ++k) q[k] = static_cast<int8_t>(Quantize(row[k], inv, 127));
    MutablePackedRowScales(W)[n] = s;
    return;
  }
  uint16_t* scales = MutablePackedGroupScales(W);
  uint8_t* bytes = W.data_as<uint8_t>() + n * K / 2;
  for (int64_t g = 0; g < K / kQ4Group; ++g) {
    const float* v = row + g * kQ4Group;
    // The scale as stored (f16, saturating at its largest finite value), and the weights
    // quantized against that rounded scale, so that (nibble - 8) * scale is what they round to.
    const uint16_t stored = F32ToF16(std::min(MaxAbs(v, kQ4Group) / 7.0f, kMaxF16));
    const float s = F16ToF32(stored);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    uint8_t* b = bytes + g * kQ4Group / 2;
    for (int64_t j = 0; j < kQ4Group / 2; ++j) {
      const int lo = Quantize(v[j], inv, 7) + 8, hi = Quantize(v[j + kQ4Group / 2], inv, 7) + 8;
      b[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    scales[n * (K / kQ4Group) + g] = stored;
  }
}

void ToQ4A8Layout(int8_t* p, int64_t K, int32_t* group_sums) {
  CHECK(K % kQ4A8Block == 0) << "w4a8 needs K divisible by " << kQ4A8Block << ", got " << K;
  constexpr int64_t kHalf = kQ4Group / 2, kGroups = kQ4A8Block / kQ4Group;
  for (int64_t block = 0; block < K; block += kQ4A8Block) {
    int8_t natural[kQ4A8Block];
    std::copy(p + block, p + block + kQ4A8Block, natural);
    for (int64_t t = 0; t < kGroups; ++t) {
      int32_t sum = 0;
      for (int64_t j = 0; j < kHalf; ++j) {
        p[block + kHalf * t + j] = natural[kQ4Group * t + j];
        p[block + kQ4A8Block / 2 + kHalf * t + j] = natural[kQ4Group * t + kHalf + j];
        sum += natural[kQ4Group * t + j] + natural[kQ4Group * t + kHalf + j];
      }
      group_sums[(block + kQ4Group * t) / kQ4Group] = sum;
    }
  }
}

void DequantizeRow(const Tensor& W, int64_t n, float* row) {
  CheckRow(W, n);
  const int64_t K = W.dim(1);
  if (IsInt8RowsDType(W.dtype())) {
    const int8_t* q = W.data_as<const int8_t>() + n * K;
    const float s = PackedRowScales(W)[n];
    for (int64_t k = 0; k < K; ++k) row[k] = static_cast<float>(q[k]) * s;
    return;
  }
  const uint16_t* scales = PackedGroupScales(W);
  const uint8_t* bytes = W.data_as<const uint8_t>() + n * K / 2;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t b = bytes[k / kQ4Group * kQ4Group / 2 + k % (kQ4Group / 2)];
    const int nibble = k % kQ4Group < kQ4Group / 2 ? (b & 15) : (b >> 4);
    row[k] = static_cast<float>(nibble - 8) * F16ToF32(scales[n * (K / kQ4Group) + k / kQ4Group]);
  }
}

}  // namespace moeserve::kernels
