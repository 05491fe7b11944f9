#include "parallel/link_model.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace moeserve::parallel {
namespace {

Result<double> ParsePositive(std::string_view text, std::string_view what) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(value) || value <= 0) {
    return InvalidArgument("--comm-sim: {} \"{}\" is not a positive number", what, text);
  }
  return value;
}

}  // namespace

Result<LinkModel> ParseLinkModel(std::string_view text) {
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos) {
    return InvalidArgument("--comm-sim: expected LATENCY_US,GBPS (e.g. 2,25), got \"{}\"", text);
  }
  LinkModel link;
  ASSIGN_OR_RETURN(link.latency_us, ParsePositive(text.substr(0, comma), "latency"));
  ASSIGN_OR_RETURN(link.gb_per_s, ParsePositive(text.substr(comma + 1), "bandwidth"));
  return link;
}

double CollectiveBytes::AllReduce(int64_t n, int size) {
  return 2.0 * (size - 1) / size * static_cast<double>(n) * sizeof(float);
}
double CollectiveBytes::AllGather(int64_t n, int size) {
  return static_cast<double>(size - 1) * static_cast<double>(n) * sizeof(float);
}
double CollectiveBytes::ReduceScatter(int64_t n, int size) { return AllGather(n, size); }

void SimulatedLinkCommunicator::Transfer(double bytes) {
  if (inner_.size() == 1) return;
  const double seconds = link_.Seconds(bytes);
  modelled_seconds_ += seconds;
  ++num_collectives_;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  // Sleep the bulk (the core is free for other ranks), spin the last 50 us (sleep overshoots).
  const auto spin = std::chrono::microseconds(50);
  if (until - Clock::now() > spin) std::this_thread::sleep_until(until - spin);
  while (Clock::now() < until) {
  }
}

void SimulatedLinkCommunicator::AllReduceSum(float* data, int64_t n) {
  inner_.AllReduceSum(data, n);
  Transfer(CollectiveBytes::AllReduce(n, size()));
}

void SimulatedLinkCommunicator::AllReduceRows(float* data, int64_t rows, int64_t cols,
                                              RowVisitor visit) {
  inner_.AllReduceRows(data, rows, cols, visit);
  Transfer(CollectiveBytes::AllReduce(rows * cols, size()));
}

void SimulatedLinkCommunicator::AllGather(const float* in, int64_t n, float* out) {
  inner_.AllGather(in, n, out);
  Transfer(CollectiveBytes::AllGather(n, size()));
}

void SimulatedLinkCommunicator::ReduceScatterSum(const float* in, int64_t n, float* out) {
  inner_.ReduceScatterSum(in, n, out);
  Transfer(CollectiveBytes::ReduceScatter(n, size()));
}

void SimulatedLinkCommunicator::AllToAllV(const float* send, std::span<const int64_t> send_counts,
                                          std::span<const int64_t> send_offsets, float* recv,
                                          std::span<const int64_t> recv_counts,
                                          std::span<const int64_t> recv_offsets) {
  inner_.AllToAllV(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  // What crosses the link: off-rank sends or receives, whichever is more.
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    sent += send_counts[r];
    received += recv_counts[r];
  }
  Transfer(static_cast<double>(std::max(sent, received)) * sizeof(float));
}

void SimulatedLinkCommunicator::Broadcast(void* data, size_t bytes, int root) {
  inner_.Broadcast(data, bytes, root);
  Transfer(static_cast<double>(bytes));
}

void SimulatedLinkCommunicator::Barrier() {
  inner_.Barrier();
  Transfer(0);
}

}  // namespace moeserve::parallel
