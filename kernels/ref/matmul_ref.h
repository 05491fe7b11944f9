// Scalar twin of kernels/matmul.h: the obviously correct definition (double accumulation).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/matmul.h"

namespace moeserve::kernels::ref {

// w8a8 (DType::kQ8A8) rows are computed as kernels/quantize.h defines them: x quantized per row
// (QuantizeActivationRow), the products summed exactly, then scaled; w4a8 (DType::kQ4A8) and
// int4 (DType::kQ4, x to 15 bits) the same per group, the groups' scaled sums added in
// kernels/quantize.h's order. GGML block formats: with kF32 activations, each row dequantized by
// DequantizeGgmlRowRef and summed in double; with kInt8, kernels/matmul_ggml.h's arithmetic
// spelled out one weight at a time (the bits every target must give).
void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride, GgmlActivations activations = GgmlActivations::kF32);

// w8a8's activation quantization of one row x[0, K) (kernels/quantize.h): writes p[0, K) and
// the row's scale a; returns sum_k p[k].
int32_t QuantizeActivationRow(const float* x, int64_t K, int8_t* p, float* scale);
// The same with p in [-levels, levels] (int4: kQ4Levels).
int32_t QuantizeActivationRow(const float* x, int64_t K, int32_t levels, int32_t* p, float* scale);

}  // namespace moeserve::kernels::ref
