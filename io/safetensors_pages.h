// A loader's one pass over a mapped checkpoint, told to the kernel: read the tensors just ahead
// (WillNeed: the reads of a cold checkpoint overlap the loader's work) and let go of the pages
// behind (Done: the mapping stops holding what the loader has finished with, so resident memory
// does not grow with the checkpoint -- a 61 GB checkpoint loads on a 24 GiB machine).
//
// Done drops this process's mappings of the pages (madvise MADV_DONTNEED on the read-only private
// mapping); it does not drop the page cache (posix_fadvise POSIX_FADV_DONTNEED would): other
// ranks' mappings and the next run still find the checkpoint cached, and clean unmapped page
// cache is what the kernel reclaims first. A released page that is read again is read back from
// the file: releasing too early costs time, never correctness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "io/safetensors.h"

namespace moeserve::io {

class SafetensorsPageAdvisor {
 public:
  // `reads`: every tensor of `checkpoint` the caller will read, once per pass over it (a tensor
  // read twice is listed twice); tensors not listed are never read. Drops the mappings of the
  // files' headers (parsed at Open). The checkpoint must outlive the advisor.
  SafetensorsPageAdvisor(const SafetensorsCheckpoint& checkpoint,
                         std::span<const SafetensorsTensor* const> reads);

  // Asks the kernel to read t's pages into the page cache, without waiting for them.
  void WillNeed(const SafetensorsTensor& t) const;
  // One listed read of t is over. After the last, drops the mappings of every page that no
  // tensor still to be read shares: t's own and its neighbours' already read (which faulting t
  // in may have mapped again: the kernel maps the cached pages around a fault).
  void Done(const SafetensorsTensor& t);

 private:
  struct Span {  // one listed tensor, in address order within its file
    uintptr_t begin, end;
    int64_t reads;  // listed reads not yet Done
  };
  struct File {
    uintptr_t map_begin, map_end;
    std::vector<Span> spans;
  };
  std::vector<File> files_;
  // Tensor -> (file, span) of its listed bytes.
  std::unordered_map<const SafetensorsTensor*, std::pair<size_t, size_t>> where_;
};

}  // namespace moeserve::io
