// GGML's block formats (GGUF files; core/dtype.h: kGgmlQ8_0 ... kGgmlQ6_K) decoded to f32.
//
// A row of n weights is n / GgmlBlockWeights(dtype) consecutive blocks of GgmlBlockBytes(dtype)
// bytes (StoredRowBytes(dtype, n) in all), laid out as llama.cpp's ggml-common.h defines them;
// every field little-endian, no alignment (byte offsets within a block):
//
//   Q8_0  34 B / 32 w: f16 d @0, int8 q[32] @2.                               w = q d
//   Q4_0  18 B / 32 w: f16 d @0, qs[16] @2: byte i = w[i] low nibble, w[i+16] high.
//                                                                               w = (q - 8) d
//   Q4_1  20 B / 32 w: f16 d @0, f16 m @2, qs[16] @4 (as Q4_0).                 w = q d + m
//   Q5_0  22 B / 32 w: f16 d @0, u32 qh @2 (bit i = 5th bit of w[i]), qs[16] @6. w = (q - 16) d
//   Q5_1  24 B / 32 w: f16 d @0, f16 m @2, u32 qh @4, qs[16] @8.                w = q d + m
//   Q4_K 144 B / 256 w: f16 d @0, f16 dmin @2, scales[12] @4 (8 sub-blocks' 6-bit sc and m),
//        qs[128] @16: sub-block j (w[32j ..]) = nibbles of qs[32 (j/2) + i], low if j even.
//                                                                    w = (d sc_j) q - (dmin m_j)
//   Q5_K 176 B / 256 w: as Q4_K with qh[32] @16 (bit j of qh[i] = 5th bit of w[32j + i]) and
//        qs[128] @48.
//   Q6_K 210 B / 256 w: ql[128] @0, qh[64] @128, int8 sc[16] @192, f16 d @208: w[128h + 32t + i]
//        (h < 2, t < 4, i < 32) has low nibble of ql[64h + 32 (t%2) + i] (low half if t < 2)
//        and bits 2t, 2t+1 of qh[32h + i] as bits 4, 5.                  w = (d sc[w/16]) (q - 32)
//
//   Q4_K/Q5_K scales: sub-block j < 4 has sc = scales[j] & 63, m = scales[j+4] & 63; j >= 4 has
//   sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4, m = (scales[j+4] >> 4) | (scales[j] >> 6)
//   << 4.
//
// The results are the bits of ggml's dequantize_row_* (the scalar twin,
// kernels/ref/ggml_blocks_ref.h, spells out the order of operations and the one NaN choice), on
// every SIMD target; kernels/testdata/ggml_dequant_reference.py is an independent numpy
// definition the tests compare with.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace moeserve::kernels {

// out[0, n) = the n weights of a row stored as `dtype` at `blocks` (any alignment): a GGML block
// format (n a multiple of GgmlBlockWeights(dtype); reads StoredRowBytes(dtype, n) bytes), or
// f32, f16 or bf16 (n values, widened exactly), so that a loader has one entry point for every
// dtype a GGUF tensor may hold here. Bit-identical to ref::DequantizeGgmlRowRef on every target.
void DequantizeGgmlRow(DType dtype, const std::byte* blocks, float* out, int64_t n);

}  // namespace moeserve::kernels
