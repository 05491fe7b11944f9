// kernels::QuantizeRows (kernels/quantize.h) via Highway dynamic dispatch; the per-target bodies
// are in quantize_rows-inl.h, the scalar twin is QuantizeRow (kernels/quantize.cc).

// foreach_target.h re-includes this file once per SIMD target; the kernel bodies live in
// quantize_rows-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantize_rows.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/quantize_rows-inl.h"

#if HWY_ONCE

#include <vector>

#include "core/check.h"
#include "kernels/ggml_blocks.h"
#include "kernels/quantize.h"

namespace moeserve::kernels {

HWY_EXPORT(QuantizeRowsImpl);

void QuantizeRows(DType src_dtype, const std::byte* src, size_t src_stride, int64_t rows,
                  const Tensor& W, int64_t first_row) {
  CHECK(IsPackedDType(W.dtype())) << DTypeName(W.dtype()) << " is not a packed weight format";
  CHECK(W.rank() == 2 && W.contiguous());
  CHECK(src_dtype == DType::kBF16 || src_dtype == DType::kF16 || src_dtype == DType::kF32 ||
        IsGgmlBlockDType(src_dtype))
      << "QuantizeRows packs bf16, f16, f32 or GGML block rows, not " << DTypeName(src_dtype);
  CHECK(rows >= 0 && first_row >= 0 && first_row <= W.dim(0) && rows <= W.dim(0) - first_row)
      << rows << " rows from row " << first_row << " of " << W.ShapeString();
  const int64_t K = W.dim(1);
  const size_t row_bytes = StoredRowBytes(src_dtype, K);  // checks K for a block format
  CHECK(src_stride >= row_bytes) << "source rows of " << row_bytes << " bytes " << src_stride
                                 << " bytes apart overlap";
  if (rows == 0) return;
  CHECK(src != nullptr);
  // Row r's bytes and scale(s) (core/tensor.h: TensorBytes, PackedScales).
  const bool int4 = IsInt4RowsDType(W.dtype());
  const size_t packed_row = static_cast<size_t>(int4 ? K / 2 : K);
  auto packed = [&](int64_t r) { return W.data_as<std::byte>() + r * packed_row; };
  auto scales = [&](int64_t r) {
    return int4 ? static_cast<void*>(MutablePackedGroupScales(W) + r * (K / kQ4Group))
                : static_cast<void*>(MutablePackedRowScales(W) + r);
  };
  const auto quantize = HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl);
  if (src_dtype == DType::kBF16 || src_dtype == DType::kF32) {
    quantize(src_dtype == DType::kBF16, src, src_stride, static_cast<size_t>(rows),
             static_cast<size_t>(K), int4, packed(first_row), scales(first_row));
    return;
  }
  // f16 and GGML block rows: widened (dequantized) a row at a time, then packed as f32.
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeGgmlRow(src_dtype, src + r * src_stride, row.data(), K);
    quantize(false, reinterpret_cast<const std::byte*>(row.data()), K * sizeof(float), 1,
             static_cast<size_t>(K), int4, packed(first_row + r), scales(first_row + r));
  }
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
