#include "core/tensor.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moeserve {
namespace {

// Under AddressSanitizer every tensor stays on the heap, where overruns hit its redzones.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapLargeTensors = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMapLargeTensors = false;
#else
constexpr bool kMapLargeTensors = true;
#endif
#else
constexpr bool kMapLargeTensors = true;
#endif

constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64's transparent huge page

std::atomic<size_t> g_storage_bytes{0};
std::atomic<size_t> g_peak_storage_bytes{0};

void CountStorage(size_t bytes) {
  const size_t now = g_storage_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_peak_storage_bytes.load(std::memory_order_relaxed);
  while (now > peak &&
         !g_peak_storage_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

size_t TensorStorageBytes() { return g_storage_bytes.load(std::memory_order_relaxed); }
size_t PeakTensorStorageBytes() { return g_peak_storage_bytes.load(std::memory_order_relaxed); }
void ResetPeakTensorStorageBytes() {
  g_peak_storage_bytes.store(TensorStorageBytes(), std::memory_order_relaxed);
}

TensorStorage::TensorStorage(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (kMapLargeTensors && rounded >= kMappedBytes) {
    // Fresh pages from the kernel read as zero and are zeroed as they are first touched: a KV
    // cache of a few GiB costs nothing at startup (a memset would fault in and zero every page
    // first), and pages a small workload never touches are never backed. The mapping starts on
    // a 2 MiB boundary and asks for transparent huge pages: 512 times fewer page faults while
    // weights load, and far fewer TLB misses while a GEMV streams them.
    const size_t mapped = rounded + kHugePageBytes;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
    madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);  // a hint: may fail
    data_ = std::unique_ptr<std::byte, Free>(reinterpret_cast<std::byte*>(aligned),
                                             Free(mapped, aligned - base, rounded));
    CountStorage(rounded);
    return;
  }
  // calloc, not aligned_alloc + memset: it skips zeroing memory fresh from the kernel (already
  // zero), which otherwise zeroes a quantized expert's down projection twice, on the thread
  // that allocates it. Aligned by hand: calloc gives 16 bytes.
  void* raw = std::calloc(rounded + kTensorAlignment, 1);
  if (raw == nullptr) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kTensorAlignment - 1) & ~uintptr_t{kTensorAlignment - 1};
  data_ = std::unique_ptr<std::byte, Free>(reinterpret_cast<std::byte*>(aligned),
                                           Free(0, aligned - base, rounded));
  CountStorage(rounded);
}

void TensorStorage::Free::operator()(std::byte* p) const {
  g_storage_bytes.fetch_sub(counted, std::memory_order_relaxed);
  if (mapped_bytes > 0) {
    munmap(p - offset, mapped_bytes);
  } else {
    std::free(p - offset);
  }
}

bool CheckedNumel(std::span<const int64_t> shape, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *numel = n;
  return true;
}

Tensor::Tensor(void* data, DType dtype, std::span<const int64_t> shape)
    : data_(data), dtype_(dtype), rank_(shape.size()) {
  CHECK_LE(shape.size(), kMaxTensorRank);
  int64_t stride = 1;
  for (size_t i = rank_; i-- > 0;) {
    CHECK_GE(shape[i], 0);
    shape_[i] = shape[i];
    strides_[i] = stride;
    stride *= shape[i];
  }
  if (IsGgmlBlockDType(dtype)) {
    // Rows of whole blocks along the last dimension (TensorBytes).
    CHECK(rank_ >= 1) << "a " << DTypeName(dtype) << " tensor of rank 0";
    CHECK_EQ(shape_[rank_ - 1] % GgmlBlockWeights(dtype), 0)
        << DTypeName(dtype) << " tensor " << ShapeString() << ": rows of "
        << GgmlBlockWeights(dtype) << "-weight blocks";
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (size_t i = 0; i < rank_; ++i) n *= shape_[i];
  return n;
}

bool Tensor::contiguous() const {
  int64_t stride = 1;
  for (size_t i = rank_; i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

Tensor Tensor::Slice(size_t dim, int64_t begin, int64_t end) const {
  CHECK_LT(dim, rank_);
  CHECK(!IsPackedDType(dtype_)) << "a view of part of a packed " << DTypeName(dtype_) << " matrix";
  CHECK(0 <= begin && begin <= end && end <= shape_[dim])
      << "slice [" << begin << ", " << end << ") of dim " << dim << " of " << ShapeString();
  if (IsGgmlBlockDType(dtype_) && dim + 1 == rank_) {
    const int64_t block = GgmlBlockWeights(dtype_);
    CHECK(begin % block == 0 && end % block == 0)
        << "slice [" << begin << ", " << end << ") of the rows of " << DTypeName(dtype_) << " "
        << ShapeString() << " cuts its blocks of " << block << " weights";
  }
  Tensor t = *this;
  t.data_ = static_cast<std::byte*>(data_) + ElementOffsetBytes(dtype_, begin * strides_[dim]);
  t.shape_[dim] = end - begin;
  return t;
}

Tensor Tensor::Reshape(std::span<const int64_t> shape) const {
  CHECK(contiguous()) << "Reshape of a non-contiguous view " << ShapeString();
  Tensor t(data_, dtype_, shape);
  CHECK_EQ(t.numel(), numel()) << "Reshape " << ShapeString() << " -> " << t.ShapeString();
  return t;
}

std::string Tensor::ShapeString() const { return fmt::format("[{}]", fmt::join(shape(), ", ")); }

namespace {

// Bytes of a packed matrix's rows, before the padding and the scales.
size_t PackedRowBytes(DType dtype, int64_t N, int64_t K) {
  return static_cast<size_t>(IsInt8RowsDType(dtype) ? N * K : N * K / 2);
}

size_t AlignUp(size_t n) { return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

}  // namespace

size_t ElementOffsetBytes(DType dtype, int64_t elements) {
  CHECK(!IsPackedDType(dtype)) << "an element offset into a packed " << DTypeName(dtype)
                               << " matrix";
  if (!IsGgmlBlockDType(dtype)) return static_cast<size_t>(elements) * DTypeSize(dtype);
  const int64_t block = GgmlBlockWeights(dtype);
  CHECK_EQ(elements % block, 0) << "an offset of " << elements << " weights into "
                                << DTypeName(dtype) << " blocks of " << block;
  return static_cast<size_t>(elements / block) * GgmlBlockBytes(dtype);
}

size_t TensorBytes(DType dtype, std::span<const int64_t> shape) {
  int64_t n = 0;
  CHECK(CheckedNumel(shape, &n)) << "bad tensor shape";
  if (IsGgmlBlockDType(dtype)) {
    CHECK(!shape.empty()) << DTypeName(dtype) << " holds rows of blocks: rank 0";
    const int64_t K = shape.back();
    const int64_t block = GgmlBlockWeights(dtype);
    CHECK_EQ(K % block, 0) << DTypeName(dtype) << " rows of " << K
                           << " weights: not a multiple of its block of " << block;
    return K == 0 ? 0 : static_cast<size_t>(n / K) * StoredRowBytes(dtype, K);
  }
  if (!IsPackedDType(dtype)) return static_cast<size_t>(n) * DTypeSize(dtype);
  CHECK_EQ(shape.size(), size_t{2}) << DTypeName(dtype) << " holds [N, K] matrices only";
  const int64_t N = shape[0], K = shape[1];
  CHECK(!IsInt4RowsDType(dtype) || K % kQ4Group == 0)
      << DTypeName(dtype) << " needs K divisible by " << kQ4Group << ", got " << K;
  const size_t rows = AlignUp(PackedRowBytes(dtype, N, K));
  if (IsInt8RowsDType(dtype)) return rows + static_cast<size_t>(N) * sizeof(float);
  return rows + static_cast<size_t>(N * (K / kQ4Group)) * sizeof(uint16_t);
}

const void* PackedScales(const Tensor& W) {
  CHECK(IsPackedDType(W.dtype())) << DTypeName(W.dtype()) << " has no scales";
  CHECK(W.rank() == 2 && W.contiguous());
  return static_cast<const std::byte*>(W.data()) +
         AlignUp(PackedRowBytes(W.dtype(), W.dim(0), W.dim(1)));
}

OwnedTensor::OwnedTensor(DType dtype, std::span<const int64_t> shape) {
  storage_ = TensorStorage(TensorBytes(dtype, shape));
  view_ = Tensor(storage_.data(), dtype, shape);
}

OwnedTensor OwnedTensor::Borrowed(const Tensor& view, std::shared_ptr<const void> owner) {
  CHECK(owner != nullptr);
  CHECK(view.contiguous()) << "a borrowed tensor must be contiguous: " << view.ShapeString();
  OwnedTensor t;
  t.owner_ = std::move(owner);
  t.view_ = view;
  return t;
}

}  // namespace moeserve
