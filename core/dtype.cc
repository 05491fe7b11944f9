#include "core/dtype.h"

#include "core/check.h"

namespace moeserve {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
  std::string_view safetensors_name;
  bool compute;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBF16, 2, "bf16", "BF16", true},      {DType::kF16, 2, "f16", "F16", true},
    {DType::kF32, 4, "f32", "F32", true},         {DType::kI8, 1, "i8", "I8", true},
    {DType::kI32, 4, "i32", "I32", true},         {DType::kF64, 8, "f64", "F64", false},
    {DType::kI16, 2, "i16", "I16", false},        {DType::kI64, 8, "i64", "I64", false},
    {DType::kU8, 1, "u8", "U8", false},           {DType::kU16, 2, "u16", "U16", false},
    {DType::kU32, 4, "u32", "U32", false},        {DType::kU64, 8, "u64", "U64", false},
    {DType::kBool, 1, "bool", "BOOL", false},     {DType::kF8E4M3, 1, "f8_e4m3", "F8_E4M3", false},
    {DType::kF8E5M2, 1, "f8_e5m2", "F8_E5M2", false},
    // No safetensors spelling: moeserve's own formats are never read from or written to a file.
    {DType::kQ8, 1, "int8", "", true},            {DType::kQ4, 1, "int4", "", true},
    {DType::kQ8A8, 1, "w8a8", "", true},          {DType::kQ4A8, 1, "w4a8", "", true},
    // GGML's block formats: read from GGUF files only; size is the block's bytes.
    {DType::kGgmlQ8_0, 34, "q8_0", "", false},    {DType::kGgmlQ4_0, 18, "q4_0", "", false},
    {DType::kGgmlQ4_1, 20, "q4_1", "", false},    {DType::kGgmlQ5_0, 22, "q5_0", "", false},
    {DType::kGgmlQ5_1, 24, "q5_1", "", false},    {DType::kGgmlQ4_K, 144, "q4_k", "", false},
    {DType::kGgmlQ5_K, 176, "q5_k", "", false},   {DType::kGgmlQ6_K, 210, "q6_k", "", false},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  CHECK(false) << "unknown DType " << static_cast<int>(dtype);
  __builtin_unreachable();
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

int64_t GgmlBlockWeights(DType dtype) {
  switch (dtype) {
    case DType::kGgmlQ8_0:
    case DType::kGgmlQ4_0:
    case DType::kGgmlQ4_1:
    case DType::kGgmlQ5_0:
    case DType::kGgmlQ5_1: return 32;
    case DType::kGgmlQ4_K:
    case DType::kGgmlQ5_K:
    case DType::kGgmlQ6_K: return 256;
    default: return 1;
  }
}

size_t GgmlBlockBytes(DType dtype) { return Info(dtype).size; }

size_t StoredRowBytes(DType dtype, int64_t n) {
  CHECK(!IsPackedDType(dtype)) << DTypeName(dtype) << " rows are not stored in files";
  const int64_t block = GgmlBlockWeights(dtype);
  CHECK_EQ(n % block, 0) << DTypeName(dtype) << " row of " << n << " weights";
  return static_cast<size_t>(n / block) * Info(dtype).size;
}
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
std::string_view SafetensorsDTypeName(DType dtype) { return Info(dtype).safetensors_name; }
bool IsComputeDType(DType dtype) { return Info(dtype).compute; }

std::optional<DType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (!info.safetensors_name.empty() && info.safetensors_name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> ParseDTypeName(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return F32FromBits(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return F32FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return F32FromBits(sign);  // ±0
  // Subnormal: value = mant * 2^-24. Normalize the mantissa into f32's implicit-one form.
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400u) == 0);
  return F32FromBits(sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13));
}

uint16_t F32ToF16(float f) {
  const uint32_t u = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to ≥ 65520: inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal f16: drop 13 mantissa bits with round-to-nearest-even; a carry bumps the exponent.
    uint32_t r = abs - (112u << 23);  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: ±0
  // Subnormal f16: value = m * 2^-24 with m = round(|f| * 2^24), ties to even.
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand, value = mant*2^(exp-23)
  const int shift = -exp - 1;                            // 14..24: mant >> shift is m's integer part
  const uint32_t whole = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  uint32_t m = whole;
  if (rest > half || (rest == half && (whole & 1u))) ++m;  // may round up into the normal range
  return static_cast<uint16_t>(sign | m);
}

void ConvertToF32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      CHECK(false) << "ConvertToF32: unsupported dtype " << DTypeName(from);
  }
}

void ConvertFromF32(const float* src, DType to, void* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    default:
      CHECK(false) << "ConvertFromF32: unsupported dtype " << DTypeName(to);
  }
}

}  // namespace moeserve
