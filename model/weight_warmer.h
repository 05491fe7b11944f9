// Case study #12 on CPU ranks: a rank that waits in a collective -- for its peers, or for the
// link (MPI, --comm-sim) -- pulls the weights it reads next into its caches meanwhile, so the
// matmuls after the collective start on warm lines instead of idle cycles being followed by cold
// DRAM streams. DecoderLayer (model/decoder_layer.cc) sets what to warm: during the mixer
// (attention / GDN) and its reduction, the MoE's router and shared expert (or the dense MLP's
// gate_up); during the MoE and its reduction, the next layer's input projections, after the last
// layer lm_head.
// ForwardOptions::warm_next_weights, off with --no-weight-prefetch. Results never depend on it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace moeserve::model {

class WeightWarmer final : public parallel::IdleWork {
 public:
  // Bytes warmed per set of targets, at most: a rank's share of this machine kind's caches (1 MiB
  // L2 per core, 32 MiB L3 per 8 cores) that the weights read next may take without evicting
  // their own first lines before they are read.
  static constexpr size_t kBudgetBytes = size_t{4} << 20;
  // Bytes per Step: 64 cache lines' prefetches, a fraction of a microsecond at DRAM speed.
  static constexpr size_t kStepBytes = 4096;
  // A matrix is split into at most this many parts (one per pool thread that reads it).
  static constexpr size_t kMaxParts = 8;

  // Forgets the targets (what is already in the caches stays).
  void Clear();
  // Adds W [N, K] as `parts` row ranges -- the pool's threads each read one (kernels::MatMul) --
  // whose first bytes are warmed, with their scales for the packed formats. All ranges added
  // share kBudgetBytes evenly. An empty W (a tensor another rank holds) adds nothing.
  void Add(const Tensor& W, size_t parts);
  // Prefetches the next kStepBytes of the ranges, taking them in turn; false once each range
  // has had its share.
  bool Step() override;

  // Bytes prefetched since construction (bench latency and the tests report it).
  uint64_t warmed_bytes() const { return warmed_bytes_; }

 private:
  struct Range {
    uintptr_t begin = 0;
    size_t bytes = 0;
    size_t done = 0;
  };
  void AddRange(const std::byte* begin, size_t bytes);

  static constexpr size_t kMaxRanges = 4 * 2 * kMaxParts;  // 4 matrices, packed
  std::array<Range, kMaxRanges> ranges_{};
  size_t count_ = 0;
  size_t next_ = 0;      // the range the next Step takes
  size_t finished_ = 0;  // ranges that have had their share
  uint64_t warmed_bytes_ = 0;
};

}  // namespace moeserve::model
