// Matmul against GGML block-format weights (core/dtype.h: kGgmlQ8_0 ... kGgmlQ6_K; the rows of a
// GGUF file, read in place, block layouts in kernels/ggml_blocks.h): the arithmetic of both
// activation modes (kernels/matmul.h: GgmlActivations), and the entry points kernels/matmul.cc
// dispatches to. Callers use kernels/matmul.h; this header is the kernels' own.
//
// kF32. y[m, n] = sum_k x[m, k] w[n, k], with w[n, k] exactly the f32 DequantizeGgmlRow gives,
//   summed as the float kernels sum (matmul_float-inl.h): per output one accumulator of L =
//   Lanes(CappedTag<float, 16>) lanes, acc = MulAdd(w[k0 .. k0 + L), x[k0 .. k0 + L), acc) for
//   k0 = 0, L, 2L, ... (blocks are multiples of 16 weights, so there is no tail), then the sum
//   of acc's lanes. The bits depend on K, the data and the SIMD target only.
//
// kInt8. Each x row is cut into activation blocks of B = GgmlActivationBlock(dtype) values (32,
//   or 256 for the K-quants: llama.cpp's Q8_0 and Q8_K), each quantized as w8a8 quantizes a row
//   (kernels/quantize.h): a = max|x| / 127, p = round_half_even(x * (127 / max|x|)) in
//   [-127, 127]; a block with max|x| < kMinQ8A8Scale has p = 0, a = 0; one holding Inf or NaN
//   has p = 0, a = NaN. A weight block (q its codes: unsigned, but Q8_0's int8; f16 fields
//   widened exactly) meets activation block b in 8 exact int32 lane sums I[l] and, for the
//   formats with an offset, J[l]; weight k of a block goes to lane (k % 32) / 4 (as the SIMD
//   dot products leave it: bytes 4l .. 4l + 3 of every 32):
//     Q8_0        I[l] = sum q p                                            s = d a
//     Q4_0, Q5_0  I[l] = sum (q - 8) p  (Q5_0: q - 16)                      s = d a
//     Q4_1, Q5_1  I[l] = sum q p,  J[l] = sum p (same lanes)                s = d a, t = m a
//     Q4_K, Q5_K  I[l] = sum sc_j q p (j the weight's sub-block of 32),     s = d a, t = dmin a
//                 J[j] = -m_j (sum of p over sub-block j), j = 0 .. 7
//     Q6_K        I[l] = sum sc_s q p (s the weight's sub-block of 16, sc int8, q in 0 .. 63),
//                 then I[s / 2] -= 32 sc_s (sum of p over sub-block s)      s = d a
//   and every output keeps 8 f32 accumulators, for each block in order
//     acc[l] = fma(float(I[l]), s, acc[l]);  then, with J, acc[l] = fma(float(J[l]), t, acc[l])
//   (s and t one rounded f32 product each), and y = (acc[l] + acc[l + 4] for l < 4, then l + 2,
//   then l + 1)[0]. Every value above is an exact integer or one IEEE operation in a fixed order,
//   so every SIMD target gives the scalar twin's bits (kernels/ref/matmul_ref.h), in any batch
//   and on any thread. No sum overflows int32 (the largest, Q6_K's lanes, stay below 2^25).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace moeserve::kernels {

// Values per activation block in kInt8 mode for W of `dtype` (a GGML block format): its
// scale block, 256 for Q4_K, Q5_K and Q6_K, 32 otherwise.
int64_t GgmlActivationBlock(DType dtype);

// x quantized for kInt8: M rows, row m at data + m * stride (a multiple of 64 bytes), laid out as
// p[K] int8 at 0, then from ScalesOffset(K) the K / block f32 scales a, then the int16 sums of p
// over each run of 16 (K / 16) and of 4 (K / 4): the offsets' terms (J and the codes' offsets).
struct GgmlInt8Rows {
  const std::byte* data;
  size_t stride;
  size_t K;
  size_t block;

  static size_t ScalesOffset(size_t K) { return (K + 63) / 64 * 64; }
  static size_t RowBytes(size_t K, size_t block) {
    return (ScalesOffset(K) + K / block * sizeof(float) + (K / 16 + K / 4) * sizeof(int16_t) +
            63) / 64 * 64;
  }
  const int8_t* p(size_t m) const { return reinterpret_cast<const int8_t*>(data + m * stride); }
  const float* scales(size_t m) const {
    return reinterpret_cast<const float*>(data + m * stride + ScalesOffset(K));
  }
  const int16_t* sums16(size_t m) const {
    return reinterpret_cast<const int16_t*>(data + m * stride + ScalesOffset(K) +
                                            K / block * sizeof(float));
  }
  const int16_t* sums4(size_t m) const { return sums16(m) + K / 16; }
};

namespace ggml_matmul {

// The dispatched target's kernels (kernels/matmul_ggml.cc); kernels/matmul.cc has checked the
// arguments: w is [N, K] of `dtype`, row n at w + n * StoredRowBytes(dtype, K).

// kF32: y[m, n] for m < M, n in [n_begin, n_end).
void MatMulRangeF32(const float* x, size_t x_stride, size_t M, DType dtype, const std::byte* w,
                    size_t K, size_t n_begin, size_t n_end, float* y, size_t y_stride);

// kInt8: M rows of x quantized into `out` (RowBytes(K, block) each, 64-byte aligned).
void QuantizeActivations(const float* x, size_t x_stride, size_t M, size_t K, size_t block,
                         std::byte* out);

// kInt8: y[m, n] from activations QuantizeActivations made for this dtype's block.
void MatMulRangeInt8(const GgmlInt8Rows& xq, size_t M, DType dtype, const std::byte* w, size_t K,
                     size_t n_begin, size_t n_end, float* y, size_t y_stride);

}  // namespace ggml_matmul
}  // namespace moeserve::kernels
