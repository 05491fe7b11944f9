#include "parallel/communicator.h"

#include <cstring>

#include "core/check.h"

namespace moeserve::parallel {

void SingleRankCommunicator::AllGather(const float* in, int64_t n, float* out) {
  if (in != out) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
}

void SingleRankCommunicator::ReduceScatterSum(const float* in, int64_t n, float* out) {
  if (in != out) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
}

void SingleRankCommunicator::AllToAllV(const float* send, std::span<const int64_t> send_counts,
                                       std::span<const int64_t> send_offsets, float* recv,
                                       std::span<const int64_t> recv_counts,
                                       std::span<const int64_t> recv_offsets) {
  CHECK_EQ(send_counts[0], recv_counts[0]) << "rank 0 sends itself what it does not expect";
  std::memmove(recv + recv_offsets[0], send + send_offsets[0],
               static_cast<size_t>(send_counts[0]) * sizeof(float));
}

}  // namespace moeserve::parallel
