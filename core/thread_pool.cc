#include "core/thread_pool.h"

#include <immintrin.h>

#include <utility>

#include <fmt/format.h>

#include "core/trace.h"

namespace moeserve {
namespace {

// Iterations a worker polls for new work before it sleeps: long enough to bridge the gap between
// one step's parallel loops, short enough that an idle pool soon stops burning its cores.
constexpr int kSpinIterations = 20000;

}  // namespace

ThreadPool::ThreadPool(size_t num_threads, std::string trace_name, int trace_rank)
    : trace_name_(std::move(trace_name)), trace_rank_(trace_rank) {
  if (num_threads == 0) num_threads = 1;
  workers_.reserve(num_threads - 1);
  for (size_t t = 1; t < num_threads; ++t) {
    workers_.emplace_back([this, t] { WorkerLoop(t); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::DrainTasks(size_t thread) {
  for (;;) {
    const size_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    fn_(ctx_, task, thread);
  }
}

void ThreadPool::Run(size_t num_tasks, TaskFn fn, const void* ctx) {
  trace_job_ = nullptr;
  if (trace::enabled()) {
    trace_job_ = trace::Scope::Current();
    if (trace_job_ == nullptr) trace_job_ = "parallel_for";
  }
  fn_ = fn;
  ctx_ = ctx;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  workers_done_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  DrainTasks(0);
  // The join: wait until every worker has seen this job and finished its share. Spin first (the
  // common case is a wait of microseconds), then yield so that a worker descheduled on an
  // oversubscribed machine gets the core instead of us burning it.
  const size_t n = workers_.size();
  for (int i = 0; workers_done_.load(std::memory_order_acquire) != n; ++i) {
    if (i < kSpinIterations / 4) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  barrier_count_.fetch_add(1, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(size_t thread) {
  uint64_t seen = 0;
  bool lane_named = false;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    // Poll, then poll while yielding (cheap when we own a core, polite when we do not), then
    // sleep until the next job.
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      if (i < kSpinIterations / 4) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = gen;
    if (stop_.load()) return;
    if (const char* job = trace_job_; job != nullptr) {
      if (!lane_named) {
        trace::NameThisThread(trace_rank_, fmt::format("{} worker {}", trace_name_, thread));
        lane_named = true;
      }
      const int64_t begin = MonotonicNanos();
      DrainTasks(thread);
      trace::internal::Record(job, begin, MonotonicNanos(), nullptr, 0);
    } else {
      DrainTasks(thread);
    }
    workers_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

}  // namespace moeserve
