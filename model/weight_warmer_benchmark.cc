// What case study #12 buys a rank: the matmul after a wait, with the wait spent idle or spent
// prefetching the matmul's weights (WeightWarmer). Run: build/release/model/weight_warmer_benchmark
// (MOESERVE_ISA=avx2 for the AVX2 kernels).
//
// Each iteration waits `wait_us` (as a rank waits for the link or a slower peer), then multiplies
// one token by a cold copy of W (bf16 [1024, 2048], 4 MiB: copies far exceed the last-level
// cache) on one thread. Only the matmul is timed:
//   matmul_us     its time after the wait
//   warmed_MB     what the warmer prefetched during the wait (0: idle)
//   weight_GB/s   W's bytes / the matmul's time
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/benchmark_main.h"
#include "kernels/matmul.h"
#include "model/weight_warmer.h"

namespace moeserve::model {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kN = 1024, kK = 2048;
constexpr size_t kCopies = 64;  // 256 MiB

// Args: wait_us, warm (0: idle during the wait, 1: WeightWarmer steps).
void BM_MatMulAfterWait(benchmark::State& state) {
  const auto wait = std::chrono::microseconds(state.range(0));
  const bool warm = state.range(1) != 0;
  std::vector<OwnedTensor> copies;
  for (size_t c = 0; c < kCopies; ++c) {
    copies.emplace_back(DType::kBF16, std::initializer_list<int64_t>{kN, kK});
    auto* w = static_cast<uint16_t*>(copies.back().view().data());
    for (int64_t i = 0; i < kN * kK; ++i) w[i] = F32ToBF16(static_cast<float>(i % 7) * 0.01f);
  }
  std::vector<float> x(kK, 0.5f), y(kN);
  ThreadPool pool(1);
  WeightWarmer warmer;
  size_t c = 0;
  double warmed_bytes = 0;
  for (auto _ : state) {
    const Tensor& W = copies[c].view();
    c = (c + 1) % kCopies;
    const Clock::time_point until = Clock::now() + wait;
    if (warm) {
      warmer.Clear();
      warmer.Add(W, pool.num_threads());
      const uint64_t before = warmer.warmed_bytes();
      while (Clock::now() < until && warmer.Step()) {
      }
      warmed_bytes += static_cast<double>(warmer.warmed_bytes() - before);
    }
    while (Clock::now() < until) {
    }
    const Clock::time_point start = Clock::now();
    kernels::MatMul(x.data(), kK, 1, W, y.data(), kN, pool);
    benchmark::DoNotOptimize(y.data());
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
  const double calls = static_cast<double>(state.iterations());
  state.counters["warmed_MB"] = warmed_bytes / calls * 1e-6;
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(kN * kK * 2) * calls * 1e-9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatMulAfterWait)
    ->ArgNames({"wait_us", "warm"})
    ->ArgsProduct({{20, 50, 100, 200}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moeserve::model

int main(int argc, char** argv) {
  return moeserve::kernels::BenchmarkMainWithIsa(argc, argv, "weight_warmer_benchmark");
}

