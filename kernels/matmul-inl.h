// Per-target body of the matmul kernel (kernels/matmul.h), for inclusion from foreach_target
// translation units: kernels/matmul.cc dispatches to it, and kernels/matmul_test.cc calls it on
// every compiled target. MatMulRangeImpl below takes every weight format; the kernels live in one
// file per format, with what they share in matmul_common-inl.h:
//   matmul_float-inl.h  f32 activations against f32 / bf16 rows (and int8 / int4 ones widened)
//   matmul_int8-inl.h   int8 weights: weight-only rows, and w8a8 (MatMulRangeQ8A8Impl)
//   matmul_int4-inl.h   int4 weights: weight-only rows, and w4a8 (MatMulRangeQ4A8Impl)
//
// No #pragma once: foreach_target.h includes this once per target, and the guard below toggles
// with HWY_TARGET_TOGGLE so that each pass compiles it again inside that target's namespace.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "hwy/highway.h"
#include "kernels/matmul_common-inl.h"
#include "kernels/matmul_float-inl.h"
#include "kernels/matmul_int4-inl.h"
#include "kernels/matmul_int8-inl.h"
#include "kernels/quantize.h"

#if defined(MOESERVE_KERNELS_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOESERVE_KERNELS_MATMUL_INL_H_
#undef MOESERVE_KERNELS_MATMUL_INL_H_
#else
#define MOESERVE_KERNELS_MATMUL_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
// AVX-512 VNNI on AVX3_DL, as in every matmul file (matmul_common-inl.h).
#if HWY_TARGET == HWY_AVX3_DL
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#endif
namespace moeserve::kernels::HWY_NAMESPACE {

// y[m, n] = sum_k x[m, k] * W[n, k] for m < M and n in [n_begin, n_end), on this target. w is
// row-major [N, K] of w_dtype (kBF16, kF32, or packed kQ8 / kQ4 / kQ8A8 / kQ4A8 with their
// `scales`, core/tensor.h); x row m at x + m * x_stride, y row m at y + m * y_stride. The
// caller has validated the arguments (kernels/matmul.cc). kQ8A8, kQ4A8 and kQ4 quantize x here,
// per call; MatMul and MatMulGroup quantize once per call instead and call MatMulRangeQ8A8Impl,
// MatMulRangeQ4A8Impl or MatMulRangeQ4Impl.
//
// Inline (not static) so that the copy in each including translation unit is the same entity;
// HWY_EXPORT takes its address, which forces an out-of-line definition per target.
inline void MatMulRangeImpl(const float* HWY_RESTRICT x, size_t x_stride, size_t M,
                            const void* HWY_RESTRICT w, DType w_dtype, const void* scales, size_t K,
                            size_t n_begin, size_t n_end, float* HWY_RESTRICT y, size_t y_stride) {
  namespace mi = matmul_internal;
  switch (w_dtype) {
    case DType::kBF16:
      mi::MatMulRangeT(x, x_stride, M,
                       mi::FloatRows<hwy::bfloat16_t>{static_cast<const hwy::bfloat16_t*>(w), K},
                       n_begin, n_end, y, y_stride);
      return;
    case DType::kQ8:
      mi::MatMulRangeT(
          x, x_stride, M,
          mi::Q8Rows{static_cast<const int8_t*>(w), static_cast<const float*>(scales), K}, n_begin,
          n_end, y, y_stride);
      return;
    case DType::kQ8A8:
    case DType::kQ4A8:
    case DType::kQ4: {
      // Quantizes x here, on this thread (kernels/matmul.cc quantizes once per call instead).
      const size_t groups = K / static_cast<size_t>(kQ4Group);
      thread_local std::vector<int8_t> q;
      thread_local std::vector<float> x_scales;
      thread_local std::vector<int32_t> x_sums;
      q.resize(2 * M * K);  // int4: two planes per row
      x_scales.resize(M);
      if (w_dtype == DType::kQ8A8) {
        x_sums.resize(M);
        QuantizeActivationsImpl(x, x_stride, M, K, q.data(), K, x_scales.data(), x_sums.data());
        MatMulRangeQ8A8Impl(Int8Rows{q.data(), K, x_scales.data(), x_sums.data(), 1}, M,
                            static_cast<const int8_t*>(w), static_cast<const float*>(scales), K,
                            n_begin, n_end, y, y_stride);
      } else if (w_dtype == DType::kQ4A8) {
        x_sums.resize(M * groups);
        QuantizeActivationsQ4A8Impl(x, x_stride, M, K, q.data(), K, x_scales.data(), x_sums.data(),
                                    groups);
        MatMulRangeQ4A8Impl(Int8Rows{q.data(), K, x_scales.data(), x_sums.data(), groups}, M,
                            static_cast<const uint8_t*>(w), static_cast<const uint16_t*>(scales), K,
                            n_begin, n_end, y, y_stride);
      } else {
        x_sums.resize(M * groups);
        QuantizeActivationsQ4Impl(x, x_stride, M, K, q.data(), 2 * K, K, x_scales.data(),
                                  x_sums.data(), groups);
        MatMulRangeQ4Impl(Int8Rows{q.data(), 2 * K, x_scales.data(), x_sums.data(), groups, K}, M,
                          static_cast<const uint8_t*>(w), static_cast<const uint16_t*>(scales), K,
                          n_begin, n_end, y, y_stride);
      }
      return;
    }
    default:
      mi::MatMulRangeT(x, x_stride, M, mi::FloatRows<float>{static_cast<const float*>(w), K},
                       n_begin, n_end, y, y_stride);
      return;
  }
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
#if HWY_TARGET == HWY_AVX3_DL
HWY_POP_ATTRIBUTES
#endif
HWY_AFTER_NAMESPACE();

#endif  // MOESERVE_KERNELS_MATMUL_INL_H_
