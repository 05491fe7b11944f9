// Tensor: a non-owning, strided view of typed memory. TensorStorage: 64-byte-aligned owned bytes.
//
// Shapes and strides are in elements, outermost dimension first (row-major when contiguous):
// a [rows, cols] matrix has strides {cols, 1}.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"

namespace moeserve {

inline constexpr size_t kMaxTensorRank = 6;
inline constexpr size_t kTensorAlignment = 64;  // a cache line; what Highway's loads like best

// Bytes a contiguous tensor of `shape` occupies. Packed weight formats (IsPackedDType) are
// [N, K] matrices laid out as their rows (N * K int8, or N * K / 2 bytes of 4-bit pairs), padded
// to kTensorAlignment, then their scales (N f32, or N * K / kQ4Group f16); kQ4 / kQ4A8 need
// K % kQ4Group == 0. GGML block formats (IsGgmlBlockDType) are rows along the last dimension,
// each StoredRowBytes(dtype, K) bytes of blocks with their scales inside, so a tensor of shape
// [..., N, K] is numel / K such rows (K a multiple of GgmlBlockWeights(dtype)): exactly the
// bytes a GGUF file stores, which a Tensor can view in place.
size_t TensorBytes(DType dtype, std::span<const int64_t> shape);

// Bytes from a tensor's first element to the one `elements` elements on in row-major order:
// elements * DTypeSize for plain dtypes; for a GGML block format, whole blocks only (`elements`
// a multiple of GgmlBlockWeights(dtype), else a CHECK fails).
size_t ElementOffsetBytes(DType dtype, int64_t elements);

// Bytes held by all live TensorStorage (each its size rounded up to kTensorAlignment), and the
// most they held at once since the last ResetPeakTensorStorageBytes() (or the start): weights,
// caches and scratch, counted on every thread, so a test can bound what a load holds.
size_t TensorStorageBytes();
size_t PeakTensorStorageBytes();
void ResetPeakTensorStorageBytes();

// Owned, 64-byte-aligned, zero-initialized bytes. From kMappedBytes on, pages mapped from the
// kernel (zero until first written, backed only when touched, huge pages where the kernel gives
// them); below, the heap.
class TensorStorage {
 public:
  TensorStorage() = default;
  explicit TensorStorage(size_t bytes);
  // A moved-from storage is empty (null data, size 0), never a size without memory.
  TensorStorage(TensorStorage&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  TensorStorage& operator=(TensorStorage&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kMappedBytes = size_t{1} << 20;
  struct Free {
    Free() : mapped_bytes(0), offset(0), counted(0) {}
    Free(size_t mapped, size_t offset_in_map, size_t counted_bytes)
        : mapped_bytes(mapped), offset(offset_in_map), counted(counted_bytes) {}
    void operator()(std::byte* p) const;
    size_t mapped_bytes;  // > 0: an mmap of that many bytes; 0: the heap
    size_t offset;        // of p in the mapping or the heap block
    size_t counted;       // what TensorStorageBytes() counts for it
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A contiguous row-major view of `data`.
  Tensor(void* data, DType dtype, std::span<const int64_t> shape);
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape)
      : Tensor(data, dtype, std::span<const int64_t>(shape.begin(), shape.size())) {}

  DType dtype() const { return dtype_; }
  size_t rank() const { return rank_; }
  int64_t dim(size_t i) const {
    DCHECK(i < rank_);
    return shape_[i];
  }
  int64_t stride(size_t i) const {
    DCHECK(i < rank_);
    return strides_[i];
  }
  std::span<const int64_t> shape() const { return {shape_.data(), rank_}; }
  int64_t numel() const;
  size_t bytes() const { return TensorBytes(dtype_, shape()); }
  bool contiguous() const;

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  // Views that share memory. A GGML block format is sliced at whole blocks only: along the last
  // dimension begin and end must be multiples of its block (rows along the others: any).
  Tensor Slice(size_t dim, int64_t begin, int64_t end) const;  // [begin, end) along dim
  Tensor Reshape(std::span<const int64_t> shape) const;        // contiguous only
  Tensor Reshape(std::initializer_list<int64_t> shape) const {
    return Reshape(std::span<const int64_t>(shape.begin(), shape.size()));
  }

  std::string ShapeString() const;  // "[2, 3]"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  size_t rank_ = 0;
  std::array<int64_t, kMaxTensorRank> shape_{};
  std::array<int64_t, kMaxTensorRank> strides_{};
};

// Where the scales of a packed [N, K] matrix begin, after its rows.
const void* PackedScales(const Tensor& W);
// kQ8, kQ8A8: one f32 scale per row, [N].
inline const float* PackedRowScales(const Tensor& W) {
  return static_cast<const float*>(PackedScales(W));
}
inline float* MutablePackedRowScales(const Tensor& W) {
  return const_cast<float*>(PackedRowScales(W));
}
// kQ4, kQ4A8: one IEEE f16 scale per group (its bits), [N, K / kQ4Group].
inline const uint16_t* PackedGroupScales(const Tensor& W) {
  return static_cast<const uint16_t*>(PackedScales(W));
}
inline uint16_t* MutablePackedGroupScales(const Tensor& W) {
  return const_cast<uint16_t*>(PackedGroupScales(W));
}

// A tensor that owns its memory (contiguous, aligned), or holds a share of memory another object
// owns (Borrowed: a tensor of a mapped file, used in place).
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(DType dtype, std::span<const int64_t> shape);
  OwnedTensor(DType dtype, std::initializer_list<int64_t> shape)
      : OwnedTensor(dtype, std::span<const int64_t>(shape.begin(), shape.size())) {}
  // `view` (contiguous) of memory `owner` keeps alive for as long as the tensor lives.
  static OwnedTensor Borrowed(const Tensor& view, std::shared_ptr<const void> owner);
  // Moving hands the memory over; the source is left empty rather than viewing freed memory.
  OwnedTensor(OwnedTensor&& other) noexcept
      : storage_(std::move(other.storage_)),
        owner_(std::move(other.owner_)),
        view_(std::exchange(other.view_, Tensor())) {}
  OwnedTensor& operator=(OwnedTensor&& other) noexcept {
    storage_ = std::move(other.storage_);
    owner_ = std::move(other.owner_);
    view_ = std::exchange(other.view_, Tensor());
    return *this;
  }

  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: a view of owned memory
  // True for a Borrowed tensor: its bytes are not TensorStorage (TensorStorageBytes).
  bool borrowed() const { return owner_ != nullptr; }

 private:
  TensorStorage storage_;
  std::shared_ptr<const void> owner_;  // Borrowed: what keeps view_'s memory alive
  Tensor view_;
};

// Number of elements of a shape; false when a dimension is negative or the product overflows
// int64 (used to validate untrusted shapes).
bool CheckedNumel(std::span<const int64_t> shape, int64_t* numel);

}  // namespace moeserve
