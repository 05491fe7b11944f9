#include "io/safetensors_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "core/check.h"

namespace moeserve::io {
namespace {

// Done's reach around a finished tensor: a read fault maps the cached pages of an aligned window
// around it (64 KiB of 4 KiB pages by default; a 2 MiB folio of a large-folio file system as one
// PMD), so the pages a finished tensor's reads mapped lie within this alignment of its bytes.
constexpr uintptr_t kFaultWindow = uintptr_t{2} << 20;

uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return page;
}
uintptr_t AlignDown(uintptr_t x, uintptr_t a) { return x / a * a; }
uintptr_t AlignUp(uintptr_t x, uintptr_t a) { return (x + a - 1) / a * a; }
uintptr_t Address(const std::byte* p) { return reinterpret_cast<uintptr_t>(p); }

// Drops this process's mapping of [begin, end) (page-aligned); a hint, so errors are ignored.
void Release(uintptr_t begin, uintptr_t end) {
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

SafetensorsPageAdvisor::SafetensorsPageAdvisor(const SafetensorsCheckpoint& checkpoint,
                                               std::span<const SafetensorsTensor* const> reads) {
  const uintptr_t page = PageSize();
  std::unordered_map<const SafetensorsTensor*, int64_t> count;
  for (const SafetensorsTensor* t : reads) ++count[t];
  for (const SafetensorsFile* file : checkpoint.files()) {
    File& f = files_.emplace_back();
    f.map_begin = Address(file->mapping().data());
    f.map_end = AlignUp(f.map_begin + file->mapping().size(), page);
    uintptr_t first_data = f.map_end;  // the header ends where the first tensor's bytes begin
    std::vector<const SafetensorsTensor*> listed;
    for (const SafetensorsTensor& t : file->tensors()) {
      if (t.bytes.empty()) continue;  // no bytes, no pages
      first_data = std::min(first_data, Address(t.bytes.data()));
      if (count.contains(&t)) listed.push_back(&t);
    }
    Release(f.map_begin, AlignDown(first_data, page));
    std::sort(listed.begin(), listed.end(),
              [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
                return a->bytes.data() < b->bytes.data();
              });
    for (const SafetensorsTensor* t : listed) {
      where_.emplace(t, std::pair{files_.size() - 1, f.spans.size()});
      f.spans.push_back(
          {Address(t->bytes.data()), Address(t->bytes.data()) + t->bytes.size(), count[t]});
      count.erase(t);
    }
  }
  for (const auto& [t, n] : count) {
    CHECK(t->bytes.empty()) << "tensor " << t->name << " is not of this checkpoint";
  }
}

void SafetensorsPageAdvisor::WillNeed(const SafetensorsTensor& t) const {
  if (t.bytes.empty()) return;
  const uintptr_t page = PageSize();
  const uintptr_t begin = AlignDown(Address(t.bytes.data()), page);
  const uintptr_t end = AlignUp(Address(t.bytes.data()) + t.bytes.size(), page);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // a hint
}

void SafetensorsPageAdvisor::Done(const SafetensorsTensor& t) {
  const auto it = where_.find(&t);
  if (it == where_.end()) {
    CHECK(t.bytes.empty()) << "tensor " << t.name << " was not listed as read";
    return;
  }
  const auto [file, index] = it->second;
  File& f = files_[file];
  Span& s = f.spans[index];
  CHECK_GT(s.reads, 0) << "tensor " << t.name << " is done more often than it was listed";
  if (--s.reads > 0) return;
  // The window around t, short of the nearest tensors on either side still to be read (the
  // spans do not overlap, so in address order their ends ascend too).
  const uintptr_t page = PageSize();
  uintptr_t lo = std::max(AlignDown(s.begin, kFaultWindow), f.map_begin);
  uintptr_t hi = std::min(AlignUp(s.end, kFaultWindow), f.map_end);
  for (size_t j = index; j-- > 0 && f.spans[j].end > lo;) {
    if (f.spans[j].reads > 0) {
      lo = AlignUp(f.spans[j].end, page);
      break;
    }
  }
  for (size_t j = index + 1; j < f.spans.size() && f.spans[j].begin < hi; ++j) {
    if (f.spans[j].reads > 0) {
      hi = AlignDown(f.spans[j].begin, page);
      break;
    }
  }
  Release(lo, hi);
}

}  // namespace moeserve::io
