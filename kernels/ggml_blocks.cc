// kernels::DequantizeGgmlRow via Highway dynamic dispatch; the per-target bodies are in
// ggml_blocks-inl.h, the scalar twin in ref/ggml_blocks_ref.cc. Compiled with -ffp-contract=off
// (kernels/CMakeLists.txt) and for Highway's default targets only.

// foreach_target.h re-includes this file once per SIMD target; the kernel bodies live in
// ggml_blocks-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ggml_blocks.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/ggml_blocks-inl.h"

#if HWY_ONCE

#include "core/check.h"
#include "kernels/ggml_blocks.h"

namespace moeserve::kernels {

HWY_EXPORT(DequantizeGgmlRowImpl);

void DequantizeGgmlRow(DType dtype, const std::byte* blocks, float* out, int64_t n) {
  CHECK_GE(n, 0);
  CHECK(IsGgmlBlockDType(dtype) || dtype == DType::kF32 || dtype == DType::kF16 ||
        dtype == DType::kBF16)
      << "DequantizeGgmlRow: " << DTypeName(dtype)
      << " is not a GGML block format, f32, f16 or bf16";
  CHECK_EQ(n % GgmlBlockWeights(dtype), 0) << DTypeName(dtype) << " row of " << n << " weights";
  if (n == 0) return;
  CHECK(blocks != nullptr && out != nullptr);
  HWY_DYNAMIC_DISPATCH(DequantizeGgmlRowImpl)(dtype, blocks, out, static_cast<size_t>(n));
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
