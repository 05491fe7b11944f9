#include "parallel/local_communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moeserve::parallel {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Slice r of n elements split over `size` ranks: [begin, end).
inline int64_t SliceBegin(int64_t n, int size, int r) { return n * r / size; }

}  // namespace

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }

  void AllReduceSum(float* data, int64_t n) override {
    const int size = group_.size_;
    const int64_t begin = SliceBegin(n, size, rank_), end = SliceBegin(n, size, rank_ + 1);
    LocalGroup::Published& mine = Mine();
    mine.in = data;
    const std::vector<LocalGroup::Published>& all = Begin();
    // After A no rank reads the scratch of the last collective: it may move. The others read
    // `out` only after B.
    if (static_cast<int64_t>(scratch_.size()) < end - begin) scratch_.resize(end - begin);
    mine.out = scratch_.data();
    // This rank's slice, summed over the ranks in rank order.
    float* slice = scratch_.data();
    CopyFloats(slice, all[0].in + begin, end - begin);
    for (int s = 1; s < size; ++s) {
      const float* src = all[s].in + begin;
      for (int64_t i = 0; i < end - begin; ++i) slice[i] += src[i];
    }
    // B: every slice reduced; no one reads `data` any more
    group_.Wait(sense_, idle_work());
    for (int s = 0; s < size; ++s) {
      const int64_t b = SliceBegin(n, size, s), e = SliceBegin(n, size, s + 1);
      CopyFloats(data + b, all[s].out, e - b);
    }
    // The owners' scratch is rewritten only after the next collective's barrier A, which every
    // rank reaches after this copy.
  }

  void AllReduceRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override {
    const int size = group_.size_;
    Mine().in = data;
    const std::vector<LocalGroup::Published>& all = Begin();
    // Every rank sums every row itself (the rows are short: what a step's tokens carry), so no
    // reduced slice is exchanged and the consumer gets each row while it is in cache.
    if (static_cast<int64_t>(scratch_.size()) < cols) scratch_.resize(cols);
    float* row = scratch_.data();
    for (int64_t r = 0; r < rows; ++r) {
      CopyFloats(row, all[0].in + r * cols, cols);
      for (int s = 1; s < size; ++s) {
        const float* src = all[s].in + r * cols;
        for (int64_t i = 0; i < cols; ++i) row[i] += src[i];
      }
      visit(r, row);
    }
    group_.Wait(sense_, idle_work());  // B: no one reads `data` any more
  }

  void AllGatherRows(float* data, int64_t rows, int64_t cols, RowVisitor visit) override {
    const int size = group_.size_;
    Mine().in = data;
    const std::vector<LocalGroup::Published>& all = Begin();
    // Each row straight from its owner's buffer.
    for (int s = 0; s < size; ++s) {
      for (int64_t r = rows * s / size; r < rows * (s + 1) / size; ++r) {
        visit(r, all[s].in + r * cols);
      }
    }
    group_.Wait(sense_, idle_work());  // B: no one reads `data` any more
  }

  void AllGather(const float* in, int64_t n, float* out) override {
    Mine().in = in;
    const std::vector<LocalGroup::Published>& all = Begin();
    for (int s = 0; s < group_.size_; ++s) {
      CopyFloats(out + s * n, all[s].in, n);
    }
    group_.Wait(sense_, idle_work());  // B: inputs may be reused
  }

  void ReduceScatterSum(const float* in, int64_t n, float* out) override {
    Mine().in = in;
    const std::vector<LocalGroup::Published>& all = Begin();
    const int64_t begin = rank_ * n;
    CopyFloats(out, all[0].in + begin, n);
    for (int s = 1; s < group_.size_; ++s) {
      const float* src = all[s].in + begin;
      for (int64_t i = 0; i < n; ++i) out[i] += src[i];
    }
    group_.Wait(sense_, idle_work());
  }

  void AllToAllV(const float* send, std::span<const int64_t> send_counts,
                 std::span<const int64_t> send_offsets, float* recv,
                 std::span<const int64_t> recv_counts,
                 std::span<const int64_t> recv_offsets) override {
    StartAllToAllV(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
    FinishAllToAllV();  // every part copied, then barrier B
  }

  void StartAllToAllV(const float* send, std::span<const int64_t> send_counts,
                      std::span<const int64_t> send_offsets, float* recv,
                      std::span<const int64_t> recv_counts,
                      std::span<const int64_t> recv_offsets) override {
    const int size = group_.size_;
    CHECK(static_cast<int>(send_counts.size()) == size && static_cast<int>(send_offsets.size()) == size &&
          static_cast<int>(recv_counts.size()) == size && static_cast<int>(recv_offsets.size()) == size);
    LocalGroup::Published& mine = Mine();
    mine.in = send;
    mine.counts = send_counts.data();
    mine.offsets = send_offsets.data();
    // Everyone's send buffer is readable after A; each part is copied when waited for.
    exchange_ = &Begin();
    exchange_recv_ = recv;
    exchange_counts_ = recv_counts;
    exchange_offsets_ = recv_offsets;
    exchange_done_.assign(size, false);
  }

  void WaitFrom(int s) override {
    CHECK(exchange_ != nullptr) << "WaitFrom without StartAllToAllV";
    if (exchange_done_[s]) return;
    const std::vector<LocalGroup::Published>& all = *exchange_;
    CHECK_EQ(all[s].counts[rank_], exchange_counts_[s])
        << "rank " << s << " sends rank " << rank_ << " what it does not expect";
    CopyFloats(exchange_recv_ + exchange_offsets_[s], all[s].in + all[s].offsets[rank_],
               exchange_counts_[s]);
    exchange_done_[s] = true;
  }

  void FinishAllToAllV() override {
    for (int s = 0; s < group_.size_; ++s) WaitFrom(s);
    exchange_ = nullptr;
    // B: every part read; send buffers may be reused
    group_.Wait(sense_, idle_work());
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    CHECK(root >= 0 && root < group_.size_) << "root " << root;
    Mine().bytes = data;
    const std::vector<LocalGroup::Published>& all = Begin();
    if (rank_ != root && bytes > 0) std::memcpy(data, all[root].bytes, bytes);
    group_.Wait(sense_, idle_work());
  }

  void Barrier() override { group_.Wait(sense_, idle_work()); }

 private:
  // The entry this rank publishes in for the coming collective.
  LocalGroup::Published& Mine() { return group_.published_[parity_][rank_]; }
  // Barrier A: everyone has published; returns the entries of this collective and flips the
  // parity for the next.
  const std::vector<LocalGroup::Published>& Begin() {
    group_.Wait(sense_, idle_work());
    const std::vector<LocalGroup::Published>& all = group_.published_[parity_];
    parity_ ^= 1;
    return all;
  }

  LocalGroup& group_;
  const int rank_;
  bool sense_ = false;
  int parity_ = 0;
  std::vector<float> scratch_;  // this rank's reduced slice
  // The exchange between StartAllToAllV and FinishAllToAllV.
  const std::vector<LocalGroup::Published>* exchange_ = nullptr;
  float* exchange_recv_ = nullptr;
  std::span<const int64_t> exchange_counts_, exchange_offsets_;
  std::vector<bool> exchange_done_;
};

LocalGroup::LocalGroup(int size) : size_(size) {
  CHECK_GE(size, 1);
  published_[0].resize(size);
  published_[1].resize(size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<LocalCommunicator>(*this, r));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::rank(int r) {
  CHECK(r >= 0 && r < size_) << "rank " << r << " of " << size_;
  return *ranks_[r];
}

void LocalGroup::Wait(bool& sense, IdleWork* idle) {
  sense = !sense;
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    sense_.store(sense, std::memory_order_release);
    return;
  }
  // The rank's idle work first, a step at a time, while the others are on their way.
  while (idle != nullptr && sense_.load(std::memory_order_acquire) != sense && idle->Step()) {
  }
  // Spin while the others are about to arrive (a collective's work between barriers is short),
  // then give the core away: with more ranks than cores the last one needs it.
  for (int spins = 0; sense_.load(std::memory_order_acquire) != sense; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      sched_yield();
    }
  }
}

}  // namespace moeserve::parallel
