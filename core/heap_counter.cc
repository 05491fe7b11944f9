#include "core/heap_counter.h"

#include <execinfo.h>
#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace moeserve {
namespace {

std::atomic<int64_t> g_allocations{0};
std::atomic<bool> g_trace{false};
std::atomic<int64_t> g_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void CountBytes(void* p) {
  const int64_t bytes = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t now = g_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void* CountedAlloc(std::size_t size, std::size_t alignment) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (g_trace.load(std::memory_order_relaxed)) {
    void* frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  }
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(size == 0 ? 1 : size);
  } else if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0) {
    p = nullptr;
  }
  if (p == nullptr) throw std::bad_alloc();
  CountBytes(p);
  return p;
}

void CountedFree(void* p) {
  if (p == nullptr) return;
  g_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}

}  // namespace

int64_t HeapAllocations() { return g_allocations.load(std::memory_order_relaxed); }

int64_t HeapBytes() { return g_bytes.load(std::memory_order_relaxed); }
int64_t PeakHeapBytes() { return g_peak_bytes.load(std::memory_order_relaxed); }
void ResetPeakHeapBytes() { g_peak_bytes.store(HeapBytes(), std::memory_order_relaxed); }

void TraceHeapAllocations(bool on) {
  g_trace.store(on && std::getenv("MOESERVE_TRACE_ALLOC") != nullptr, std::memory_order_relaxed);
}

}  // namespace moeserve

void* operator new(std::size_t size) { return moeserve::CountedAlloc(size, 0); }
void* operator new[](std::size_t size) { return moeserve::CountedAlloc(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) {
  return moeserve::CountedAlloc(size, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return moeserve::CountedAlloc(size, static_cast<std::size_t>(a));
}
// The nothrow forms too: every allocation must come from malloc, since every delete is free()
// (a sanitizer's own nothrow operator new would otherwise meet our delete).
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return moeserve::CountedAlloc(size, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return moeserve::CountedAlloc(size, static_cast<std::size_t>(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t& tag) noexcept {
  return operator new(size, a, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { moeserve::CountedFree(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { moeserve::CountedFree(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  moeserve::CountedFree(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  moeserve::CountedFree(p);
}
void operator delete(void* p) noexcept { moeserve::CountedFree(p); }
void operator delete[](void* p) noexcept { moeserve::CountedFree(p); }
void operator delete(void* p, std::size_t) noexcept { moeserve::CountedFree(p); }
void operator delete[](void* p, std::size_t) noexcept { moeserve::CountedFree(p); }
void operator delete(void* p, std::align_val_t) noexcept { moeserve::CountedFree(p); }
void operator delete[](void* p, std::align_val_t) noexcept { moeserve::CountedFree(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { moeserve::CountedFree(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  moeserve::CountedFree(p);
}
