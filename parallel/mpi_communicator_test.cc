// Run by mpirun with 2 and 4 processes (ctest: mpi_communicator_np2 / _np4). Every rank checks
// every collective of the MPI communicator against what it computes alone, and its reductions
// against a local communicator of as many threads doing the same: the same bits, since both add
// the ranks in rank order. Exit 0 on every rank when all pass.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "parallel/local_communicator.h"
#include "parallel/mpi_communicator.h"

namespace {

using moeserve::parallel::Communicator;

float Value(int rank, int step, int64_t i) {
  return std::sin(0.37f * static_cast<float>(rank + 1) + 1.3f * static_cast<float>(step) +
                  0.011f * static_cast<float>(i)) *
         (1.0f + 1e-3f * static_cast<float>(rank));
}

int failures = 0;
void Expect(bool ok, const char* what, int rank, int step) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: %s wrong at step %d\n", rank, what, step);
  ++failures;
}

// The all-reduce of every rank's Values(step) by a local group of `size` threads.
std::vector<float> LocalAllReduce(int size, int step, int64_t n) {
  moeserve::parallel::LocalGroup group(size);
  std::vector<std::vector<float>> data(size, std::vector<float>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) data[r][i] = Value(r, step, i);
    threads.emplace_back([&, r] { group.rank(r).AllReduceSum(data[r].data(), n); });
  }
  for (std::thread& t : threads) t.join();
  return data[0];
}

}  // namespace

int main() {
  auto created = moeserve::parallel::CreateMpiCommunicator();
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **created;
  const int me = comm.rank(), size = comm.size();
  int step = 0;
  for (const int64_t n : {0L, 1L, 5L, 1000L, 4097L}) {
    ++step;
    std::vector<float> data(n), expected(n);
    for (int64_t i = 0; i < n; ++i) {
      data[i] = Value(me, step, i);
      expected[i] = Value(0, step, i);
      for (int r = 1; r < size; ++r) expected[i] += Value(r, step, i);
    }
    comm.AllReduceSum(data.data(), n);
    Expect(n == 0 || std::memcmp(data.data(), expected.data(), n * sizeof(float)) == 0,
           "AllReduceSum", me, step);
    const std::vector<float> local = LocalAllReduce(size, step, n);
    Expect(n == 0 || std::memcmp(data.data(), local.data(), n * sizeof(float)) == 0,
           "AllReduceSum (vs the local communicator)", me, step);

    std::vector<float> mine(n), gathered(size * n);
    for (int64_t i = 0; i < n; ++i) mine[i] = Value(me, step, i);
    comm.AllGather(mine.data(), n, gathered.data());
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        Expect(gathered[r * n + i] == Value(r, step, i), "AllGather", me, step);
      }
    }

    std::vector<float> in(size * n), out(n);
    for (int64_t i = 0; i < size * n; ++i) in[i] = Value(me, step, i);
    comm.ReduceScatterSum(in.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      float want = Value(0, step, me * n + i);
      for (int r = 1; r < size; ++r) want += Value(r, step, me * n + i);
      Expect(out[i] == want, "ReduceScatterSum", me, step);
    }

    std::vector<int64_t> sc(size), so(size), rc(size), ro(size);
    int64_t st = 0, rt = 0;
    for (int r = 0; r < size; ++r) {
      sc[r] = (me + r + step) % 4;
      so[r] = st;
      st += sc[r];
      rc[r] = (r + me + step) % 4;
      ro[r] = rt;
      rt += rc[r];
    }
    std::vector<float> send(st), recv(rt);
    for (int r = 0; r < size; ++r) {
      for (int64_t k = 0; k < sc[r]; ++k) send[so[r] + k] = 1000.0f * me + r + k;
    }
    comm.AllToAllV(send.data(), sc, so, recv.data(), rc, ro);
    for (int s = 0; s < size; ++s) {
      for (int64_t k = 0; k < rc[s]; ++k) {
        Expect(recv[ro[s] + k] == 1000.0f * s + me + k, "AllToAllV", me, step);
      }
    }

    int64_t payload[2] = {me == step % size ? 7 * step : -1, 3};
    comm.Broadcast(payload, sizeof(payload), step % size);
    Expect(payload[0] == 7 * step, "Broadcast", me, step);
    comm.Barrier();
  }
  if (me == 0) std::printf("mpi_communicator_test: %d ranks, %d failures\n", size, failures);
  return failures == 0 ? 0 : 1;
}
