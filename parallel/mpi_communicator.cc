#include "parallel/mpi_communicator.h"

#if MOESERVE_HAVE_MPI

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"

namespace moeserve::parallel {
namespace {

int ToInt(int64_t n) {
  CHECK(n >= 0 && n <= std::numeric_limits<int>::max()) << "MPI count " << n << " out of range";
  return static_cast<int>(n);
}

void Check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  // A failed collective leaves the ranks out of step: nothing sensible can follow.
  CHECK(false) << what << " failed: " << std::string(text, len);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    counts_.resize(size_);
    displs_.resize(size_);
    counts2_.resize(size_);
    displs2_.resize(size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(float* data, int64_t n) override {
    if (size_ == 1) return;
    // Slices as the local communicator cuts them: rank r owns [n r / p, n (r + 1) / p).
    const int64_t begin = n * rank_ / size_, mine = n * (rank_ + 1) / size_ - begin;
    if (static_cast<int64_t>(gathered_.size()) < mine * size_) gathered_.resize(mine * size_);
    for (int s = 0; s < size_; ++s) {
      const int64_t b = n * s / size_;
      counts_[s] = ToInt(n * (s + 1) / size_ - b);  // my slice s goes to rank s
      displs_[s] = ToInt(b);
      counts2_[s] = ToInt(mine);  // rank s's copy of my slice
      displs2_[s] = ToInt(mine * s);
    }
    MPI_Request request;
    Check(MPI_Ialltoallv(data, counts_.data(), displs_.data(), MPI_FLOAT, gathered_.data(),
                         counts2_.data(), displs2_.data(), MPI_FLOAT, MPI_COMM_WORLD, &request),
          "MPI_Ialltoallv");
    Complete(request, "MPI_Ialltoallv");
    float* slice = gathered_.data();  // rank 0's copy, then the others added in rank order
    for (int s = 1; s < size_; ++s) {
      const float* src = gathered_.data() + mine * s;
      for (int64_t i = 0; i < mine; ++i) slice[i] += src[i];
    }
    // Every rank's reduced slice back into data (counts_ / displs_ are the slices).
    Check(MPI_Iallgatherv(slice, ToInt(mine), MPI_FLOAT, data, counts_.data(), displs_.data(),
                          MPI_FLOAT, MPI_COMM_WORLD, &request),
          "MPI_Iallgatherv");
    Complete(request, "MPI_Iallgatherv");
  }

  void AllGather(const float* in, int64_t n, float* out) override {
    MPI_Request request;
    Check(MPI_Iallgather(in, ToInt(n), MPI_FLOAT, out, ToInt(n), MPI_FLOAT, MPI_COMM_WORLD,
                         &request),
          "MPI_Iallgather");
    Complete(request, "MPI_Iallgather");
  }

  void ReduceScatterSum(const float* in, int64_t n, float* out) override {
    // Rank r receives every rank's slice r, then adds them in rank order.
    if (static_cast<int64_t>(gathered_.size()) < n * size_) gathered_.resize(n * size_);
    Check(MPI_Alltoall(in, ToInt(n), MPI_FLOAT, gathered_.data(), ToInt(n), MPI_FLOAT,
                       MPI_COMM_WORLD),
          "MPI_Alltoall");
    CopyFloats(out, gathered_.data(), n);
    for (int s = 1; s < size_; ++s) {
      const float* src = gathered_.data() + n * s;
      for (int64_t i = 0; i < n; ++i) out[i] += src[i];
    }
  }

  void AllToAllV(const float* send, std::span<const int64_t> send_counts,
                 std::span<const int64_t> send_offsets, float* recv,
                 std::span<const int64_t> recv_counts,
                 std::span<const int64_t> recv_offsets) override {
    for (int s = 0; s < size_; ++s) {
      counts_[s] = ToInt(send_counts[s]);
      displs_[s] = ToInt(send_offsets[s]);
      counts2_[s] = ToInt(recv_counts[s]);
      displs2_[s] = ToInt(recv_offsets[s]);
    }
    Check(MPI_Alltoallv(send, counts_.data(), displs_.data(), MPI_FLOAT, recv, counts2_.data(),
                        displs2_.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Alltoallv");
  }

  void StartAllToAllV(const float* send, std::span<const int64_t> send_counts,
                      std::span<const int64_t> send_offsets, float* recv,
                      std::span<const int64_t> recv_counts,
                      std::span<const int64_t> recv_offsets) override {
    // Point to point, so each peer's part completes on its own (MPI_Ialltoallv completes whole).
    recv_requests_.assign(size_, MPI_REQUEST_NULL);
    send_requests_.assign(size_, MPI_REQUEST_NULL);
    for (int s = 0; s < size_; ++s) {
      if (s == rank_) continue;
      if (recv_counts[s] > 0) {
        Check(MPI_Irecv(recv + recv_offsets[s], ToInt(recv_counts[s]), MPI_FLOAT, s, kExchangeTag,
                        MPI_COMM_WORLD, &recv_requests_[s]),
              "MPI_Irecv");
      }
      if (send_counts[s] > 0) {
        Check(MPI_Isend(send + send_offsets[s], ToInt(send_counts[s]), MPI_FLOAT, s, kExchangeTag,
                        MPI_COMM_WORLD, &send_requests_[s]),
              "MPI_Isend");
      }
    }
    CHECK_EQ(send_counts[rank_], recv_counts[rank_]) << "a rank sends itself what it does not expect";
    CopyFloats(recv + recv_offsets[rank_], send + send_offsets[rank_], recv_counts[rank_]);
  }

  void WaitFrom(int s) override {
    Complete(recv_requests_[s], "MPI_Wait");
  }

  void FinishAllToAllV() override {
    Check(MPI_Waitall(size_, recv_requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    Check(MPI_Waitall(size_, send_requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    // In chunks that fit an int count.
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes;) {
      const size_t chunk = std::min<size_t>(bytes - done, std::numeric_limits<int>::max());
      Check(MPI_Bcast(p + done, static_cast<int>(chunk), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
      done += chunk;
    }
  }

  void Barrier() override { Check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  // Waits for `request`, doing the rank's idle work while it is in flight.
  void Complete(MPI_Request& request, const char* what) {
    IdleWork* idle = idle_work();
    int done = 0;
    Check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    while (!done && idle != nullptr && idle->Step()) {
      Check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    }
    if (!done) Check(MPI_Wait(&request, MPI_STATUS_IGNORE), what);
  }

  int rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_, counts2_, displs2_;
  std::vector<float> gathered_;
  std::vector<MPI_Request> recv_requests_, send_requests_;  // the exchange in flight
  static constexpr int kExchangeTag = 17;
};

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool MpiAvailable() { return true; }

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Rank 0's engine, server and thread pool use MPI from one thread at a time.
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return Unavailable("MPI_Init_thread failed: is this process started by mpirun?");
    }
    std::atexit(FinalizeAtExit);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator());
}

}  // namespace moeserve::parallel

#else  // !MOESERVE_HAVE_MPI

namespace moeserve::parallel {

bool MpiAvailable() { return false; }

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator() {
  return Unimplemented("--comm mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
}

}  // namespace moeserve::parallel

#endif
