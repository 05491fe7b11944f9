// moeserve's packed weight formats (--weight-dtype int8 | int4 | w8a8), converted at load from bf16 /
// f32 checkpoints: the quantization of one row and its exact inverse (what the matmul kernel
// computes with). Layout: core/tensor.h (TensorBytes, PackedScales).
//
//   int8 (DType::kQ8): per row (output channel) scale s = max|w| / 127, q = round(w / s) in
//     [-127, 127]; w ~ q * s. The kernel sums q * x and multiplies by s once per output.
//   int4 (DType::kQ4): per group of kQ4Group = 32 weights along K, s = max|w| / 7,
//     q = round(w / s) in [-7, 7] stored as q + 8 in a nibble; w ~ (nibble - 8) * s. The 32
//     nibbles of a group fill 16 bytes: byte j holds element j (low nibble) and element j + 16
//     (high nibble), so any vector of 4, 8 or 16 consecutive weights inside a half group is one
//     load of as many bytes and one shift or mask, on every SIMD target.
//   w8a8 (DType::kQ8A8): weights as int8. Each matmul also quantizes every row of its
//     activations x (dynamic, symmetric, one scale per row as vLLM's per-token W8A8):
//     a = max|x| / 127, p = round_half_even(x * (127 / max|x|)) in [-127, 127]. A row with
//     max|x| < kMinQ8A8Scale has p = 0 and a = 0; a row holding Inf or NaN has p = 0 and a = NaN,
//     so its outputs are NaN as in float arithmetic.
//     Then y[m, n] = float(sum_k p[m, k] q[n, k]) * a[m] * s[n], the sum exact in int32 (hence
//     K <= kMaxQ8A8K): the same bits on every SIMD target, in any batch and on any thread.
//     kernels/ref/matmul_ref.h: QuantizeActivationRow defines p and a.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace moeserve::kernels {

// The widest K for w8a8: 127 * 127 * K must fit in int32 (larger K stays in the checkpoint's
// float dtype).
inline constexpr int64_t kMaxQ8A8K = 131072;
// Activation rows whose largest magnitude is below this quantize to zero (127 / max|x| would
// overflow f32 near 3.7e-37).
inline constexpr float kMinQ8A8Scale = 1e-30f;

// Activations quantized for w8a8: M rows, row m's K values p at q + m * stride, its scale a at
// scales[m] and sum_k p at sums[m] (which the AVX-512 VNNI kernel needs, kernels/matmul-inl.h).
struct Int8Rows {
  const int8_t* q;
  size_t stride;
  const float* scales;
  const int32_t* sums;
};

// Whether a [N, K] matrix can be stored as `dtype` (int4 needs K % kQ4Group == 0).
bool CanPack(DType dtype, int64_t K);

// Writes row n of the packed matrix W ([N, K], kQ8 or kQ4) from K f32 values (its scale(s)
// too). Rows may be written in any order, by different threads.
void QuantizeRow(const float* row, const Tensor& W, int64_t n);

// Row n of W as the f32 weights the kernels multiply with (q * s, exactly).
void DequantizeRow(const Tensor& W, int64_t n, float* row);

}  // namespace moeserve::kernels
