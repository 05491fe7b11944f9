// Trace recording for --trace FILE: Chrome trace JSON (Perfetto, chrome://tracing) of engine
// steps, the layers' ops and every thread's share of each parallel loop, per rank.
//
// Off, a Scope costs one relaxed atomic load. On, each thread appends complete events
// (begin, end, a name that is a string literal, one optional integer argument) to its own
// buffer -- no lock, no formatting while recording; Finish() writes them all at exit. A thread's
// lane is (pid = its rank, tid = the order threads first recorded in), named by NameThisThread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/timer.h"

namespace moeserve::trace {

namespace internal {
extern std::atomic<bool> g_enabled;
void Record(const char* name, int64_t begin_ns, int64_t end_ns, const char* arg_name, int64_t arg);
}  // namespace internal

inline bool enabled() { return internal::g_enabled.load(std::memory_order_relaxed); }

// Starts recording; Finish() writes the events to `path` (under MPI, rank r > 0 of the
// process group writes `path` with ".rank<r>" appended: see SetProcessRank).
void Start(const std::string& path);
// This process's rank under MPI (local ranks are threads: each names its lanes instead).
void SetProcessRank(int rank);
// Names the calling thread's lane ("rank 0 engine", "rank 1 worker 2"), in rank `rank`'s
// group; recording on or off (threads that outlive a Start name themselves when they begin).
void NameThisThread(int rank, const std::string& name);
// Stops recording and writes the file, if Start was called: {"traceEvents": [...]}, times in
// microseconds. Events past the cap per thread (kMaxEventsPerThread) are dropped and counted in
// the file's metadata. An error names the file.
Status Finish();
inline constexpr int64_t kMaxEventsPerThread = int64_t{1} << 21;

// Records [construction, destruction) on this thread as one event named `name` (a string
// literal: only the pointer is kept), with an optional integer argument ("tokens", 12).
class Scope {
 public:
  explicit Scope(const char* name, const char* arg_name = nullptr, int64_t arg = 0)
      : name_(enabled() ? name : nullptr),
        arg_name_(arg_name),
        arg_(arg),
        begin_(name_ != nullptr ? MonotonicNanos() : 0) {
    if (name_ != nullptr) Push(name_);
  }
  ~Scope() {
    if (name_ != nullptr) {
      Pop();
      internal::Record(name_, begin_, MonotonicNanos(), arg_name_, arg_);
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  // The innermost open Scope's name on this thread (null when none): what a thread pool names
  // its workers' share of a loop started under it.
  static const char* Current();

 private:
  static void Push(const char* name);
  static void Pop();
  const char* name_;
  const char* arg_name_;
  int64_t arg_;
  int64_t begin_;
};

}  // namespace moeserve::trace
