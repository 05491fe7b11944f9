#include "model/weight_warmer.h"

#include <algorithm>

#include "core/dtype.h"

namespace moeserve::model {

void WeightWarmer::Clear() {
  count_ = next_ = finished_ = 0;
}

void WeightWarmer::AddRange(const std::byte* begin, size_t bytes) {
  if (bytes == 0 || count_ == kMaxRanges) return;
  ranges_[count_++] = Range{reinterpret_cast<uintptr_t>(begin), bytes, 0};
}

void WeightWarmer::Add(const Tensor& W, size_t parts) {
  if (W.rank() != 2 || W.numel() == 0) return;
  parts = std::clamp<size_t>(parts, 1, kMaxParts);
  // Part p of a region: its bytes [size p / parts, size (p + 1) / parts) -- the rows of part p,
  // to within a row, which is all a cache needs.
  const auto* data = static_cast<const std::byte*>(W.data());
  const size_t total = W.bytes();
  const size_t rows_bytes =
      IsPackedDType(W.dtype())
          ? static_cast<size_t>(reinterpret_cast<const std::byte*>(PackedScales(W)) - data)
          : total;
  for (size_t p = 0; p < parts; ++p) {
    const size_t begin = rows_bytes * p / parts, end = rows_bytes * (p + 1) / parts;
    AddRange(data + begin, end - begin);
    if (rows_bytes < total) {
      const size_t scales = total - rows_bytes;
      const size_t s_begin = scales * p / parts, s_end = scales * (p + 1) / parts;
      AddRange(data + rows_bytes + s_begin, s_end - s_begin);
    }
  }
}

bool WeightWarmer::Step() {
  if (finished_ == count_) return false;
  const size_t share = kBudgetBytes / count_;
  // The next range that still has part of its share to go (one exists: finished_ < count_).
  for (;; next_ = (next_ + 1) % count_) {
    Range& r = ranges_[next_];
    const size_t limit = std::min(r.bytes, share);
    if (r.done >= limit) continue;
    const size_t bytes = std::min(kStepBytes, limit - r.done);
    // Addresses as integers: the last line may reach past the range, where a prefetch does not
    // fault but no pointer may point.
    for (size_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(r.begin + r.done + b), /*rw=*/0,
                         /*locality=*/2);
    }
    r.done += bytes;
    warmed_bytes_ += bytes;
    if (r.done >= limit) ++finished_;
    next_ = (next_ + 1) % count_;
    return finished_ < count_;
  }
}

}  // namespace moeserve::model
