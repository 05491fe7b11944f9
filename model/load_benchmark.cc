// Loading a checkpoint (LoadWeights, weights.h) against the two ceilings it has, measured in the
// same run on the same threads:
//   read     every byte of the checkpoint read through a fresh mapping (page faults and memory
//            included): the load cannot beat it
//   compute  widening and packing alone: the rows of the checkpoint's matrices converted as the
//            load converts them (kernels::QuantizeRows, or a dtype conversion), from a source
//            row block in cache; the load's time with no memory, page faults or waits (timed on
//            an even sample of ~512 MB of rows, scaled to all of them)
// Run: [MOESERVE_ISA=avx2] build/release/model/load_benchmark MODEL_DIR [DTYPE ...] [--threads N]
// [--load-only] (dtypes: bf16, f32, int8, int4, w8a8, w4a8; default int4; --load-only skips the
// ceilings, for a profiler; MOESERVE_ISA restricts the packing's SIMD target, kernels/isa.h).
// Prints per dtype:
//   load_s, GB/s   the load's seconds and checkpoint bytes per second
//   cpu_s          CPU seconds of the process during the load (every thread, user + system)
//   over_MB        the most the load held beside the weights it returned, counted exactly
//                  (tensor storage and heap, core/tensor.h and core/heap_counter.h)
//   anon_MB        RssAnon after the load, and its peak sampled every 10 ms during it
//   ÷ read, ÷ compute  the load's GB/s over each ceiling's
// The page cache decides which load this is: run it twice for a warm one; a cold one needs the
// checkpoint dropped first (echo 1 > /proc/sys/vm/drop_caches, as root).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/heap_counter.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/isa.h"
#include "kernels/quantize.h"
#include "model/checkpoint_layout.h"
#include "model/shard.h"
#include "model/weights.h"

namespace moeserve::model {
namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// RssAnon of /proc/self/status, bytes.
size_t RssAnon() {
  std::ifstream status("/proc/self/status");
  std::string key;
  size_t kb = 0;
  while (status >> key) {
    if (key == "RssAnon:") {
      status >> kb;
      return kb << 10;
    }
    status.ignore(1 << 10, '\n');
  }
  return 0;
}

// Samples RssAnon every 10 ms until destroyed; peak() is the largest sample.
class RssSampler {
 public:
  RssSampler()
      : thread_([this] {
          while (!stop_.load()) {
            peak_ = std::max(peak_.load(), RssAnon());
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }) {}
  ~RssSampler() { Stop(); }
  size_t Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_ = std::max(peak_.load(), RssAnon());
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> peak_{0};
  std::thread thread_;
};

// GB/s of reading every byte of the checkpoint through a fresh mapping, on the pool's threads in
// 4 MiB blocks.
double ReadGBps(const std::string& dir, ThreadPool& pool) {
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(dir);
  CHECK(checkpoint.ok()) << checkpoint.status().ToString();
  struct Block {
    const uint64_t* data;
    size_t words;
  };
  std::vector<Block> blocks;
  constexpr size_t kBlockWords = (size_t{4} << 20) / 8;
  for (const io::SafetensorsFile* f : checkpoint->files()) {
    const auto* words = reinterpret_cast<const uint64_t*>(f->mapping().data());
    const size_t n = f->mapping().size() / 8;
    for (size_t i = 0; i < n; i += kBlockWords)
      blocks.push_back({words + i, std::min(kBlockWords, n - i)});
  }
  std::vector<uint64_t> sums(pool.num_threads());
  Stopwatch watch;
  pool.ParallelFor(blocks.size(), [&](size_t b, size_t thread) {
    uint64_t s = 0;
    for (size_t i = 0; i < blocks[b].words; ++i) s += blocks[b].data[i];
    sums[thread] += s;
  });
  const double seconds = watch.ElapsedSeconds();
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  std::printf("read pass checksum %llx\n", static_cast<unsigned long long>(total));
  return static_cast<double>(checkpoint->total_bytes()) * 1e-9 / seconds;
}

// Seconds the load's conversions take alone: every matrix row of the checkpoint converted into
// its stored dtype from one in-cache source block of its width, on the pool's threads.
double ComputeSeconds(const std::vector<ResolvedTensor>& tensors, DType requested, DType base,
                      ThreadPool& pool) {
  struct Work {
    DType src, dst;
    int64_t rows, cols;
  };
  std::vector<Work> work;
  for (const ResolvedTensor& t : tensors) {
    if (t.spec.kind != TensorKind::kLinear && t.spec.kind != TensorKind::kEmbedding) continue;
    const int64_t cols = t.spec.shape.back();
    work.push_back({t.stored->dtype, MatrixDType(requested, base, t.spec.role, cols),
                    t.stored->numel() / cols, cols});
  }
  constexpr int64_t kRows = 64;
  struct Task {
    size_t work;
    int64_t rows;
  };
  // Every stride-th block of rows, about kSampleBytes of source in all; the time is scaled up.
  constexpr double kSampleBytes = 512e6;
  double total_bytes = 0;
  for (const Work& w : work) {
    total_bytes += static_cast<double>(w.rows * w.cols) * static_cast<double>(DTypeSize(w.src));
  }
  const size_t stride = std::max<size_t>(1, static_cast<size_t>(total_bytes / kSampleBytes));
  std::vector<Task> tasks;
  double sampled_bytes = 0;
  size_t block = 0;
  for (size_t w = 0; w < work.size(); ++w) {
    for (int64_t r = 0; r < work[w].rows; r += kRows) {
      if (block++ % stride != 0) continue;
      tasks.push_back({w, std::min(kRows, work[w].rows - r)});
      sampled_bytes += static_cast<double>(tasks.back().rows * work[w].cols) *
                       static_cast<double>(DTypeSize(work[w].src));
    }
  }
  int64_t max_cols = 0;
  for (const Work& w : work) max_cols = std::max(max_cols, w.cols);
  // Weights of a trained model's magnitude (denormals would cost the arithmetic far more than
  // real weights do), in each source dtype.
  std::vector<float> values(kRows * max_cols);
  uint32_t state = 12345;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
  }
  std::map<DType, std::vector<std::byte>> sources;
  for (const Work& w : work) {
    std::vector<std::byte>& src = sources[w.src];
    if (!src.empty()) continue;
    src.resize(values.size() * DTypeSize(w.src));
    ConvertFromF32(values.data(), w.src, src.data(), values.size());
  }
  struct PerThread {
    std::vector<float> row;
    std::vector<OwnedTensor> dst;  // one [kRows, cols] block per work item's shape
  };
  std::vector<PerThread> threads(pool.num_threads());
  for (PerThread& t : threads) t.row.resize(max_cols);
  Stopwatch watch;
  pool.ParallelFor(tasks.size(), [&](size_t k, size_t thread) {
    const Work& w = work[tasks[k].work];
    PerThread& t = threads[thread];
    // A destination block of the right shape, reused (the load's page faults are not counted).
    OwnedTensor* dst = nullptr;
    for (OwnedTensor& d : t.dst) {
      if (d.view().dtype() == w.dst && d.view().dim(1) == w.cols) dst = &d;
    }
    if (dst == nullptr)
      dst = &t.dst.emplace_back(w.dst, std::initializer_list<int64_t>{kRows, w.cols});
    const size_t src_row = static_cast<size_t>(w.cols) * DTypeSize(w.src);
    if (IsPackedDType(w.dst)) {
      kernels::QuantizeRows(w.src, sources.at(w.src).data(), src_row, tasks[k].rows, dst->view(),
                            0);
      return;
    }
    for (int64_t r = 0; r < tasks[k].rows; ++r) {
      const std::byte* from = sources.at(w.src).data() + r * src_row;
      if (w.src == w.dst) {
        std::memcpy(static_cast<std::byte*>(dst->view().data()) + r * src_row, from, src_row);
      } else {
        ConvertToF32(w.src, from, t.row.data(), w.cols);
        ConvertFromF32(t.row.data(), w.dst,
                       static_cast<std::byte*>(dst->view().data()) + r * w.cols * DTypeSize(w.dst),
                       w.cols);
      }
    }
  });
  return watch.ElapsedSeconds() * total_bytes / sampled_bytes;
}

int Run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: load_benchmark MODEL_DIR [DTYPE ...] [--threads N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<DType> dtypes;
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  bool load_only = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--load-only") {
      load_only = true;
      continue;
    }
    if (arg == "--threads" && i + 1 < argc) {
      threads = static_cast<size_t>(std::max(1, std::atoi(argv[++i])));
      continue;
    }
    const std::optional<DType> d = ParseDTypeName(arg);
    if (!d) {
      std::fprintf(stderr, "load_benchmark: unknown dtype '%s'\n", arg.c_str());
      return 2;
    }
    dtypes.push_back(*d);
  }
  if (dtypes.empty()) dtypes.push_back(DType::kQ4);
  Result<io::ModelConfig> config = io::LoadModelConfig(dir);
  if (!config.ok()) {
    std::fprintf(stderr, "load_benchmark: %s\n", config.status().ToString().c_str());
    return 1;
  }
  if (Status s = kernels::SelectIsaFromEnvironment(); !s.ok()) {
    std::fprintf(stderr, "load_benchmark: %s\n", s.ToString().c_str());
    return 2;
  }
  ThreadPool pool(threads, "load");
  std::printf("%s, %zu threads, %s\n", dir.c_str(), threads, kernels::ActiveIsa().c_str());
  std::printf("%-6s %7s %6s %6s %8s %15s %9s %9s %7s %7s\n", "dtype", "load_s", "GB/s", "cpu_s",
              "over_MB", "anon_MB (peak)", "read GB/s", "comp GB/s", "÷ read", "÷ comp");
  for (DType dtype : dtypes) {
    Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(dir);
    CHECK(checkpoint.ok()) << checkpoint.status().ToString();
    Result<ShardLayout> shard = MakeShardLayout(*config, ShardSpec{});
    CHECK(shard.ok());
    const double gb = static_cast<double>(checkpoint->total_bytes()) * 1e-9;
    const int64_t heap_before = HeapBytes();
    const size_t storage_before = TensorStorageBytes();
    ResetPeakHeapBytes();
    ResetPeakTensorStorageBytes();
    RssSampler sampler;
    const double cpu_before = CpuSeconds();
    Stopwatch watch;
    Result<ModelWeights> w = LoadWeights(*config, *shard, *checkpoint, dtype, &pool);
    const double load_s = watch.ElapsedSeconds();
    const double cpu_s = CpuSeconds() - cpu_before;
    const size_t peak_anon = sampler.Stop();
    CHECK(w.ok()) << w.status().ToString();
    const int64_t weights =
        static_cast<int64_t>(TensorStorageBytes() - storage_before) + (HeapBytes() - heap_before);
    const int64_t peak = static_cast<int64_t>(PeakTensorStorageBytes() - storage_before) +
                         (PeakHeapBytes() - heap_before);
    const size_t anon = RssAnon();
    Result<std::vector<ResolvedTensor>> tensors = ResolveCheckpoint(*config, *checkpoint);
    CHECK(tensors.ok());
    const double compute_gbps =
        load_only ? 0 : gb / ComputeSeconds(*tensors, w->matrix_dtype, w->base_dtype, pool);
    *w = ModelWeights();
    const double read_gbps = load_only ? 0 : ReadGBps(dir, pool);
    std::printf("%-6s %7.2f %6.2f %6.1f %8.1f %7.0f (%5.0f) %9.2f %9.2f %7.2f %7.2f\n",
                std::string(DTypeName(dtype)).c_str(), load_s, gb / load_s, cpu_s,
                static_cast<double>(peak - weights) * 1e-6, static_cast<double>(anon) * 1e-6,
                static_cast<double>(peak_anon) * 1e-6, read_gbps, compute_gbps,
                gb / load_s / read_gbps, gb / load_s / compute_gbps);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace moeserve::model

int main(int argc, char** argv) { return moeserve::model::Run(argc, argv); }
