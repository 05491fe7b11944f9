// `--comm-sim LATENCY_US,GBPS`: a modelled link under any communicator. Two cores cannot show
// what an interconnect or a network costs, so every collective of the wrapped communicator is
// followed by the time the same collective would take over a link of that latency and
// bandwidth: latency + the bytes one rank moves / bandwidth, with the byte counts of ring
// algorithms (all-reduce 2 (p - 1) / p x n, all-gather and reduce-scatter (p - 1) x n per-rank
// slices, all-to-all what a rank sends or receives off-rank, broadcast the payload). The wait
// is a real one (the rank's idle work first, if any; then sleep, then spin for the last
// microseconds), so step times include it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>
#include <string_view>

#include "core/status.h"
#include "parallel/communicator.h"

namespace moeserve::parallel {

struct LinkModel {
  double latency_us = 0;
  double gb_per_s = 0;  // 10^9 bytes per second

  // Seconds one collective moving `bytes` per rank takes over this link.
  double Seconds(double bytes) const { return latency_us * 1e-6 + bytes / (gb_per_s * 1e9); }
};

// "LATENCY_US,GBPS", e.g. "2,25" (2 us, 25 GB/s); both > 0 and finite.
Result<LinkModel> ParseLinkModel(std::string_view text);

// Bytes rank `rank` of `size` moves in each collective, as modelled.
struct CollectiveBytes {
  static double AllReduce(int64_t n, int size);
  static double AllGather(int64_t n, int size);
  static double ReduceScatter(int64_t n, int size);
};

class SimulatedLinkCommunicator final : public Communicator {
 public:
  // `inner` must outlive this.
  SimulatedLinkCommunicator(Communicator& inner, const LinkModel& link)
      : inner_(inner), link_(link) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  // The work is done in the inner communicator's waits and in the link's.
  void set_idle_work(IdleWork* work) override {
    Communicator::set_idle_work(work);
    inner_.set_idle_work(work);
  }
  void AllReduceSum(float* data, int64_t n) override;
  void AllReduceRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override;
  void AllGatherRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override;
  void AllGather(const float* in, int64_t n, float* out) override;
  void ReduceScatterSum(const float* in, int64_t n, float* out) override;
  void AllToAllV(const float* send, std::span<const int64_t> send_counts,
                 std::span<const int64_t> send_offsets, float* recv,
                 std::span<const int64_t> recv_counts,
                 std::span<const int64_t> recv_offsets) override;
  void StartAllToAllV(const float* send, std::span<const int64_t> send_counts,
                      std::span<const int64_t> send_offsets, float* recv,
                      std::span<const int64_t> recv_counts,
                      std::span<const int64_t> recv_offsets) override;
  void WaitFrom(int peer) override;
  void FinishAllToAllV() override;
  void Broadcast(void* data, size_t bytes, int root) override;
  void Barrier() override;

  // The link time of the collectives so far, and their number.
  double modelled_seconds() const { return modelled_seconds_; }
  int64_t num_collectives() const { return num_collectives_; }
  // The part of it this rank waited for: all of a blocking collective's; of a started all-to-all
  // (StartAllToAllV) only what WaitFrom / Finish found still in flight.
  double exposed_seconds() const { return exposed_seconds_; }
  // The same for all-to-all exchanges only (blocking or started).
  double exchange_exposed_seconds() const { return exchange_exposed_seconds_; }

 private:
  // Waits the link time of a blocking collective that moved `bytes` per rank (nothing with one
  // rank); `exchange` when it is an all-to-all.
  void Transfer(double bytes, bool exchange = false);

  Communicator& inner_;
  LinkModel link_;
  double modelled_seconds_ = 0, exposed_seconds_ = 0, exchange_exposed_seconds_ = 0;
  // The exchange in flight: when each peer's part arrives, when all of it is done.
  std::vector<std::chrono::steady_clock::time_point> arrival_;
  std::chrono::steady_clock::time_point exchange_done_;
  int64_t num_collectives_ = 0;
};

}  // namespace moeserve::parallel
