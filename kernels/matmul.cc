// Matmul against weights: argument checks, dynamic dispatch to the per-target kernel in
// kernels/matmul-inl.h, and the split of N over a pool's threads.

// foreach_target.h re-includes this file once per SIMD target; the kernel body lives in
// matmul-inl.h so that the test can reach each target's version too.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {

int32_t QuantizeActivationRowImpl(const float* HWY_RESTRICT x, size_t K, int8_t* HWY_RESTRICT q,
                                  float* scale) {
  return matmul_internal::QuantizeActivationRow(x, K, q, scale);
}

}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_ggml.h"
#include "kernels/quantize.h"

namespace moeserve::kernels {

HWY_EXPORT(MatMulRangeImpl);
HWY_EXPORT(MatMulRangeQ8A8Impl);
HWY_EXPORT(MatMulRangeQ4A8Impl);
HWY_EXPORT(MatMulRangeQ4Impl);
HWY_EXPORT(QuantizeActivationsImpl);
HWY_EXPORT(QuantizeActivationsQ4A8Impl);
HWY_EXPORT(QuantizeActivationsQ4Impl);
HWY_EXPORT(QuantizeActivationRowImpl);

namespace {

// Per-thread ranges of n start at multiples of the kernel's largest row tile (kMaxTileRows in
// matmul_common-inl.h), so only the range that ends at N can end in a partial tile. Results do not
// depend on it: the split only decides which thread computes an output.
constexpr int64_t kRowAlign = 8;

// Checks what both entry points need: W is a contiguous [N, K] matrix of a supported dtype, int8
// activations are asked of a GGML block format only, x rows hold at least K floats and y rows at
// least N (so rows never overlap).
void CheckArguments(const float* x, int64_t x_stride, int64_t M, const Tensor& W, const float* y,
                    int64_t y_stride, GgmlActivations activations) {
  CHECK_EQ(W.rank(), size_t{2}) << "MatMul: W must be [N, K], got " << W.ShapeString();
  CHECK(W.dtype() == DType::kBF16 || W.dtype() == DType::kF32 || IsPackedDType(W.dtype()) ||
        IsGgmlBlockDType(W.dtype()))
      << "MatMul: W dtype " << DTypeName(W.dtype())
      << " is unsupported (bf16, f32, int8, int4, w8a8, w4a8 or a GGML block format)";
  CHECK(activations == GgmlActivations::kF32 || IsGgmlBlockDType(W.dtype()))
      << "MatMul: int8 activations are for GGML block formats; W is " << DTypeName(W.dtype())
      << " (w8a8 and w4a8 quantize theirs by dtype)";
  CHECK(W.dtype() != DType::kQ8A8 || W.dim(1) <= kMaxQ8A8K)
      << "MatMul: w8a8 needs K <= " << kMaxQ8A8K << ", got " << W.ShapeString();
  CHECK(!IsInt4RowsDType(W.dtype()) || W.dim(1) % kQ4A8Block == 0)
      << "MatMul: " << DTypeName(W.dtype()) << " needs K divisible by " << kQ4A8Block << ", got "
      << W.ShapeString();
  // (A GGML block-format tensor's K is a multiple of its block: the Tensor checks it.)
  CHECK(W.contiguous()) << "MatMul: W " << W.ShapeString() << " must be contiguous";
  CHECK_GE(M, 0) << "MatMul: M";
  if (M == 0) return;
  const int64_t N = W.dim(0);
  const int64_t K = W.dim(1);
  CHECK_GE(x_stride, K) << "MatMul: x rows are shorter than K of W " << W.ShapeString();
  if (M > 1) CHECK_GE(y_stride, N) << "MatMul: y rows are shorter than N of W " << W.ShapeString();
  CHECK(x != nullptr || K == 0) << "MatMul: null x";
  CHECK(y != nullptr || N == 0) << "MatMul: null y";
}

// True when a matmul quantizes its activations before the kernel: w8a8, w4a8, int4 by dtype, a
// GGML block format when asked.
bool QuantizesX(const Tensor& W, GgmlActivations activations) {
  return QuantizesActivations(W.dtype()) ||
         (IsGgmlBlockDType(W.dtype()) && activations == GgmlActivations::kInt8);
}

// Activations quantized for one W: moeserve's formats' rows, or a GGML block format's.
struct QuantizedX {
  Int8Rows rows;
  GgmlInt8Rows ggml;
};

// w8a8 / w4a8 / int4: activations quantized once per call (not once per thread's range), on the
// calling thread, into its own scratch, which keeps the largest size it has needed (no
// allocation once the largest batch has run). Rows are padded to a multiple of 64 bytes.
struct ActivationScratch {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> sums;
  size_t rows = 0;  // in use
  size_t bytes = 0;
  size_t sum_count = 0;
  std::vector<QuantizedX> jobs;  // MatMulGroup: job j's quantized rows (those jobs only)
};

ActivationScratch& ThreadScratch() {
  thread_local ActivationScratch scratch;
  return scratch;
}

// Bytes of one plane of a quantized row (int4 rows hold two).
size_t PlaneBytes(int64_t K) { return (static_cast<size_t>(K) + 63) / 64 * 64; }
// Bytes of a quantized row: GGML block formats' rows hold their scales and sums too.
size_t RowBytes(DType dtype, int64_t K) {
  if (IsGgmlBlockDType(dtype)) {
    return GgmlInt8Rows::RowBytes(static_cast<size_t>(K),
                                  static_cast<size_t>(GgmlActivationBlock(dtype)));
  }
  return (dtype == DType::kQ4 ? 2 : 1) * PlaneBytes(K);
}

// The sums a quantized row carries: w8a8 one, w4a8 and int4 one per group (GGML: in its row).
size_t SumsPerRow(DType dtype, int64_t K) {
  if (IsGgmlBlockDType(dtype)) return 0;
  return IsInt4RowsDType(dtype) ? static_cast<size_t>(K / kQ4Group) : 1;
}

// Where the next rows go: scratch row (scales), byte (q) and sum.
struct ScratchCursor {
  size_t row = 0, byte = 0, sum = 0;
};

// Makes room for `rows` more rows of up to K values for W's dtype in `s` (call Reserve for every
// x first, then Quantize: the vectors may move while growing).
void Reserve(ActivationScratch& s, int64_t rows, int64_t K, DType dtype) {
  s.rows += static_cast<size_t>(rows);
  s.bytes += static_cast<size_t>(rows) * RowBytes(dtype, K);
  s.sum_count += static_cast<size_t>(rows) * SumsPerRow(dtype, K);
  if (s.q.size() < s.bytes) s.q.resize(s.bytes);
  if (s.scales.size() < s.rows) s.scales.resize(s.rows);
  if (s.sums.size() < s.sum_count) s.sums.resize(s.sum_count);
}

// Quantizes M rows of x for W's dtype into the scratch at `at`, advancing it.
QuantizedX Quantize(const float* x, int64_t x_stride, int64_t M, const Tensor& W,
                    ActivationScratch& s, ScratchCursor& at) {
  const int64_t K = W.dim(1);
  const DType dtype = W.dtype();
  if (IsGgmlBlockDType(dtype)) {
    const size_t block = static_cast<size_t>(GgmlActivationBlock(dtype));
    std::byte* out = reinterpret_cast<std::byte*>(s.q.data() + at.byte);
    ggml_matmul::QuantizeActivations(x, static_cast<size_t>(x_stride), static_cast<size_t>(M),
                                     static_cast<size_t>(K), block, out);
    at.byte += static_cast<size_t>(M) * RowBytes(dtype, K);
    return {Int8Rows{}, GgmlInt8Rows{out, RowBytes(dtype, K), static_cast<size_t>(K), block}};
  }
  const Int8Rows out{s.q.data() + at.byte,     RowBytes(dtype, K),
                     s.scales.data() + at.row, s.sums.data() + at.sum,
                     SumsPerRow(dtype, K),     dtype == DType::kQ4 ? PlaneBytes(K) : 0};
  int8_t* q = s.q.data() + at.byte;
  float* scales = s.scales.data() + at.row;
  int32_t* sums = s.sums.data() + at.sum;
  if (dtype == DType::kQ4) {
    HWY_DYNAMIC_DISPATCH(QuantizeActivationsQ4Impl)
    (x, static_cast<size_t>(x_stride), static_cast<size_t>(M), static_cast<size_t>(K), q,
     out.stride, out.low_plane, scales, sums, out.sums_stride);
  } else if (dtype == DType::kQ4A8) {
    HWY_DYNAMIC_DISPATCH(QuantizeActivationsQ4A8Impl)
    (x, static_cast<size_t>(x_stride), static_cast<size_t>(M), static_cast<size_t>(K), q,
     out.stride, scales, sums, out.sums_stride);
  } else {
    HWY_DYNAMIC_DISPATCH(QuantizeActivationsImpl)
    (x, static_cast<size_t>(x_stride), static_cast<size_t>(M), static_cast<size_t>(K), q,
     out.stride, scales, sums);
  }
  at.row += static_cast<size_t>(M);
  at.byte += static_cast<size_t>(M) * out.stride;
  at.sum += static_cast<size_t>(M) * out.sums_stride;
  return {out, GgmlInt8Rows{}};
}

// y rows [n_begin, n_end) of a w8a8 / w4a8 / int4 / GGML (int8 activations) matrix from
// activations Quantize made for it.
void DispatchQuantized(const QuantizedX& quantized, int64_t M, const Tensor& W, int64_t n_begin,
                       int64_t n_end, float* y, int64_t y_stride) {
  const size_t m = static_cast<size_t>(M), K = static_cast<size_t>(W.dim(1));
  const size_t begin = static_cast<size_t>(n_begin), end = static_cast<size_t>(n_end);
  const Int8Rows& xq = quantized.rows;
  if (IsGgmlBlockDType(W.dtype())) {
    ggml_matmul::MatMulRangeInt8(quantized.ggml, m, W.dtype(), W.data_as<const std::byte>(), K,
                                 begin, end, y, static_cast<size_t>(y_stride));
  } else if (W.dtype() == DType::kQ4) {
    HWY_DYNAMIC_DISPATCH(MatMulRangeQ4Impl)
    (xq, m, W.data_as<const uint8_t>(), PackedGroupScales(W), K, begin, end, y,
     static_cast<size_t>(y_stride));
  } else if (W.dtype() == DType::kQ4A8) {
    HWY_DYNAMIC_DISPATCH(MatMulRangeQ4A8Impl)
    (xq, m, W.data_as<const uint8_t>(), PackedGroupScales(W), K, begin, end, y,
     static_cast<size_t>(y_stride));
  } else {
    HWY_DYNAMIC_DISPATCH(MatMulRangeQ8A8Impl)
    (xq, m, W.data_as<const int8_t>(), PackedRowScales(W), K, begin, end, y,
     static_cast<size_t>(y_stride));
  }
}

// y rows [n_begin, n_end) from f32 activations.
void Dispatch(const float* x, int64_t x_stride, int64_t M, const Tensor& W, int64_t n_begin,
              int64_t n_end, float* y, int64_t y_stride) {
  if (IsGgmlBlockDType(W.dtype())) {
    ggml_matmul::MatMulRangeF32(x, static_cast<size_t>(x_stride), static_cast<size_t>(M),
                                W.dtype(), W.data_as<const std::byte>(),
                                static_cast<size_t>(W.dim(1)), static_cast<size_t>(n_begin),
                                static_cast<size_t>(n_end), y, static_cast<size_t>(y_stride));
    return;
  }
  HWY_DYNAMIC_DISPATCH(MatMulRangeImpl)
  (x, static_cast<size_t>(x_stride), static_cast<size_t>(M), W.data(), W.dtype(),
   IsPackedDType(W.dtype()) ? PackedScales(W) : nullptr, static_cast<size_t>(W.dim(1)),
   static_cast<size_t>(n_begin), static_cast<size_t>(n_end), y, static_cast<size_t>(y_stride));
}

}  // namespace

void MatMulRange(const float* x, int64_t x_stride, int64_t M, const Tensor& W, int64_t n_begin,
                 int64_t n_end, float* y, int64_t y_stride, GgmlActivations activations) {
  CheckArguments(x, x_stride, M, W, y, y_stride, activations);
  CHECK(0 <= n_begin && n_begin <= n_end && n_end <= W.dim(0))
      << "MatMulRange: [" << n_begin << ", " << n_end << ") is outside N of W " << W.ShapeString();
  if (M == 0 || n_begin == n_end) return;
  if (IsGgmlBlockDType(W.dtype()) && activations == GgmlActivations::kInt8) {
    // Quantized here, on this thread (MatMul and MatMulGroup quantize once per call instead).
    ActivationScratch& scratch = ThreadScratch();
    scratch.rows = scratch.bytes = scratch.sum_count = 0;
    Reserve(scratch, M, W.dim(1), W.dtype());
    ScratchCursor at;
    const QuantizedX xq = Quantize(x, x_stride, M, W, scratch, at);
    DispatchQuantized(xq, M, W, n_begin, n_end, y, y_stride);
    return;
  }
  Dispatch(x, x_stride, M, W, n_begin, n_end, y, y_stride);
}

void MatMul(const float* x, int64_t x_stride, int64_t M, const Tensor& W, float* y,
            int64_t y_stride, ThreadPool& pool, GgmlActivations activations) {
  CheckArguments(x, x_stride, M, W, y, y_stride, activations);
  const int64_t N = W.dim(0);
  if (M == 0 || N == 0) return;
  // Task t takes row tiles [t * tiles / tasks, (t + 1) * tiles / tasks): contiguous ranges that
  // differ by at most one tile. Each thread streams its own part of W once.
  const size_t tiles = static_cast<size_t>((N + kRowAlign - 1) / kRowAlign);
  const size_t tasks = std::min(pool.num_threads(), tiles);
  auto tile_begin = [&](size_t t) {
    return std::min<int64_t>(N, static_cast<int64_t>(t * tiles / tasks) * kRowAlign);
  };
  if (QuantizesX(W, activations)) {
    ActivationScratch& scratch = ThreadScratch();
    scratch.rows = scratch.bytes = scratch.sum_count = 0;
    Reserve(scratch, M, W.dim(1), W.dtype());
    ScratchCursor at;
    const QuantizedX xq = Quantize(x, x_stride, M, W, scratch, at);
    pool.ParallelFor(tasks, [&](size_t t, size_t) {
      DispatchQuantized(xq, M, W, tile_begin(t), tile_begin(t + 1), y, y_stride);
    });
    return;
  }
  pool.ParallelFor(tasks, [&](size_t t, size_t) {
    Dispatch(x, x_stride, M, W, tile_begin(t), tile_begin(t + 1), y, y_stride);
  });
}

int32_t QuantizeActivationRowForTest(const float* x, int64_t K, int8_t* q, float* scale) {
  return HWY_DYNAMIC_DISPATCH(QuantizeActivationRowImpl)(x, static_cast<size_t>(K), q, scale);
}

void MatMulGroup(const MatMulJob* jobs, int64_t num_jobs, ThreadPool& pool) {
  // Task (j, t) takes part t of job j's row tiles, split as MatMul splits them.
  const size_t parts = pool.num_threads();
  for (int64_t j = 0; j < num_jobs; ++j) {
    const MatMulJob& job = jobs[j];
    CheckArguments(job.x, job.x_stride, job.M, *job.W, job.y, job.y_stride, job.activations);
  }
  // w8a8 / w4a8 jobs' activations, quantized before the parallel loop; a job whose x and
  // format are the previous such job's (an expert's gate and up) shares its rows.
  ActivationScratch& scratch = ThreadScratch();
  scratch.rows = scratch.bytes = scratch.sum_count = 0;
  auto quantizes = [&](int64_t j) {
    return QuantizesX(*jobs[j].W, jobs[j].activations) && jobs[j].M > 0;
  };
  // GGML formats of the same block size share quantized rows (Q4_K and Q6_K: 256).
  auto same_format = [&](DType a, DType b) {
    return a == b || (IsGgmlBlockDType(a) && IsGgmlBlockDType(b) &&
                      GgmlActivationBlock(a) == GgmlActivationBlock(b));
  };
  auto same_x = [&](int64_t j, int64_t i) {
    return jobs[i].x == jobs[j].x && jobs[i].x_stride == jobs[j].x_stride &&
           jobs[i].M == jobs[j].M && jobs[i].W->dim(1) == jobs[j].W->dim(1) &&
           same_format(jobs[i].W->dtype(), jobs[j].W->dtype());
  };
  int64_t previous = -1;  // the last job with quantized rows
  for (int64_t j = 0; j < num_jobs; ++j) {
    if (!quantizes(j)) continue;
    if (previous < 0 || !same_x(j, previous)) {
      Reserve(scratch, jobs[j].M, jobs[j].W->dim(1), jobs[j].W->dtype());
    }
    previous = j;
  }
  // Only those jobs' entries are used; sized on first use of a larger group, then kept. (Through
  // the reference: the tasks run on the pool's threads, whose own scratch this is not.)
  std::vector<QuantizedX>& quantized = scratch.jobs;
  if (quantized.size() < static_cast<size_t>(num_jobs)) quantized.resize(num_jobs);
  ScratchCursor at;
  previous = -1;
  for (int64_t j = 0; j < num_jobs; ++j) {
    if (!quantizes(j)) continue;
    const MatMulJob& job = jobs[j];
    quantized[j] = previous >= 0 && same_x(j, previous)
                       ? quantized[previous]
                       : Quantize(job.x, job.x_stride, job.M, *job.W, scratch, at);
    previous = j;
  }
  pool.ParallelFor(static_cast<size_t>(num_jobs) * parts, [&](size_t task, size_t) {
    const MatMulJob& job = jobs[task / parts];
    const size_t t = task % parts;
    const int64_t N = job.W->dim(0);
    if (job.M == 0 || N == 0) return;
    const size_t tiles = static_cast<size_t>((N + kRowAlign - 1) / kRowAlign);
    const size_t tasks = std::min(parts, tiles);
    if (t >= tasks) return;
    auto tile_begin = [&](size_t i) {
      return std::min<int64_t>(N, static_cast<int64_t>(i * tiles / tasks) * kRowAlign);
    };
    if (QuantizesX(*job.W, job.activations)) {
      DispatchQuantized(quantized[task / parts], job.M, *job.W, tile_begin(t), tile_begin(t + 1),
                        job.y, job.y_stride);
      return;
    }
    Dispatch(job.x, job.x_stride, job.M, *job.W, tile_begin(t), tile_begin(t + 1), job.y,
             job.y_stride);
  });
}

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
