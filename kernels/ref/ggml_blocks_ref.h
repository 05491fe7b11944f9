// Scalar twins of kernels/ggml_blocks.h: GGML's block formats (GGUF files) decoded to f32 exactly
// as ggml's dequantize_row_* define it, and simple quantizers that write such blocks (for tests
// and for writers of GGUF files).
//
// Dequantization is the definition: each value is computed with ggml's operations in ggml's
// order, its f16 scales widened exactly (core/dtype.h: F16ToF32), without fused multiply-adds
// (this file and kernels/ggml_blocks.cc are compiled with -ffp-contract=off), so the bits equal
// those of ggml's C code evaluated as written:
//
//   Q8_0  d q                      q int8
//   Q4_0  (q - 8) d                q a nibble (the integer q - 8 converted, then times d)
//   Q5_0  (q - 16) d               q 5 bits
//   Q4_1  q d + m                  q a nibble
//   Q5_1  q d + m                  q 5 bits
//   Q4_K  (d sc) q - (dmin m)      q a nibble, sc and m 6 bits per sub-block of 32
//   Q5_K  (d sc) q - (dmin m)      q 5 bits, sc and m as Q4_K
//   Q6_K  (d sc) (q - 32)          q 6 bits, sc int8 per sub-block of 16
//
// One choice IEEE leaves open is fixed here: when both operands of Q4_1's and Q5_1's addition are
// NaN, the result is q d (quieted), the first operand, as x86 returns for ggml's expression as
// written. Every other NaN has one source, so its bits follow from IEEE arithmetic (x86's default
// NaN where a product is inf times 0).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace moeserve::kernels::ref {

// out[0, n) = the n weights of a row stored as `dtype`: a GGML block format (n a multiple of
// GgmlBlockWeights(dtype), n / GgmlBlockWeights consecutive blocks at `blocks`, any alignment),
// or f32, f16 or bf16 (n values, exactly widened).
void DequantizeGgmlRowRef(DType dtype, const std::byte* blocks, float* out, int64_t n);

// Writes the StoredRowBytes(dtype, n) bytes of a row of n weights x[0, n) as `dtype` (the
// formats DequantizeGgmlRowRef reads; f32, f16 and bf16 round to nearest even).
//
//   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: ggml's reference round-to-nearest quantizers
//     (quantize_row_*_ref), the same bytes for finite inputs, with float operations as written.
//     Q8_0: d = max|x| / 127, q = round(x / d) (ties away from 0). Q4_0 / Q5_0: d = -v / 8
//     (-v / 16) for the v of largest magnitude, q = trunc(x / d + 8.5) (16.5), at most 15 (31).
//     Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min, q = trunc((x - min) / d + 0.5). The
//     quotients use 1 / d before d is rounded to f16.
//   Q4_K, Q5_K: per sub-block of 32 the range [min(0, lo), hi] is covered by L = 15 (31) steps:
//     the super-block's dmin is the largest -min(0, lo) / 63 rounded up to an f16, each m =
//     ceil(-min(0, lo) / dmin) (6 bits); then each sub-block's step s = (hi + dmin m) / L, d
//     the largest s / 63 rounded up to an f16, sc = ceil(s / d) (6 bits); q = round((x + dmin
//     m) / (d sc)) in [0, L] with the products the dequantization forms. Every value is within
//     half of its sub-block's step d sc (and a few ulps), the step at most
//     (hi - min(0, lo) + dmin) / L + d.
//   Q6_K: per sub-block of 16, s = max|x| / 31, d the largest s / 127 rounded up to an f16,
//     sc = ceil(s / d) in [0, 127], q = round(x / (d sc)) in [-32, 31]: within half a step
//     d sc, the step at most max|x| / 31 + d.
//
// Non-finite inputs give valid blocks without undefined behaviour, their values unspecified; so do
// inputs whose scales overflow f16 (those beyond about 65504 times the format's levels).
void QuantizeGgmlRowRef(DType dtype, const float* x, std::byte* blocks, int64_t n);

}  // namespace moeserve::kernels::ref
