// MatMul weight-read throughput against the measured read bandwidth (the decode roofline).
// Run: build/release/kernels/matmul_benchmark (--isa avx2, or MOESERVE_ISA=avx2, for the AVX2
// kernels)
//
// Each benchmark cycles through copies of W that together far exceed the last-level cache, so
// every call streams its weights from DRAM as decoding does (each weight is read once per token).
// Counters (GB = 1e9 bytes; the framework's bytes_per_second column is in GiB/s):
//   weight_GB/s       weight bytes read per second (W bytes per call)
//   read_GB/s         kernels::MeasureReadBandwidth on a pool of the same size, measured just
//                     before the benchmark
//   roofline_ratio    weight_GB/s / read_GB/s: 1.0 is the memory roofline
//   GFLOP/s           2 * M * N * K per call (what matters once M is large enough to be
//                     compute-bound)
//   fma_ratio         GFLOP/s / kernels::MeasureFmaPeak on the same pool (BM_MatMulGgml): 1.0 is
//                     the f32 FMA peak, the prefill ceiling
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/benchmark_main.h"
#include "kernels/fma_peak.h"
#include "kernels/matmul.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/quantize.h"

namespace moeserve::kernels {
namespace {

// Copies of W add up to at least this much: eight times the 32 MiB L3 of the project's machine.
constexpr size_t kColdBytes = size_t{256} << 20;

// A GGML block-format row's bytes: deterministic bytes with every f16 field (scales, mins) set
// to a small value (the kernels' speed does not depend on the values).
void FillGgmlRow(DType dtype, std::byte* row, int64_t K, size_t seed) {
  const size_t bytes = StoredRowBytes(dtype, K), block = GgmlBlockBytes(dtype);
  for (size_t i = 0; i < bytes; ++i) {
    row[i] = static_cast<std::byte>(((i + seed) * 2654435761u) >> 24);
  }
  const uint16_t small = F32ToF16(0.01f);
  for (size_t b = 0; b < bytes / block; ++b) {
    std::byte* at = row + b * block;
    if (dtype == DType::kGgmlQ6_K) {
      std::memcpy(at + 208, &small, 2);
    } else {
      std::memcpy(at, &small, 2);
      std::memcpy(at + 2, &small, 2);  // m / dmin where the format has one (else codes)
    }
  }
}

// Copies of one W [N, K] in one allocation, filled with small deterministic values.
class WeightCopies {
 public:
  WeightCopies(DType dtype, int64_t N, int64_t K)
      : dtype_(dtype), N_(N), K_(K), bytes_(TensorBytes(dtype, std::array<int64_t, 2>{N, K})) {
    // Whole cache lines per copy, so each copy starts on a line like a loaded checkpoint tensor.
    stride_ = (bytes_ + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    copies_ = std::max<size_t>(1, (kColdBytes + bytes_ - 1) / bytes_);
    storage_ = TensorStorage(stride_ * copies_);
    std::vector<float> row(static_cast<size_t>(K));
    for (size_t c = 0; c < copies_; ++c) {
      std::byte* base = storage_.data() + c * stride_;
      if (IsGgmlBlockDType(dtype)) {
        for (int64_t n = 0; n < N; ++n) {
          FillGgmlRow(dtype, base + n * StoredRowBytes(dtype, K), K, c * N + n);
        }
        continue;
      }
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          // Values do not change the speed; a multiplicative hash keeps them varied, in
          // [-0.5, 0.5).
          const size_t i = static_cast<size_t>(n * K + k);
          row[k] = static_cast<float>(((i * 2654435761u + c) >> 24) & 0xff) / 256.0f - 0.5f;
        }
        if (IsPackedDType(dtype)) {
          QuantizeRow(row.data(), copy(c), n);
        } else if (dtype == DType::kBF16) {
          for (int64_t k = 0; k < K; ++k) {
            reinterpret_cast<uint16_t*>(base)[n * K + k] = F32ToBF16(row[k]);
          }
        } else {
          std::copy(row.begin(), row.end(), reinterpret_cast<float*>(base) + n * K);
        }
      }
    }
  }

  bool Matches(DType dtype, int64_t N, int64_t K) const {
    return dtype == dtype_ && N == N_ && K == K_;
  }
  size_t copies() const { return copies_; }
  size_t bytes() const { return bytes_; }
  Tensor copy(size_t c) const { return Tensor(storage_.data() + c * stride_, dtype_, {N_, K_}); }

 private:
  DType dtype_;
  int64_t N_;
  int64_t K_;
  size_t bytes_;
  size_t stride_ = 0;
  size_t copies_ = 0;
  // Mutable view target: Tensor views take non-const data, and the kernel only reads it.
  mutable TensorStorage storage_;
};

// The weights of the previous benchmark are kept while the shape repeats (the M and thread
// arguments vary fastest), and freed before the next shape is allocated.
const WeightCopies& GetWeights(DType dtype, int64_t N, int64_t K) {
  static std::unique_ptr<WeightCopies> cached;
  if (cached == nullptr || !cached->Matches(dtype, N, K)) {
    cached.reset();
    cached = std::make_unique<WeightCopies>(dtype, N, K);
  }
  return *cached;
}

// The weight formats by the benchmark's `dtype` argument.
constexpr DType kDTypes[] = {DType::kBF16, DType::kF32,  DType::kQ8,
                             DType::kQ4,   DType::kQ8A8, DType::kQ4A8};

// `num_jobs` products per call, each of M rows by its own cold copy of W [N, K] (kDTypes[dtype]):
// one job through MatMul, several through MatMulGroup (as the MoE's experts run).
void RunMatMuls(benchmark::State& state, int64_t num_jobs, int64_t N, int64_t K, int64_t M,
                int64_t dtype, int64_t threads, bool group) {
  ThreadPool pool(static_cast<size_t>(threads));
  const WeightCopies& weights = GetWeights(kDTypes[dtype], N, K);
  std::vector<float> x(static_cast<size_t>(num_jobs * M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  std::vector<float> y(static_cast<size_t>(num_jobs * M * N));
  std::vector<Tensor> views(static_cast<size_t>(num_jobs));
  std::vector<MatMulJob> jobs(static_cast<size_t>(num_jobs));

  // Measured now, on this pool, so that a change in machine load between benchmarks shows in
  // both numbers of the ratio.
  const double read_gb_per_s = MeasureReadBandwidth(pool, size_t{256} << 20, 3).gb_per_s;

  size_t c = 0;
  // The same wall-clock span the framework times (UseRealTime), kept here so that the ratio and
  // GFLOP/s are plain numbers rather than per-second rates.
  const Stopwatch watch;
  for (auto _ : state) {
    for (int64_t j = 0; j < num_jobs; ++j) {
      views[j] = weights.copy(c);
      if (++c == weights.copies()) c = 0;
      jobs[j] = {x.data() + j * M * K, K, M, &views[j], y.data() + j * M * N, N};
    }
    if (group) {
      MatMulGroup(jobs.data(), num_jobs, pool);
    } else {
      MatMul(x.data(), K, M, views[0], y.data(), N, pool);
    }
    benchmark::ClobberMemory();
  }
  const double seconds = std::max(watch.ElapsedSeconds(), 1e-9);
  const double calls = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(weights.bytes() * num_jobs);
  state.SetBytesProcessed(static_cast<int64_t>(calls * bytes));
  state.counters["weight_GB/s"] = calls * bytes / seconds * 1e-9;
  state.counters["read_GB/s"] = read_gb_per_s;
  state.counters["roofline_ratio"] = calls * bytes / seconds * 1e-9 / read_gb_per_s;
  state.counters["GFLOP/s"] =
      calls * 2.0 * static_cast<double>(num_jobs * M * N * K) / seconds * 1e-9;
}

// Args: N, K, M, dtype (0 bf16, 1 f32, 2 int8, 3 int4, 4 w8a8, 5 w4a8: kDTypes), threads.
void BM_MatMul(benchmark::State& state) {
  RunMatMuls(state, 1, state.range(0), state.range(1), state.range(2), state.range(3),
             state.range(4), /*group=*/false);
}

void MatMulArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "K", "M", "dtype", "threads"});
  // [8192, 2048]: Qwen3-Next GDN in_proj scale; [2048, 4096]: a wide projection; [512, 2048]:
  // one expert's gate or up projection.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{8192, 2048}, {2048, 4096}, {512, 2048}}) {
    for (int64_t dtype = 0; dtype < std::ssize(kDTypes); ++dtype) {
      for (int64_t M : {1, 4, 8, 16, 128}) {
        for (int64_t threads : {1, 2}) b->Args({N, K, M, dtype, threads});
      }
      // Prefill of 8 prompts of 128 tokens: x (8 MiB) no longer fits in L2.
      if (N == 8192 && (kDTypes[dtype] == DType::kBF16 || kDTypes[dtype] == DType::kQ8A8)) {
        b->Args({N, K, 1024, dtype, 2});
      }
    }
  }
}
BENCHMARK(BM_MatMul)->Apply(MatMulArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// One MoE projection at decode as the engine runs it: a MatMulGroup of `jobs` different
// experts' matrices (each its own cold copy of W [N, K], as each expert is its own tensor), M
// rows each. Shorter streams than BM_MatMul's, one after another on each thread.
// Args: jobs, N, K, M, dtype (as BM_MatMul), threads.
void BM_MatMulGroup(benchmark::State& state) {
  RunMatMuls(state, state.range(0), state.range(1), state.range(2), state.range(3), state.range(4),
             state.range(5), /*group=*/true);
}

void MatMulGroupArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"jobs", "N", "K", "M", "dtype", "threads"});
  // The bench preset's MoE at decode: 8 routed experts + the shared one, gate and up fused
  // ([1024, 2048]), then down ([2048, 512]).
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1024, 2048}, {2048, 512}}) {
    for (int64_t dtype = 0; dtype < std::ssize(kDTypes); ++dtype) {
      b->Args({9, N, K, 1, dtype, 2});
    }
    // At a 128-token prefill: 32 experts of 32 rows each on average (8 of 32 experts a token).
    for (int64_t dtype : {0, 4}) b->Args({32, N, K, 32, dtype, 2});
  }
  // Qwen3-30B-A3B's MoE at decode: 8 routed experts, gate and up fused ([1536, 2048]), then down
  // ([2048, 768]); no shared expert.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1536, 2048}, {2048, 768}}) {
    for (int64_t dtype = 0; dtype < std::ssize(kDTypes); ++dtype) b->Args({8, N, K, 1, dtype, 2});
  }
}
BENCHMARK(BM_MatMulGroup)->Apply(MatMulGroupArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// GGML block formats read in place, as a GGUF file's tensors (kernels/matmul_ggml.h), with f32
// or int8 activations: MatMul of M rows against a cold copy of W [N, K]. Shapes of
// Qwen3-30B-A3B: [768, 2048] an expert's gate or up, [6144, 2048] 8 experts' gate and up (what
// one decode step streams per layer), [2048, 768] an expert's down projection.
// Args: N, K, M, dtype (kGgmlDTypes), activations (0 f32, 1 int8), threads.
constexpr DType kGgmlDTypes[] = {DType::kGgmlQ4_K, DType::kGgmlQ6_K, DType::kGgmlQ8_0,
                                 DType::kGgmlQ4_0, DType::kGgmlQ5_K, DType::kGgmlQ5_0,
                                 DType::kGgmlQ4_1, DType::kGgmlQ5_1};

void BM_MatMulGgml(benchmark::State& state) {
  const int64_t N = state.range(0), K = state.range(1), M = state.range(2);
  const DType dtype = kGgmlDTypes[state.range(3)];
  const GgmlActivations activations =
      state.range(4) == 0 ? GgmlActivations::kF32 : GgmlActivations::kInt8;
  ThreadPool pool(static_cast<size_t>(state.range(5)));
  const WeightCopies& weights = GetWeights(dtype, N, K);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  std::vector<float> y(static_cast<size_t>(M * N));
  const double read_gb_per_s = MeasureReadBandwidth(pool, size_t{256} << 20, 3).gb_per_s;
  const double fma_gflops = MeasureFmaPeak(pool).gflops;
  size_t c = 0;
  const Stopwatch watch;
  for (auto _ : state) {
    MatMul(x.data(), K, M, weights.copy(c), y.data(), N, pool, activations);
    if (++c == weights.copies()) c = 0;
    benchmark::ClobberMemory();
  }
  const double seconds = std::max(watch.ElapsedSeconds(), 1e-9);
  const double calls = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(weights.bytes());
  const double gflops = calls * 2.0 * static_cast<double>(M * N * K) / seconds * 1e-9;
  state.SetBytesProcessed(static_cast<int64_t>(calls * bytes));
  state.counters["weight_GB/s"] = calls * bytes / seconds * 1e-9;
  state.counters["read_GB/s"] = read_gb_per_s;
  state.counters["roofline_ratio"] = calls * bytes / seconds * 1e-9 / read_gb_per_s;
  state.counters["GFLOP/s"] = gflops;
  state.counters["fma_ratio"] = gflops / fma_gflops;
}

void MatMulGgmlArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "K", "M", "dtype", "act", "threads"});
  for (auto [N, K] : {std::pair<int64_t, int64_t>{768, 2048}, {6144, 2048}, {2048, 768}}) {
    for (int64_t dtype = 0; dtype < std::ssize(kGgmlDTypes); ++dtype) {
      for (int64_t M : {1, 8, 128}) {
        for (int64_t act : {0, 1}) {
          // One thread, and two for the largest shape (the other core is shared: a pool's join
          // can cost more than a small product).
          b->Args({N, K, M, dtype, act, 1});
          if (N == 6144) b->Args({N, K, M, dtype, act, 2});
        }
      }
    }
  }
}
BENCHMARK(BM_MatMulGgml)->Apply(MatMulGgmlArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// The kernels' compute ceiling: one small W [N, K] read over and over from L2 (no memory
// traffic), M rows, one thread. weight_GB/s here is how fast a core could consume weights if
// memory kept up; below the read bandwidth per core, the format is compute-bound at decode.
// Args: N, K, M, dtype (as BM_MatMul).
void BM_MatMulHot(benchmark::State& state) {
  const int64_t N = state.range(0), K = state.range(1), M = state.range(2);
  const DType dtype = kDTypes[state.range(3)];
  ThreadPool pool(1);
  TensorStorage storage(TensorBytes(dtype, std::array<int64_t, 2>{N, K}));
  Tensor W(storage.data(), dtype, {N, K});
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k)
      row[k] = static_cast<float>((n * 7 + k * 3) % 17) / 17.0f - 0.5f;
    if (IsPackedDType(dtype)) {
      QuantizeRow(row.data(), W, n);
    } else if (dtype == DType::kBF16) {
      for (int64_t k = 0; k < K; ++k) W.data_as<uint16_t>()[n * K + k] = F32ToBF16(row[k]);
    } else {
      std::copy(row.begin(), row.end(), W.data_as<float>() + n * K);
    }
  }
  std::vector<float> x(static_cast<size_t>(M * K), 0.25f), y(static_cast<size_t>(M * N));
  const Stopwatch watch;
  for (auto _ : state) {
    MatMul(x.data(), K, M, W, y.data(), N, pool);
    benchmark::ClobberMemory();
  }
  const double seconds = std::max(watch.ElapsedSeconds(), 1e-9);
  const double calls = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = calls * static_cast<double>(storage.size()) / seconds * 1e-9;
  state.counters["Gweights/s"] = calls * static_cast<double>(N * K) / seconds * 1e-9;
  state.counters["GFLOP/s"] = calls * 2.0 * static_cast<double>(M * N * K) / seconds * 1e-9;
}
BENCHMARK(BM_MatMulHot)
    ->ArgNames({"N", "K", "M", "dtype"})
    ->ArgsProduct({{128}, {2048}, {1, 8}, {0, 2, 3, 4, 5}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The GGML formats' compute ceiling: one W [N, K] small enough for L2 read over and over, M
// rows, one thread, as BM_MatMulHot. weight_GB/s above a core's share of the read bandwidth
// means the format is memory-bound at decode; below it, the kernel's instructions per block are
// what a decode pays. Args: N, K, M, dtype (kGgmlDTypes), activations (0 f32, 1 int8).
void BM_MatMulGgmlHot(benchmark::State& state) {
  const int64_t N = state.range(0), K = state.range(1), M = state.range(2);
  const DType dtype = kGgmlDTypes[state.range(3)];
  const GgmlActivations activations =
      state.range(4) == 0 ? GgmlActivations::kF32 : GgmlActivations::kInt8;
  ThreadPool pool(1);
  TensorStorage storage(TensorBytes(dtype, std::array<int64_t, 2>{N, K}));
  for (int64_t n = 0; n < N; ++n) {
    FillGgmlRow(dtype, storage.data() + n * StoredRowBytes(dtype, K), K, static_cast<size_t>(n));
  }
  const Tensor W(storage.data(), dtype, {N, K});
  std::vector<float> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  std::vector<float> y(static_cast<size_t>(M * N));
  const Stopwatch watch;
  for (auto _ : state) {
    MatMul(x.data(), K, M, W, y.data(), N, pool, activations);
    benchmark::ClobberMemory();
  }
  const double seconds = std::max(watch.ElapsedSeconds(), 1e-9);
  const double calls = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = calls * static_cast<double>(storage.size()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = calls * 2.0 * static_cast<double>(M * N * K) / seconds * 1e-9;
}
BENCHMARK(BM_MatMulGgmlHot)
    ->ArgNames({"N", "K", "M", "dtype", "act"})
    ->ArgsProduct({{128}, {2048}, {1, 8}, {0, 1, 2, 3, 4, 5, 6, 7}, {1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moeserve::kernels

// MOESERVE_ISA=avx2 (etc.) measures that target's kernels, as it does for moeserve itself.
int main(int argc, char** argv) {
  return moeserve::kernels::BenchmarkMainWithIsa(argc, argv, "matmul_benchmark");
}
