#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace moeserve {
namespace {

TEST(ThreadPoolTest, NumThreads) {
  EXPECT_EQ(ThreadPool(1).num_threads(), 1u);
  EXPECT_EQ(ThreadPool(3).num_threads(), 3u);
  EXPECT_EQ(ThreadPool(0).num_threads(), 1u);  // 0 means "just the caller"
}

TEST(ThreadPoolTest, EveryTaskRunsExactlyOnceWithValidThreadIndex) {
  for (size_t threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    for (size_t tasks : {0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 100, 257, 999, 1000}) {
      // Atomic counters: a task run twice, concurrently, must still be counted twice.
      std::vector<std::atomic<int>> runs(tasks);
      std::atomic<int> bad_thread{0};
      pool.ParallelFor(tasks, [&](size_t task, size_t thread) {
        runs[task].fetch_add(1, std::memory_order_relaxed);
        if (thread >= threads) bad_thread.fetch_add(1, std::memory_order_relaxed);
      });
      for (size_t t = 0; t < tasks; ++t) {
        ASSERT_EQ(runs[t].load(), 1)
            << "task " << t << " of " << tasks << ", " << threads << " threads";
      }
      EXPECT_EQ(bad_thread.load(), 0) << tasks << " tasks, " << threads << " threads";
    }
  }
}

TEST(ThreadPoolTest, EveryTaskCountSweep) {
  // All task counts 0..1000: catches off-by-one claims at any size. Two threads, because a pool
  // with more threads than cores pays a scheduler time slice per join (see below).
  ThreadPool pool(2);
  for (size_t tasks = 0; tasks <= 1000; ++tasks) {
    std::vector<std::atomic<int>> runs(tasks);
    pool.ParallelFor(
        tasks, [&](size_t task, size_t) { runs[task].fetch_add(1, std::memory_order_relaxed); });
    for (size_t t = 0; t < tasks; ++t) {
      ASSERT_EQ(runs[t].load(), 1) << "task " << t << " of " << tasks;
    }
  }
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInlineOnCaller) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<size_t> order;
  pool.ParallelFor(5, [&](size_t task, size_t thread) {
    EXPECT_EQ(thread, 0u);
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(task);
  });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(ThreadPoolTest, CallerTakesPartAsThreadZero) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> wrong{0};
  for (int rep = 0; rep < 100; ++rep) {
    pool.ParallelFor(16, [&](size_t, size_t thread) {
      if ((thread == 0) != (std::this_thread::get_id() == caller)) wrong.fetch_add(1);
    });
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPoolTest, BarrierCountOnePerMultiThreadedLoop) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.barrier_count(), 0u);
  pool.ParallelFor(10, [](size_t, size_t) {});
  EXPECT_EQ(pool.barrier_count(), 1u);
  pool.ParallelFor(2, [](size_t, size_t) {});
  EXPECT_EQ(pool.barrier_count(), 2u);
  // Nothing to join: zero tasks, or one task run inline by the caller.
  pool.ParallelFor(0, [](size_t, size_t) {});
  pool.ParallelFor(1, [](size_t, size_t) {});
  EXPECT_EQ(pool.barrier_count(), 2u);
  for (int i = 0; i < 50; ++i) pool.ParallelFor(100, [](size_t, size_t) {});
  EXPECT_EQ(pool.barrier_count(), 52u);
}

TEST(ThreadPoolTest, SingleThreadPoolHasNoBarriers) {
  ThreadPool pool(1);
  for (size_t tasks : {0, 1, 2, 100}) pool.ParallelFor(tasks, [](size_t, size_t) {});
  EXPECT_EQ(pool.barrier_count(), 0u);
}

// Runs `loops` back-to-back ParallelFor calls of `threads` tasks on a fresh pool and checks that
// every task ran and every join was counted.
void RunBackToBackLoops(size_t threads, int loops) {
  ThreadPool pool(threads);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < loops; ++i) {
    pool.ParallelFor(threads, [&](size_t task, size_t) {
      sum.fetch_add(static_cast<int64_t>(task) + 1, std::memory_order_relaxed);
    });
  }
  EXPECT_EQ(sum.load(), int64_t{loops} * static_cast<int64_t>(threads * (threads + 1) / 2));
  EXPECT_EQ(pool.barrier_count(), static_cast<uint64_t>(loops));
}

TEST(ThreadPoolTest, ManyBackToBackSmallLoops) {
  // Decode-style: thousands of short loops in a row, each a full fork-join.
  RunBackToBackLoops(2, 10000);
}

TEST(ThreadPoolTest, BackToBackLoopsWithMoreThreadsThanCores) {
  // Waiting threads yield after a short spin, so an oversubscribed pool still makes progress;
  // many loops, to expose a lost wake-up.
  RunBackToBackLoops(4, 3000);
  RunBackToBackLoops(3, 3000);
}

TEST(ThreadPoolTest, WakesWorkersThatWentToSleep) {
  // Pauses longer than the workers' spin phase, so each loop has to wake sleeping workers.
  ThreadPool pool(3);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<std::atomic<int>> runs(9);
    pool.ParallelFor(runs.size(), [&](size_t task, size_t) { runs[task].fetch_add(1); });
    for (size_t t = 0; t < runs.size(); ++t) ASSERT_EQ(runs[t].load(), 1) << i << " " << t;
  }
}

TEST(ThreadPoolTest, ResultsVisibleAfterReturn) {
  // Plain (non-atomic) writes from every thread must be visible to the caller once ParallelFor
  // returns: the join must order them before the return (release by workers, acquire by caller).
  ThreadPool pool(4);
  constexpr size_t kTasks = 64;
  constexpr size_t kPerTask = 256;
  std::vector<int64_t> out(kTasks * kPerTask);
  for (int64_t round = 1; round <= 200; ++round) {
    pool.ParallelFor(kTasks, [&](size_t task, size_t) {
      for (size_t i = 0; i < kPerTask; ++i) {
        out[task * kPerTask + i] = round * 1000000 + static_cast<int64_t>(task * kPerTask + i);
      }
    });
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], round * 1000000 + static_cast<int64_t>(i)) << "round " << round;
    }
  }
}

TEST(ThreadPoolTest, InputsWrittenBeforeLoopAreVisibleToWorkers) {
  // The other direction: what the caller wrote before ParallelFor is seen by every worker.
  ThreadPool pool(4);
  std::vector<int64_t> in(1000);
  std::vector<int64_t> out(1000);
  for (int64_t round = 0; round < 200; ++round) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = round + static_cast<int64_t>(i);
    pool.ParallelFor(in.size(), [&](size_t task, size_t) { out[task] = in[task] * 2; });
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], 2 * in[i]) << round;
  }
}

TEST(ThreadPoolTest, DestructionWhileIdle) {
  for (size_t threads = 1; threads <= 4; ++threads) {
    // Never used.
    { ThreadPool pool(threads); }
    // Used, then destroyed right away and after the workers have gone to sleep.
    {
      ThreadPool pool(threads);
      pool.ParallelFor(8, [](size_t, size_t) {});
    }
    {
      ThreadPool pool(threads);
      pool.ParallelFor(8, [](size_t, size_t) {});
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

TEST(ThreadPoolTest, ManyPoolsCreatedAndDestroyed) {
  for (int i = 0; i < 200; ++i) {
    auto pool = std::make_unique<ThreadPool>(2 + i % 3);
    std::atomic<int> n{0};
    pool->ParallelFor(5, [&](size_t, size_t) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 5);
  }
}

}  // namespace
}  // namespace moeserve
