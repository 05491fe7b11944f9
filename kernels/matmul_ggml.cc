// The GGML block-format matmul kernels (kernels/matmul_ggml.h) through Highway dynamic dispatch;
// the per-target bodies are in matmul_ggml-inl.h. Its own translation unit, so that it compiles
// in parallel with matmul.cc; compiled for AVX3_DL too (dispatch tables are per translation unit)
// and with -ffp-contract=off, as ggml_blocks.cc: the kF32 weights must be DequantizeGgmlRow's
// bits, and kInt8's f32 steps the spec's single roundings (kernels/CMakeLists.txt).

// foreach_target.h re-includes this file once per SIMD target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_ggml.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/matmul_ggml-inl.h"

#if HWY_ONCE

#include "core/check.h"
#include "kernels/matmul_ggml.h"

namespace moeserve::kernels {

HWY_EXPORT(MatMulRangeGgmlF32Impl);
HWY_EXPORT(QuantizeGgmlActivationsImpl);
HWY_EXPORT(MatMulRangeGgmlInt8Impl);

int64_t GgmlActivationBlock(DType dtype) {
  CHECK(IsGgmlBlockDType(dtype)) << DTypeName(dtype) << " is not a GGML block format";
  return GgmlBlockWeights(dtype);
}

namespace ggml_matmul {

void MatMulRangeF32(const float* x, size_t x_stride, size_t M, DType dtype, const std::byte* w,
                    size_t K, size_t n_begin, size_t n_end, float* y, size_t y_stride) {
  HWY_DYNAMIC_DISPATCH(MatMulRangeGgmlF32Impl)
  (x, x_stride, M, dtype, w, K, n_begin, n_end, y, y_stride);
}

void QuantizeActivations(const float* x, size_t x_stride, size_t M, size_t K, size_t block,
                         std::byte* out) {
  HWY_DYNAMIC_DISPATCH(QuantizeGgmlActivationsImpl)(x, x_stride, M, K, block, out);
}

void MatMulRangeInt8(const GgmlInt8Rows& xq, size_t M, DType dtype, const std::byte* w, size_t K,
                     size_t n_begin, size_t n_end, float* y, size_t y_stride) {
  CHECK_EQ(xq.block, static_cast<size_t>(GgmlActivationBlock(dtype)))
      << "activations quantized for another format's blocks";
  HWY_DYNAMIC_DISPATCH(MatMulRangeGgmlInt8Impl)(xq, M, dtype, w, K, n_begin, n_end, y, y_stride);
}

}  // namespace ggml_matmul
}  // namespace moeserve::kernels

#endif  // HWY_ONCE
