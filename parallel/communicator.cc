#include "parallel/communicator.h"

#include <cstring>

#include "core/check.h"

namespace moeserve::parallel {

void CopyFloats(float* dst, const float* src, int64_t n) {
  if (n > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void Communicator::AllReduceRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) {
  AllReduceSum(data, rows * cols);
  for (int64_t r = 0; r < rows; ++r) visit(r, data + r * cols);
}

void Communicator::AllGatherRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) {
  const int64_t begin = rows * rank() / size(), end = rows * (rank() + 1) / size();
  std::memset(data, 0, static_cast<size_t>(begin * cols) * sizeof(float));
  std::memset(data + end * cols, 0, static_cast<size_t>((rows - end) * cols) * sizeof(float));
  AllReduceRows(data, rows, cols, visit);
}

void SingleRankCommunicator::AllGather(const float* in, int64_t n, float* out) {
  CopyFloats(out, in, n);
}

void SingleRankCommunicator::ReduceScatterSum(const float* in, int64_t n, float* out) {
  CopyFloats(out, in, n);
}

void SingleRankCommunicator::AllToAllV(const float* send, std::span<const int64_t> send_counts,
                                       std::span<const int64_t> send_offsets, float* recv,
                                       std::span<const int64_t> recv_counts,
                                       std::span<const int64_t> recv_offsets) {
  CHECK_EQ(send_counts[0], recv_counts[0]) << "rank 0 sends itself what it does not expect";
  if (send_counts[0] > 0) CopyFloats(recv + recv_offsets[0], send + send_offsets[0], send_counts[0]);
}

}  // namespace moeserve::parallel
