// Read throughput of ReadSum (SIMD, dynamic dispatch) against its scalar twin, from L1-resident
// to DRAM-sized buffers. Run: build/release/kernels/memory_bandwidth_benchmark (MOESERVE_ISA=avx2
// for the AVX2 read)
#include <benchmark/benchmark.h>

#include "core/tensor.h"
#include "kernels/benchmark_main.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/ref/memory_bandwidth_ref.h"

namespace moeserve::kernels {
namespace {

template <float (*Sum)(const float*, size_t)>
void BM_ReadSum(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(float);
  TensorStorage buffer(n * sizeof(float));
  float* x = reinterpret_cast<float*>(buffer.data());
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7);
  for (auto _ : state) benchmark::DoNotOptimize(Sum(x, n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// 32 KiB (L1), 1 MiB (L2), 16 MiB (L3), 256 MiB (DRAM).
BENCHMARK(BM_ReadSum<ReadSum>)->Arg(32 << 10)->Arg(1 << 20)->Arg(16 << 20)->Arg(256 << 20);
BENCHMARK(BM_ReadSum<ref::ReadSum>)->Arg(32 << 10)->Arg(1 << 20)->Arg(16 << 20)->Arg(256 << 20);

void BM_MeasureReadBandwidth(benchmark::State& state) {
  ThreadPool pool(static_cast<size_t>(state.range(0)));
  double best = 0.0;
  for (auto _ : state) best = std::max(best, MeasureReadBandwidth(pool, size_t{512} << 20, 3).gb_per_s);
  state.counters["GB/s"] = best;
}
BENCHMARK(BM_MeasureReadBandwidth)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moeserve::kernels

// MOESERVE_ISA=avx2 (etc.) times that target's SIMD read.
int main(int argc, char** argv) {
  return moeserve::kernels::BenchmarkMainWithIsa(argc, argv, "memory_bandwidth_benchmark");
}
