// ThreadPool: a fixed set of threads for fork-join parallel loops, with every join counted.
//
// The calling thread takes part as thread 0, so ThreadPool(1) runs everything inline with no
// synchronization. Workers spin briefly before sleeping, because decode steps issue many short
// loops back to back. Each ParallelFor ends in exactly one barrier (the join), and the pool
// counts them so the engine can report barriers per step (docs/design.md principle 3). Under
// --trace each worker records its share of every loop as an event named after the caller's trace
// scope.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // trace_name / trace_rank: how --trace names the workers' lanes ("rank 0 worker 1").
  explicit ThreadPool(size_t num_threads, std::string trace_name = "pool", int trace_rank = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return workers_.size() + 1; }
  // Joins so far: one per ParallelFor with more than one thread taking part.
  uint64_t barrier_count() const { return barrier_count_.load(std::memory_order_relaxed); }

  // Calls fn(task, thread) for task in [0, num_tasks), spread over the threads; returns when all
  // calls have returned. thread is in [0, num_threads()). Not reentrant: call from one thread.
  template <typename Fn>
  void ParallelFor(size_t num_tasks, const Fn& fn) {
    if (num_tasks == 0) return;
    if (workers_.empty() || num_tasks == 1) {
      for (size_t t = 0; t < num_tasks; ++t) fn(t, size_t{0});
      return;
    }
    Run(num_tasks, &Trampoline<Fn>, &fn);
  }

 private:
  using TaskFn = void (*)(const void* ctx, size_t task, size_t thread);
  template <typename Fn>
  static void Trampoline(const void* ctx, size_t task, size_t thread) {
    (*static_cast<const Fn*>(ctx))(task, thread);
  }

  void Run(size_t num_tasks, TaskFn fn, const void* ctx);
  void WorkerLoop(size_t thread);
  void DrainTasks(size_t thread);

  std::vector<std::thread> workers_;
  // Current job; written by the caller before `generation_` is bumped.
  TaskFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_task_{0};
  std::atomic<size_t> workers_done_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> barrier_count_{0};
  // --trace: the current job's name (the caller's innermost trace::Scope), null when not
  // tracing; written with the job, before `generation_` is bumped.
  const char* trace_job_ = nullptr;
  const std::string trace_name_;
  const int trace_rank_;
};

}  // namespace moeserve
