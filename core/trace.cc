#include "core/trace.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

namespace moeserve::trace {

namespace internal {
std::atomic<bool> g_enabled{false};
}  // namespace internal

namespace {

struct Event {
  const char* name;
  const char* arg_name;
  int64_t arg;
  int64_t begin_ns, end_ns;
};

// One thread's events. Owned by the registry (not the thread): a pool's workers may end before
// Finish writes their lanes.
struct Lane {
  int rank = 0;
  int tid = 0;
  std::string name;
  std::vector<Event> events;
  int64_t dropped = 0;
  std::vector<const char*> open;  // the names of this thread's open Scopes, innermost last
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Lane>> lanes;
  std::string path;
  int process_rank = 0;
  int64_t origin_ns = 0;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during exit
  return *r;
}

Lane& ThisLane() {
  thread_local Lane* lane = nullptr;
  if (lane == nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.lanes.push_back(std::make_unique<Lane>());
    lane = r.lanes.back().get();
    lane->tid = static_cast<int>(r.lanes.size());
    lane->rank = r.process_rank;
    lane->name = fmt::format("thread {}", lane->tid);
    lane->events.reserve(4096);
  }
  return *lane;
}

}  // namespace

namespace internal {

void Record(const char* name, int64_t begin_ns, int64_t end_ns, const char* arg_name, int64_t arg) {
  Lane& lane = ThisLane();
  if (static_cast<int64_t>(lane.events.size()) >= kMaxEventsPerThread) {
    ++lane.dropped;
    return;
  }
  lane.events.push_back({name, arg_name, arg, begin_ns, end_ns});
}

}  // namespace internal

void Start(const std::string& path) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.path = path;
    r.origin_ns = MonotonicNanos();
  }
  internal::g_enabled.store(true);
}

void SetProcessRank(int rank) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.process_rank = rank;
}

void NameThisThread(int rank, const std::string& name) {
  Lane& lane = ThisLane();
  std::lock_guard<std::mutex> lock(registry().mu);
  lane.rank = rank;
  lane.name = name;
}

void Scope::Push(const char* name) { ThisLane().open.push_back(name); }
void Scope::Pop() { ThisLane().open.pop_back(); }
const char* Scope::Current() {
  if (!enabled()) return nullptr;
  const Lane& lane = ThisLane();
  return lane.open.empty() ? nullptr : lane.open.back();
}

Status Finish() {
  Registry& r = registry();
  if (!enabled()) return OkStatus();
  internal::g_enabled.store(false);
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string path =
      r.process_rank == 0 ? r.path : fmt::format("{}.rank{}", r.path, r.process_rank);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return IoError("--trace: cannot write {}", path);
  // Written by hand, one event per line: a long serve session records millions of events, and a
  // JSON document of them all in memory would double the trace's footprint.
  int64_t dropped = 0;
  std::fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
  bool first = true;
  const auto line = [&](const std::string& s) {
    std::fputs(first ? "" : ",\n", f);
    std::fputs(s.c_str(), f);
    first = false;
  };
  for (const std::unique_ptr<Lane>& lane : r.lanes) {
    const int pid = lane->rank;
    line(fmt::format(
        R"({{"name": "thread_name", "ph": "M", "pid": {}, "tid": {}, "args": {{"name": {}}}}})",
        pid, lane->tid, nlohmann::json(lane->name).dump()));
    for (const Event& e : lane->events) {
      const std::string args =
          e.arg_name == nullptr ? "" : fmt::format(R"(, "args": {{"{}": {}}})", e.arg_name, e.arg);
      line(fmt::format(
          R"({{"name": "{}", "ph": "X", "pid": {}, "tid": {}, "ts": {:.3f}, "dur": {:.3f}{}}})",
          e.name, pid, lane->tid, (e.begin_ns - r.origin_ns) * 1e-3, (e.end_ns - e.begin_ns) * 1e-3,
          args));
    }
    dropped += lane->dropped;
    lane->events.clear();
  }
  std::fprintf(f, "\n], \"otherData\": {\"dropped_events\": %lld}}\n",
               static_cast<long long>(dropped));
  if (std::fclose(f) != 0) return IoError("--trace: cannot write {}", path);
  return OkStatus();
}

}  // namespace moeserve::trace
