// Ranks that are threads of one process (`--comm local`, the default for --tp / --ep): their
// collectives go through shared memory, synchronized by a sense-reversing barrier of atomics
// (no lock, no syscall while ranks keep up; a rank that waits long yields its core, so more
// ranks than cores still make progress).
//
// Each collective is two barriers: every rank publishes its pointers, all meet (A), each reads
// what it needs from the others' buffers straight into its own, all meet again (B) so no one
// reuses a buffer another still reads. AllReduceSum splits the vector into size() slices: rank r
// adds slice r over all ranks -- in rank order -- into its own scratch before B, then copies
// every slice from its owner's scratch after B, so each element is added once and every rank
// holds the same bits. The published pointers alternate between two sets, so a rank that has
// left a collective can publish for the next while a slower one still reads the last.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace moeserve::parallel {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  ~LocalGroup();

  int size() const { return size_; }
  // Rank r's communicator, owned by the group; only rank r's thread may call it.
  Communicator& rank(int r);

 private:
  friend class LocalCommunicator;

  // What a rank publishes for one collective.
  struct alignas(64) Published {
    const float* in = nullptr;   // the rank's input (AllReduce: its data)
    const float* out = nullptr;  // what others read after B (AllReduce: its reduced slice)
    const int64_t* counts = nullptr;
    const int64_t* offsets = nullptr;
    const void* bytes = nullptr;
  };

  // Blocks until all ranks arrived; `sense` is the caller's, flipped each time. Meanwhile does
  // the rank's idle work (may be null) until it has none left.
  void Wait(bool& sense, IdleWork* idle);

  int size_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<bool> sense_{false};
  std::vector<Published> published_[2];  // [parity][rank]
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace moeserve::parallel
