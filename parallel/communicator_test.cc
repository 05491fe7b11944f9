// The local communicator against serial results: every collective, 1 to 8 ranks (more ranks
// than cores too), shapes that do not divide evenly, hundreds of collectives back to back in a
// random mix (the published pointers alternate between two sets, so a fast rank may start the
// next collective while a slow one still reads the last). Reductions must give every rank the
// same bits as adding the ranks' values in rank order. Also: --comm-sim's link model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "parallel/link_model.h"
#include "parallel/local_communicator.h"

namespace moeserve::parallel {
namespace {

// Runs fn(communicator) on one thread per rank of a fresh group.
void OnRanks(int size, const std::function<void(Communicator&)>& fn) {
  LocalGroup group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(group.rank(r)); });
  for (std::thread& t : threads) t.join();
}

// A value no two (rank, step, index) share, and whose sums round (so order matters).
float Value(int rank, int step, int64_t i) {
  return std::sin(0.37f * static_cast<float>(rank + 1) + 1.3f * static_cast<float>(step) +
                  0.011f * static_cast<float>(i)) *
         (1.0f + 1e-3f * static_cast<float>(rank));
}

std::vector<float> Values(int rank, int step, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, step, i);
  return v;
}

// Sum over ranks in rank order, as the communicator promises.
std::vector<float> RankOrderSum(int size, int step, int64_t n) {
  std::vector<float> sum = Values(0, step, n);
  for (int r = 1; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) sum[i] += Value(r, step, i);
  }
  return sum;
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

class LocalCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommunicatorTest, EveryCollectiveMatchesTheSerialResult) {
  const int size = GetParam();
  const std::vector<int64_t> lengths = {0, 1, 3, 7, 64, 1000, 4099};
  std::atomic<int> failures{0};
  OnRanks(size, [&](Communicator& comm) {
    const int me = comm.rank();
    EXPECT_EQ(comm.size(), size);
    auto fail = [&](const char* what, int step) {
      ADD_FAILURE() << what << " differs on rank " << me << " at step " << step;
      ++failures;
    };
    for (int step = 0; step < static_cast<int>(lengths.size()); ++step) {
      const int64_t n = lengths[step];
      std::vector<float> data = Values(me, step, n);
      comm.AllReduceSum(data.data(), n);
      if (!SameBits(data.data(), RankOrderSum(size, step, n).data(), n)) fail("AllReduceSum", step);

      // AllReduceRows: n values as rows of 4 (and a last short row left out), each row visited
      // once, in order, with the rank-order sum.
      {
        const int64_t cols = 4, rows = n / cols;
        std::vector<float> rows_in = Values(me, step, n), visited;
        int64_t next_row = 0;
        auto visit = [&](int64_t row, const float* values) {
          if (row != next_row++) fail("AllReduceRows order", step);
          visited.insert(visited.end(), values, values + cols);
        };
        comm.AllReduceRows(rows_in.data(), rows, cols, visit);
        if (next_row != rows || !SameBits(visited.data(), RankOrderSum(size, step, n).data(),
                                          rows * cols)) {
          fail("AllReduceRows", step);
        }
      }

      std::vector<float> gathered(size * n);
      const std::vector<float> mine = Values(me, step, n);
      comm.AllGather(mine.data(), n, gathered.data());
      for (int r = 0; r < size; ++r) {
        if (!SameBits(gathered.data() + r * n, Values(r, step, n).data(), n)) {
          fail("AllGather", step);
        }
      }

      const std::vector<float> in = Values(me, step, size * n);
      std::vector<float> out(n);
      comm.ReduceScatterSum(in.data(), n, out.data());
      const std::vector<float> full = RankOrderSum(size, step, size * n);
      if (!SameBits(out.data(), full.data() + me * n, n)) fail("ReduceScatterSum", step);

      // All-to-all: rank s sends (s + r + step) % 5 values to rank r, value = 1000 s + r + k.
      auto count = [&](int s, int r) { return static_cast<int64_t>((s + r + step) % 5); };
      std::vector<int64_t> send_counts(size), send_offsets(size), recv_counts(size),
          recv_offsets(size);
      int64_t send_total = 0, recv_total = 0;
      for (int r = 0; r < size; ++r) {
        send_counts[r] = count(me, r);
        send_offsets[r] = send_total;
        send_total += send_counts[r];
        recv_counts[r] = count(r, me);
        recv_offsets[r] = recv_total;
        recv_total += recv_counts[r];
      }
      std::vector<float> send(send_total), recv(recv_total, -1.0f);
      for (int r = 0; r < size; ++r) {
        for (int64_t k = 0; k < send_counts[r]; ++k) send[send_offsets[r] + k] = 1000.0f * me + r + k;
      }
      comm.AllToAllV(send.data(), send_counts, send_offsets, recv.data(), recv_counts,
                     recv_offsets);
      for (int s = 0; s < size; ++s) {
        for (int64_t k = 0; k < recv_counts[s]; ++k) {
          if (recv[recv_offsets[s] + k] != 1000.0f * s + me + k) fail("AllToAllV", step);
        }
      }

      // The same exchange started, each part waited for in a rotated order, then finished.
      std::vector<float> started(recv_total, -1.0f);
      comm.StartAllToAllV(send.data(), send_counts, send_offsets, started.data(), recv_counts,
                          recv_offsets);
      for (int d = 0; d < size; ++d) comm.WaitFrom((me + d) % size);
      comm.FinishAllToAllV();
      if (started != recv) fail("StartAllToAllV", step);

      // AllGatherRows: each rank owns a slice of the rows; everyone visits every row's values.
      {
        const int64_t cols = 3, rows = n / cols;
        std::vector<float> mine_rows(rows * cols, -7.0f);
        for (int64_t r = rows * me / size; r < rows * (me + 1) / size; ++r) {
          for (int64_t c = 0; c < cols; ++c) mine_rows[r * cols + c] = Value(me, step, r * cols + c);
        }
        int64_t visits = 0;
        auto visit = [&](int64_t row, const float* values) {
          ++visits;
          int owner = 0;
          while (row >= rows * (owner + 1) / size) ++owner;
          for (int64_t c = 0; c < cols; ++c) {
            if (values[c] != Value(owner, step, row * cols + c)) fail("AllGatherRows", step);
          }
        };
        comm.AllGatherRows(mine_rows.data(), rows, cols, visit);
        if (visits != rows) fail("AllGatherRows visits", step);
      }

      int64_t payload[3] = {me == step % size ? 42 + step : -1, me == step % size ? n : -1, 7};
      comm.Broadcast(payload, sizeof(payload), step % size);
      if (payload[0] != 42 + step || payload[1] != n) fail("Broadcast", step);
      comm.Barrier();
    }
  });
  EXPECT_EQ(failures.load(), 0);
}

// Hundreds of collectives in a random order (the same order on every rank) with uneven work
// between them: ranks run ahead of each other by up to one collective.
TEST_P(LocalCommunicatorTest, ARandomMixBackToBack) {
  const int size = GetParam();
  std::atomic<int> failures{0};
  OnRanks(size, [&](Communicator& comm) {
    const int me = comm.rank();
    std::mt19937 order(99);  // same sequence on every rank
    std::mt19937 jitter(me);
    for (int step = 0; step < 300; ++step) {
      const int op = static_cast<int>(order() % 3);
      const int64_t n = 1 + static_cast<int64_t>(order() % 300);
      // Uneven work before the collective.
      volatile float sink = 0;
      for (uint32_t i = jitter() % 2000; i > 0; --i) sink = sink + 1.0f;
      if (op == 0) {
        std::vector<float> data = Values(me, step, n);
        comm.AllReduceSum(data.data(), n);
        failures += !SameBits(data.data(), RankOrderSum(size, step, n).data(), n);
      } else if (op == 1) {
        std::vector<float> out(size * n);
        const std::vector<float> in = Values(me, step, n);
        comm.AllGather(in.data(), n, out.data());
        for (int r = 0; r < size; ++r) {
          failures += !SameBits(out.data() + r * n, Values(r, step, n).data(), n);
        }
      } else {
        const std::vector<float> in = Values(me, step, size * n);
        std::vector<float> out(n);
        comm.ReduceScatterSum(in.data(), n, out.data());
        failures += !SameBits(out.data(), RankOrderSum(size, step, size * n).data() + me * n, n);
      }
    }
  });
  EXPECT_EQ(failures.load(), 0);
}

// 1 to 8 ranks: with 2 cores, 3 and 8 ranks oversubscribe them (waiting ranks must yield).
INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommunicatorTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_ranks";
                         });

TEST(SingleRankCommunicatorTest, CollectivesAreIdentities) {
  SingleRankCommunicator comm;
  std::vector<float> v = {1, 2, 3}, out(3);
  comm.AllReduceSum(v.data(), 3);
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  comm.AllGather(v.data(), 3, out.data());
  EXPECT_EQ(out, v);
  comm.ReduceScatterSum(v.data(), 3, out.data());
  EXPECT_EQ(out, v);
  const int64_t counts[] = {3}, offsets[] = {0};
  std::vector<float> recv(3);
  comm.AllToAllV(v.data(), counts, offsets, recv.data(), counts, offsets);
  EXPECT_EQ(recv, v);
}

TEST(LinkModelTest, ParsesLatencyAndBandwidth) {
  Result<LinkModel> link = ParseLinkModel("2.5,25");
  ASSERT_TRUE(link.ok());
  EXPECT_DOUBLE_EQ(link->latency_us, 2.5);
  EXPECT_DOUBLE_EQ(link->gb_per_s, 25);
  EXPECT_DOUBLE_EQ(link->Seconds(25e9), 1.0 + 2.5e-6);
  for (const char* bad : {"", "2", "2,", ",25", "0,25", "2,0", "-1,25", "2,inf", "2,nan", "x,1",
                          "1,2,3"}) {
    Result<LinkModel> r = ParseLinkModel(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--comm-sim"), std::string::npos);
  }
}

// A started all-to-all is exposed only for what the rank waits for: work between the start and
// the waits longer than the link time hides all of it; waiting at once exposes all of it.
TEST(LinkModelTest, StartedExchangeHidesBehindWork) {
  const LinkModel link{.latency_us = 200, .gb_per_s = 0.1};  // 200 us + 4 KB at 100 MB/s = 240 us
  constexpr int kSize = 2;
  constexpr int64_t kN = 1000;
  std::vector<double> hidden(kSize), blocking(kSize), modelled(kSize);
  OnRanks(kSize, [&](Communicator& inner) {
    SimulatedLinkCommunicator comm(inner, link);
    const int other = 1 - comm.rank();
    std::vector<float> send(2 * kN, static_cast<float>(comm.rank())), recv(2 * kN);
    const std::vector<int64_t> counts = {kN, kN}, offsets = {0, kN};
    comm.StartAllToAllV(send.data(), counts, offsets, recv.data(), counts, offsets);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // compute longer than the link
    comm.WaitFrom(other);
    comm.FinishAllToAllV();
    EXPECT_EQ(recv[kN * other], static_cast<float>(other));
    hidden[comm.rank()] = comm.exchange_exposed_seconds();
    comm.AllToAllV(send.data(), counts, offsets, recv.data(), counts, offsets);
    blocking[comm.rank()] = comm.exchange_exposed_seconds() - hidden[comm.rank()];
    modelled[comm.rank()] = comm.modelled_seconds();
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(hidden[r], 0) << "rank " << r;
    EXPECT_NEAR(blocking[r], 240e-6, 30e-6) << "rank " << r;
    EXPECT_NEAR(modelled[r], 2 * 240e-6, 1e-9) << "rank " << r;
  }
}

TEST(LinkModelTest, AddsTheModelledTimeOfEachCollective) {
  const LinkModel link{.latency_us = 10, .gb_per_s = 1};
  constexpr int kSize = 4;
  constexpr int64_t kN = 1000;
  std::vector<double> modelled(kSize);
  std::vector<int64_t> collectives(kSize);
  OnRanks(kSize, [&](Communicator& inner) {
    SimulatedLinkCommunicator comm(inner, link);
    std::vector<float> data = Values(comm.rank(), 0, kN), out(kSize * kN);
    comm.AllReduceSum(data.data(), kN);
    EXPECT_TRUE(SameBits(data.data(), RankOrderSum(kSize, 0, kN).data(), kN));
    comm.AllGather(data.data(), kN, out.data());
    comm.Barrier();
    modelled[comm.rank()] = comm.modelled_seconds();
    collectives[comm.rank()] = comm.num_collectives();
  });
  // all-reduce 2 * 3/4 * 4000 B, all-gather 3 * 4000 B, barrier 0 B; 10 us each.
  const double expected = 3 * 10e-6 + (6000.0 + 12000.0) / 1e9;
  for (int r = 0; r < kSize; ++r) {
    EXPECT_NEAR(modelled[r], expected, 1e-12) << "rank " << r;
    EXPECT_EQ(collectives[r], 3);
  }
  // One rank has no link.
  SingleRankCommunicator single;
  SimulatedLinkCommunicator lone(single, link);
  std::vector<float> row(4, 1.0f);
  int64_t lone_visits = 0;
  auto count = [&](int64_t, const float*) { ++lone_visits; };
  lone.AllGatherRows(row.data(), 1, 4, count);
  EXPECT_EQ(lone_visits, 1);
  SimulatedLinkCommunicator alone(single, link);
  std::vector<float> v(8, 1.0f);
  alone.AllReduceSum(v.data(), 8);
  EXPECT_EQ(alone.modelled_seconds(), 0);
}

// Counts its steps; has `budget` of them to do (a call after that does nothing).
class CountingWork final : public IdleWork {
 public:
  explicit CountingWork(int64_t budget) : budget_(budget) {}
  bool Step() override {
    if (steps_ == budget_) return false;
    return ++steps_ < budget_;
  }
  int64_t steps() const { return steps_; }

 private:
  int64_t budget_, steps_ = 0;
};

// Case study #12's hook: a rank that waits -- for a slower peer at a barrier, or for the link --
// does its idle work meanwhile, stops when the work says it is done, and the results are those
// of the same collectives without it.
TEST(IdleWorkTest, WaitsDoTheWorkAndResultsDoNotChange) {
  constexpr int kSize = 2;
  constexpr int64_t kN = 999;
  std::vector<int64_t> local_steps(kSize), link_steps(kSize), unset_steps(kSize);
  OnRanks(kSize, [&](Communicator& comm) {
    // Rank 1 arrives 2 ms late: rank 0 waits at the barrier, doing its work.
    CountingWork work(1 << 30);
    comm.set_idle_work(&work);
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::vector<float> data = Values(comm.rank(), 0, kN);
    comm.AllReduceSum(data.data(), kN);
    EXPECT_TRUE(SameBits(data.data(), RankOrderSum(kSize, 0, kN).data(), kN));
    local_steps[comm.rank()] = work.steps();
    // Unset: nothing is called any more.
    comm.set_idle_work(nullptr);
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    comm.Barrier();
    unset_steps[comm.rank()] = work.steps() - local_steps[comm.rank()];
  });
  EXPECT_GT(local_steps[0], 0);
  EXPECT_EQ(unset_steps[0], 0);
  EXPECT_EQ(unset_steps[1], 0);

  // The link's wait (200 us per collective) does work until the work runs out: 50 steps.
  const LinkModel link{.latency_us = 200, .gb_per_s = 1};
  OnRanks(kSize, [&](Communicator& inner) {
    SimulatedLinkCommunicator comm(inner, link);
    CountingWork work(50);
    comm.set_idle_work(&work);
    std::vector<float> data = Values(comm.rank(), 1, kN);
    comm.AllReduceSum(data.data(), kN);
    EXPECT_TRUE(SameBits(data.data(), RankOrderSum(kSize, 1, kN).data(), kN));
    comm.set_idle_work(nullptr);
    link_steps[comm.rank()] = work.steps();
    EXPECT_GE(comm.exposed_seconds(), 200e-6);  // the wait itself is unchanged
  });
  EXPECT_EQ(link_steps[0], 50);
  EXPECT_EQ(link_steps[1], 50);
}

}  // namespace
}  // namespace moeserve::parallel
