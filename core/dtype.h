// Element types and exact conversions between them.
//
// The compute types of moeserve are bf16, f16, f32, i8 and i32. The other safetensors dtypes are
// known by name and size so that any well-formed checkpoint can be opened and validated; a layer
// that needs an unsupported one reports it by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t {
  kBF16,
  kF16,
  kF32,
  kI8,
  kI32,
  // Known for validation only.
  kF64,
  kI16,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
  kF8E4M3,
  kF8E5M2,
  // moeserve's packed weight formats (--weight-dtype), never in a checkpoint: a [N, K] matrix
  // whose rows are quantized at load, with their scales stored after the rows
  // (core/tensor.h: TensorBytes, PackedScales; kernels/quantize.h: the arithmetic).
  kQ8,  // "int8": int8 per weight, one f32 scale per row (output channel)
  // "int4": 4 bits per weight in groups of kQ4Group along K, one f16 scale per group; each
  // matmul quantizes its activations to 15 bits, one scale per row (kernels/quantize.h).
  kQ4,
  // "w8a8": stored as kQ8; each matmul also quantizes its activations to int8, one scale per
  // row (token), and sums int8 products in int32 (kernels/quantize.h).
  kQ8A8,
  // "w4a8": stored as kQ4; each matmul also quantizes its activations as w8a8 does and sums
  // int8 products per group in int32, scaling each group's sum (kernels/quantize.h).
  kQ4A8,
  // GGML's block formats (GGUF files, as llama.cpp's ggml-common.h defines them): a row of n
  // weights is n / GgmlBlockWeights blocks of GgmlBlockBytes each, scales inside the blocks.
  // Read from GGUF files, dequantized by kernels/ggml_blocks.h.
  kGgmlQ8_0,  // 32 weights: f16 d, 32 int8 q; w = d q
  kGgmlQ4_0,  // 32 weights: f16 d, 16 bytes of nibbles; w = d (q - 8)
  kGgmlQ4_1,  // 32 weights: f16 d, f16 m, 16 bytes of nibbles; w = d q + m
  kGgmlQ5_0,  // 32 weights: f16 d, 4 bytes of fifth bits, 16 of nibbles; w = d (q - 16)
  kGgmlQ5_1,  // 32 weights: f16 d, f16 m, fifth bits, nibbles; w = d q + m
  kGgmlQ4_K,  // 256 weights: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
  kGgmlQ5_K,  // 256 weights: as Q4_K plus 32 bytes of fifth bits
  kGgmlQ6_K,  // 256 weights: 128 bytes low nibbles, 64 high pairs, 16 int8 scales, f16 d
};

inline constexpr int64_t kQ4Group = 32;

// True for GGML's block formats (kGgmlQ8_0 ... kGgmlQ6_K).
inline bool IsGgmlBlockDType(DType dtype) {
  return dtype >= DType::kGgmlQ8_0 && dtype <= DType::kGgmlQ6_K;
}
// Weights per block of a GGML block format (1 for every other dtype).
int64_t GgmlBlockWeights(DType dtype);
// Bytes per block of a GGML block format (DTypeSize for every other dtype).
size_t GgmlBlockBytes(DType dtype);
// Bytes of a row of n weights of `dtype` as a file stores it: n / GgmlBlockWeights blocks for a
// block format (n must be a multiple), n * DTypeSize otherwise. Not for moeserve's packed formats.
size_t StoredRowBytes(DType dtype, int64_t n);

// True for the packed weight formats (kQ8, kQ8A8, kQ4, kQ4A8): DTypeSize is not their bytes per
// element.
inline bool IsPackedDType(DType dtype) {
  return dtype == DType::kQ8 || dtype == DType::kQ8A8 || dtype == DType::kQ4 ||
         dtype == DType::kQ4A8;
}
// True for the formats stored as int8 rows with one scale per row (kQ8, kQ8A8).
inline bool IsInt8RowsDType(DType dtype) { return dtype == DType::kQ8 || dtype == DType::kQ8A8; }
// True for the formats stored as 4-bit groups with one scale per group (kQ4, kQ4A8).
inline bool IsInt4RowsDType(DType dtype) { return dtype == DType::kQ4 || dtype == DType::kQ4A8; }
// True for the formats whose matmuls quantize their activations (kQ8A8, kQ4A8 to 8 bits, kQ4 to
// 15 bits; kernels/quantize.h).
inline bool QuantizesActivations(DType dtype) {
  return dtype == DType::kQ8A8 || dtype == DType::kQ4A8 || dtype == DType::kQ4;
}

// Bytes per element (packed formats: 1, their container's; TensorBytes gives their storage).
size_t DTypeSize(DType dtype);
// Lower-case name used in messages and flags: "bf16", "f32", ...
std::string_view DTypeName(DType dtype);
// The safetensors header spelling: "BF16", "F32", "F8_E4M3", ...
std::string_view SafetensorsDTypeName(DType dtype);
std::optional<DType> ParseSafetensorsDType(std::string_view name);
// Parses the lower-case names of DTypeName ("bf16", "f32", ...).
std::optional<DType> ParseDTypeName(std::string_view name);
// True for the types kernels compute with (bf16, f16, f32, i8, i32).
bool IsComputeDType(DType dtype);

// ---- bf16: the upper 16 bits of an IEEE f32. ----

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Exact: every bf16 is an f32.
inline float BF16ToF32(uint16_t b) { return F32FromBits(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even. NaN stays NaN (sign and top payload bits kept, quiet bit set so
// that truncating a payload to zero cannot turn it into infinity).
inline uint16_t F32ToBF16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // may carry into the exponent: rounds up to the next binade or to inf
  return static_cast<uint16_t>(u >> 16);
}

// ---- f16: IEEE binary16. ----

// Exact, including subnormals, infinities and NaN payloads.
float F16ToF32(uint16_t h);
// Round to nearest, ties to even, with subnormals and overflow to infinity; NaN stays NaN.
uint16_t F32ToF16(float f);

// Converts n elements of src (dtype `from`) to f32. Supports bf16, f16, f32, i8, i32.
void ConvertToF32(DType from, const void* src, float* dst, size_t n);
// Converts n f32 values to `to` (bf16, f16 or f32).
void ConvertFromF32(const float* src, DType to, void* dst, size_t n);

}  // namespace moeserve
