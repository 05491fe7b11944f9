// Communicator: how ranks exchange data. Layers call it wherever tensor or expert parallelism
// reduces or exchanges (after o_proj / out_proj / down_proj, around MoE dispatch and combine,
// lm_head); with one rank every call is a no-op that costs nothing.
//
// Every collective is called by all ranks of the group in the same order (as MPI's). Results
// are identical on every rank, bit for bit: reductions add the ranks' values in rank order
// (0, 1, ..., size - 1), whatever the implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace moeserve::parallel {

// A callable (row index, row of floats) passed without allocation; the callee it wraps must
// outlive the call it is passed to.
class RowVisitor {
 public:
  template <typename F>
  RowVisitor(F& f)  // NOLINT: implicit, as a lambda is passed
      : context_(&f), call_([](void* c, int64_t row, const float* values) {
          (*static_cast<F*>(c))(row, values);
        }) {}
  void operator()(int64_t row, const float* values) const { call_(context_, row, values); }

 private:
  void* context_;
  void (*call_)(void*, int64_t, const float*);
};

// Work a rank does in small steps while it waits in a collective -- for its peers to arrive or
// for the link -- instead of idling (case study #12: the next weights pulled into the cache).
class IdleWork {
 public:
  virtual ~IdleWork() = default;
  // Does one short step (a few microseconds at most); false once nothing is left to do.
  virtual bool Step() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // What this rank does while its collectives wait, until set again (null: nothing). The caller
  // keeps `work` alive while it is set. Results never depend on it.
  virtual void set_idle_work(IdleWork* work) { idle_work_ = work; }

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, n) = sum over ranks of each rank's data[0, n).
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[0, n); out holds size() * n floats.
  virtual void AllGather(const float* in, int64_t n, float* out) = 0;
  // out[0, n) = sum over ranks of their in[rank() * n, (rank() + 1) * n); in holds size() * n
  // floats: each rank gets the reduced slice with its own index.
  virtual void ReduceScatterSum(const float* in, int64_t n, float* out) = 0;
  // Each rank sends send_counts[r] floats from send + send_offsets[r] to rank r, and receives
  // recv_counts[s] floats from rank s at recv + recv_offsets[s] (counts in floats; the receiver
  // must expect what the sender sends). Spans hold size() entries.
  virtual void AllToAllV(const float* send, std::span<const int64_t> send_counts,
                         std::span<const int64_t> send_offsets, float* recv,
                         std::span<const int64_t> recv_counts,
                         std::span<const int64_t> recv_offsets) = 0;
  // The rows of data [rows, cols] summed over the ranks (rank order, as AllReduceSum), each
  // reduced row handed to visit(row, values) on every rank -- the reduction fused with what
  // consumes it. Afterwards `data` holds the sum (this default: AllReduceSum, then the visits)
  // or is left as it was (the local communicator, which sums each row straight from the ranks'
  // buffers into a row of scratch and writes no reduced vector back).
  virtual void AllReduceRows(float* data, int64_t rows, int64_t cols, RowVisitor visit);
  // Each rank owns rows [rows r / p, rows (r + 1) / p) of data [rows, cols] (its slice, as
  // AllReduceSum cuts them); every rank gets every row, each handed to visit(row, values) --
  // the all-gather fused with what consumes it. This default: the other rows zeroed, then
  // AllReduceRows.
  virtual void AllGatherRows(float* data, int64_t rows, int64_t cols, RowVisitor visit);
  // An all-to-all whose receives complete peer by peer (MC2's pipeline: compute on what has
  // arrived, or on something else, while the rest is in flight). Start posts it (arguments as
  // AllToAllV's; every array must stay valid and untouched until Finish); WaitFrom(s) returns
  // once rank s's part is in recv; Finish completes the rest, after which the buffers may be
  // reused. All ranks call the three in the same order, as a collective; one exchange at a time.
  // This default moves everything in Start.
  virtual void StartAllToAllV(const float* send, std::span<const int64_t> send_counts,
                              std::span<const int64_t> send_offsets, float* recv,
                              std::span<const int64_t> recv_counts,
                              std::span<const int64_t> recv_offsets) {
    AllToAllV(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  }
  virtual void WaitFrom(int /*peer*/) {}
  virtual void FinishAllToAllV() {}
  // data[0, bytes) of rank `root` to every rank.
  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
  virtual void Barrier() = 0;

 protected:
  // What the implementations' waits do (null: nothing).
  IdleWork* idle_work() const { return idle_work_; }

 private:
  IdleWork* idle_work_ = nullptr;
};

// Copies n floats; n == 0 touches nothing (an empty vector's data() may be null, which memcpy
// must not see). Source and destination may overlap.
void CopyFloats(float* dst, const float* src, int64_t n);

// One rank: every collective is the identity.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, int64_t) override {}
  void AllReduceRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override {
    for (int64_t r = 0; r < rows; ++r) visit(r, data + r * cols);
  }
  void AllGatherRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override {
    AllReduceRows(data, rows, cols, visit);
  }
  void AllGather(const float* in, int64_t n, float* out) override;
  void ReduceScatterSum(const float* in, int64_t n, float* out) override;
  void AllToAllV(const float* send, std::span<const int64_t> send_counts,
                 std::span<const int64_t> send_offsets, float* recv,
                 std::span<const int64_t> recv_counts,
                 std::span<const int64_t> recv_offsets) override;
  void Broadcast(void*, size_t, int) override {}
  void Barrier() override {}
};

}  // namespace moeserve::parallel
