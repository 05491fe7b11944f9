// Matrix multiplication against weights: y[m, n] = sum_k x[m, k] * W[n, k].
//
// x and y are f32; W is row-major [N, K] in bf16 or f32 (nn.Linear's [out, in] layout), or in a
// packed int8 / int4 format (kernels/quantize.h), converted to f32 on the fly. w8a8 weights are
// int8 rows too, but the activations are quantized to int8 per row (once per call, on the
// calling thread) and the products summed exactly in int32; w4a8 does the same against int4
// rows, exactly per group of 32, the groups' scaled sums added in one order every target
// follows (kernels/quantize.h). Every weight row is streamed from memory once for all M rows of
// x (decode and prefill are memory-bound on W). Each output's K-reduction runs in a fixed order
// that depends only on K and the SIMD target (w8a8, w4a8: on K only) — never on M, on n, or on
// how rows are split across threads — so a row's result is bit-identical whether it is computed
// alone or in a batch (docs/design.md principle 2).
//
// W may also be a GGML block format (core/dtype.h: kGgmlQ8_0 ... kGgmlQ6_K, the rows of a GGUF
// file, read in place; kernels/matmul_ggml.h), with the activations the caller picks per call
// (GgmlActivations): f32, against weights dequantized exactly in registers, or int8 per block as
// llama.cpp's Q8_0 / Q8_K, with exact integer block sums.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace moeserve::kernels {

// How a matmul against a GGML block-format W treats its activations (kernels/matmul_ggml.h has
// the exact arithmetic). Any other W takes kF32 only (its own dtype says whether it quantizes).
enum class GgmlActivations : uint8_t {
  // f32 x against each weight exactly as DequantizeGgmlRow gives it, summed in f32 FMAs in the
  // float kernels' order: the bits depend on K, the data and the SIMD target.
  kF32,
  // x quantized to int8 once per call, per block of 32 weights (W of 32-weight blocks) or 256
  // (Q4_K, Q5_K, Q6_K), one f32 scale a block, as llama.cpp's Q8_0 / Q8_K activations; each
  // block's products summed exactly in int32 and the blocks' scaled sums added in one fixed
  // order: the same bits on every SIMD target (ref::MatMul's), in any batch, on any thread.
  kInt8,
};

// Computes outputs n in [n_begin, n_end) on the calling thread.
// x: M rows of K floats, row i at x + i * x_stride. y: M rows, row i at y + i * y_stride; only
// columns [n_begin, n_end) are written. W: [N, K], contiguous: bf16, f32, a packed format
// (int8, int4, w8a8, w4a8) or a GGML block format (with `activations`).
void MatMulRange(const float* x, int64_t x_stride, int64_t M, const Tensor& W, int64_t n_begin,
                 int64_t n_end, float* y, int64_t y_stride,
                 GgmlActivations activations = GgmlActivations::kF32);

// All N outputs, split over the pool's threads by ranges of n (one join). kInt8 activations
// are quantized once, on the calling thread, before the split.
void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride, ThreadPool& pool,
            GgmlActivations activations = GgmlActivations::kF32);

// One of several independent products run together by MatMulGroup: y = x W^T for M rows.
struct MatMulJob {
  const float* x;
  int64_t x_stride;
  int64_t M;
  const Tensor* W;
  float* y;
  int64_t y_stride;
  GgmlActivations activations = GgmlActivations::kF32;  // for a GGML block-format W
};

// Runs every job with one join for all of them (rather than one per product): each job's N is
// split into per-thread ranges as in MatMul, and all ranges of all jobs are spread over the
// pool. Used for a step's routed experts, many small products whose joins would otherwise
// dominate. Each output is bit-identical to what MatMul computes for it.
void MatMulGroup(const MatMulJob* jobs, int64_t num_jobs, ThreadPool& pool);

// For tests: w8a8's quantization of one activation row of K floats to int8 on the dispatched
// target (the twin of ref::QuantizeActivationRow); writes q[K] and the scale, returns sum(q).
int32_t QuantizeActivationRowForTest(const float* x, int64_t K, int8_t* q, float* scale);

}  // namespace moeserve::kernels
