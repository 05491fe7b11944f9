// moeserve's packed weight formats (--weight-dtype int8 | int4 | w8a8 | w4a8), converted at load
// from bf16 / f32 checkpoints: the quantization of one row and its exact inverse (what the
// matmul kernel computes with). Layout: core/tensor.h (TensorBytes, PackedScales).
//
//   int8 (DType::kQ8): per row (output channel) scale s = max|w| / 127, q = round(w / s) in
//     [-127, 127]; w ~ q * s. The kernel sums q * x and multiplies by s once per output.
//   int4 (DType::kQ4): per group of kQ4Group = 32 weights along K, s = f16(max|w| / 7) (the
//     scale is stored as IEEE f16, rounded to nearest, saturating at 65504), q = round(w / s)
//     in [-7, 7] stored as q + 8 in a nibble; w ~ (nibble - 8) * s. The 32 nibbles of a group
//     fill 16 bytes: byte j holds element j (low nibble) and element j + 16 (high nibble).
//     Each matmul quantizes every row of its activations x to 15 bits (dynamic, symmetric, one
//     scale per row): a = max|x| / kQ4Levels, p = round_half_even(x * (kQ4Levels / max|x|)) in
//     [-kQ4Levels, kQ4Levels], the special rows as for w8a8 -- within 2^-15 of the row's largest
//     value, far below the weights' 4-bit error, so int4 is as accurate as f32 activations (the
//     accuracy test measures it) while its products are integers. Then it is computed exactly as
//     w4a8 below with these p (the group sums i_g stay exact in int32: |i_g| <= 32 * 8 *
//     kQ4Levels), and K must be a multiple of kQ4A8Block. The kernels hold p as two int8
//     planes, p = 128 * high + low with high = p >> 7 in [-128, 127] and low = p & 127, so that
//     the w4a8 kernels' byte products serve both (kernels/matmul_int4-inl.h).
//   w8a8 (DType::kQ8A8): weights as int8. Each matmul also quantizes every row of its
//     activations x (dynamic, symmetric, one scale per row as vLLM's per-token W8A8):
//     a = max|x| / 127, p = round_half_even(x * (127 / max|x|)) in [-127, 127]. A row with
//     max|x| < kMinQ8A8Scale has p = 0 and a = 0; a row holding Inf or NaN has p = 0 and a = NaN,
//     so its outputs are NaN as in float arithmetic.
//     Then y[m, n] = float(sum_k p[m, k] q[n, k]) * a[m] * s[n], the sum exact in int32 (hence
//     K <= kMaxQ8A8K): the same bits on every SIMD target, in any batch and on any thread.
//     kernels/ref/matmul_ref.h: QuantizeActivationRow defines p and a.
//   w4a8 (DType::kQ4A8): weights as int4, activations quantized as for w8a8. Per group g of
//     kQ4Group weights the sum i_g = sum_k p[m, k] (nibble[n, k] - 8) is exact in int32, and
//     every group adds float(i_g) * s[n, g] to one of kQ4A8Lanes = 16 f32 accumulators in a
//     fixed order that every SIMD target follows, so the bits are the same on every target, in
//     any batch and on any thread: acc[g % 16] = fma(float(i_g), s[n, g], acc[g % 16]) for the
//     groups in order (the last run of 16 completed with fma(0, 0, acc)), then the 16 added as
//     a tree (lane i += lane i + 8, then + 4, + 2, + 1) and y[m, n] = acc[0] * a[m]. K must be
//     a multiple of kQ4A8Block (the kernels' unit of 4 groups). kernels/ref/matmul_ref.cc
//     spells it out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace moeserve::kernels {

// int4's activation levels: 15 bits, so that p splits into two int8 planes (kernels/quantize.h).
inline constexpr int32_t kQ4Levels = 16383;
// The widest K for w8a8: 127 * 127 * K must fit in int32 (larger K stays in the checkpoint's
// float dtype).
inline constexpr int64_t kMaxQ8A8K = 131072;
// Activation rows whose largest magnitude is below this quantize to zero (127 / max|x| would
// overflow f32 near 3.7e-37).
inline constexpr float kMinQ8A8Scale = 1e-30f;
// w4a8's K is a multiple of this: a 64-byte vector of nibbles, 4 groups.
inline constexpr int64_t kQ4A8Block = 4 * kQ4Group;
// w4a8's accumulators per output (groups g and g + 16 share one).
inline constexpr int64_t kQ4A8Lanes = 16;

// Activations quantized for w8a8 / w4a8 / int4: M rows, row m's K values p at q + m * stride,
// its scale a at scales[m], and sums the kernels need at sums + m * sums_stride: w8a8 sum_k p
// (one per row, for the AVX-512 VNNI kernel), w4a8 and int4 the sum of each group's p
// (K / kQ4Group per row). w4a8 and int4 rows hold p reordered per block of kQ4A8Block
// (kernels/matmul_int4-inl.h: w4a8 layout); int4 rows hold it as two planes, high at
// q + m * stride and low `low_plane` bytes after it.
struct Int8Rows {
  const int8_t* q;
  size_t stride;
  const float* scales;
  const int32_t* sums;
  size_t sums_stride;
  size_t low_plane = 0;  // int4 only
};

// Whether a [N, K] matrix can be stored as `dtype` (int4 and w4a8 need K % kQ4A8Block == 0).
bool CanPack(DType dtype, int64_t K);

// Writes row n of the packed matrix W ([N, K], any packed dtype) from K f32 values (its scale(s)
// too). Rows may be written in any order, by different threads.
void QuantizeRow(const float* row, const Tensor& W, int64_t n);

// Writes rows [first_row, first_row + rows) of the packed matrix W ([N, K]) from `rows` source
// rows of K values of src_dtype, row r at src + r * src_stride bytes (src_stride at least the
// row's StoredRowBytes): bf16, f16 or f32, the same bytes as ConvertToF32 then QuantizeRow for
// each row (its scalar twin), widened and quantized together in SIMD
// (kernels/quantize_rows-inl.h); or a GGML block format (K a multiple of its block's weights),
// the same bytes as DequantizeGgmlRow (kernels/ggml_blocks.h) then QuantizeRow for each row. The
// load packs with it.
void QuantizeRows(DType src_dtype, const std::byte* src, size_t src_stride, int64_t rows,
                  const Tensor& W, int64_t first_row);

// Reorders a quantized activation row p[0, K) (K a multiple of kQ4A8Block) in place into the
// w4a8 kernels' layout: per block of kQ4A8Block values, the first 16 of each of its 4 groups,
// then the last 16 of each. Writes each group's sum of p to group_sums[0, K / kQ4Group).
void ToQ4A8Layout(int8_t* p, int64_t K, int32_t* group_sums);

// Row n of W as the f32 weights the kernels multiply with (q * s, exactly).
void DequantizeRow(const Tensor& W, int64_t n, float* row);

}  // namespace moeserve::kernels
