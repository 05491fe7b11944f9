// moeserve's packed weight formats (--weight-dtype int8 | int4), converted at load from bf16 /
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
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moeserve::kernels {

// Whether a [N, K] matrix can be stored as `dtype` (int4 needs K % kQ4Group == 0).
bool CanPack(DType dtype, int64_t K);

// Writes row n of the packed matrix W ([N, K], kQ8 or kQ4) from K f32 values (its scale(s)
// too). Rows may be written in any order, by different threads.
void QuantizeRow(const float* row, const Tensor& W, int64_t n);

// Row n of W as the f32 weights the kernels multiply with (q * s, exactly).
void DequantizeRow(const Tensor& W, int64_t n, float* row);

}  // namespace moeserve::kernels
