// Heap allocation counting, to prove that a code path allocates nothing (docs/design.md principle
// 3: a steady decode step performs no heap allocation -- counted, not assumed).
//
// The counter works in binaries that link the `moeserve_heap_counter` object library, which
// replaces the global operator new / delete with versions that count every allocation, on every
// thread, and the bytes they hold (to bound what a load holds). Elsewhere these functions are not
// defined (a link error, not a silent zero).
#pragma once

#include <cstdint>

namespace moeserve {

// Heap allocations through operator new since the process started. Setting the environment
// variable MOESERVE_TRACE_ALLOC prints a backtrace of each allocation made while
// TraceHeapAllocations(true) is in effect (resolve with addr2line -f -C -e <binary> <offset>).
int64_t HeapAllocations();
void TraceHeapAllocations(bool on);

// Bytes of the allocations through operator new that are live now (malloc_usable_size of each),
// and the most that were live at once since the last ResetPeakHeapBytes() (or the start).
int64_t HeapBytes();
int64_t PeakHeapBytes();
void ResetPeakHeapBytes();

}  // namespace moeserve
