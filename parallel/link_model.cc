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

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point After(Clock::time_point t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Waits until `until`, doing `idle` work (may be null) meanwhile; returns the seconds waited (0
// when it has passed).
double WaitUntil(Clock::time_point until, IdleWork* idle) {
  const Clock::time_point now = Clock::now();
  if (now >= until) return 0;
  while (idle != nullptr && Clock::now() < until && idle->Step()) {
  }
  // Sleep the bulk (the core is free for other ranks), spin the last 50 us (sleep overshoots).
  const auto spin = std::chrono::microseconds(50);
  if (until - now > spin) std::this_thread::sleep_until(until - spin);
  while (Clock::now() < until) {
  }
  return std::chrono::duration<double>(until - now).count();
}

// Floats that cross the link in an all-to-all: off-rank sends or receives, whichever is more.
int64_t OffRankFloats(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
                      int rank) {
  int64_t sent = 0, received = 0;
  for (size_t r = 0; r < send_counts.size(); ++r) {
    if (static_cast<int>(r) == rank) continue;
    sent += send_counts[r];
    received += recv_counts[r];
  }
  return std::max(sent, received);
}

}  // namespace

void SimulatedLinkCommunicator::Transfer(double bytes, bool exchange) {
  if (inner_.size() == 1) return;
  const double seconds = link_.Seconds(bytes);
  modelled_seconds_ += seconds;
  ++num_collectives_;
  const double waited = WaitUntil(After(Clock::now(), seconds), idle_work());
  exposed_seconds_ += waited;
  if (exchange) exchange_exposed_seconds_ += waited;
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

void SimulatedLinkCommunicator::AllGatherRows(float* data, int64_t rows, int64_t cols,
                                              RowVisitor visit) {
  inner_.AllGatherRows(data, rows, cols, visit);
  // Modelled as an all-gather of equal slices of the rows.
  Transfer(CollectiveBytes::AllGather(rows * cols / std::max(size(), 1), size()));
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
  Transfer(static_cast<double>(OffRankFloats(send_counts, recv_counts, rank())) * sizeof(float),
           /*exchange=*/true);
}

void SimulatedLinkCommunicator::StartAllToAllV(const float* send,
                                               std::span<const int64_t> send_counts,
                                               std::span<const int64_t> send_offsets, float* recv,
                                               std::span<const int64_t> recv_counts,
                                               std::span<const int64_t> recv_offsets) {
  inner_.StartAllToAllV(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  // The peers' parts arrive one after another over the link (rank + 1 first, as a ring sends),
  // this rank's own at once; its sends are done when all of them have crossed.
  const int size = inner_.size(), me = rank();
  const Clock::time_point start = Clock::now();
  arrival_.assign(size, start);
  double received = 0, sent = 0;
  for (int d = 1; d < size; ++d) {
    const int s = (me + d) % size;
    received += static_cast<double>(recv_counts[s]) * sizeof(float);
    sent += static_cast<double>(send_counts[s]) * sizeof(float);
    arrival_[s] = After(start, link_.Seconds(received));
  }
  exchange_done_ = After(start, link_.Seconds(std::max(sent, received)));
  if (size > 1) {
    modelled_seconds_ += link_.Seconds(std::max(sent, received));
    ++num_collectives_;
  }
}

void SimulatedLinkCommunicator::WaitFrom(int peer) {
  inner_.WaitFrom(peer);
  const double waited = WaitUntil(arrival_[peer], idle_work());
  exposed_seconds_ += waited;
  exchange_exposed_seconds_ += waited;
}

void SimulatedLinkCommunicator::FinishAllToAllV() {
  inner_.FinishAllToAllV();
  const double waited = WaitUntil(exchange_done_, idle_work());
  exposed_seconds_ += waited;
  exchange_exposed_seconds_ += waited;
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
