// LoadWeights streams (weights.h): on a make-model checkpoint it holds, beside the weights it
// returns, no more than a few rows per thread -- counted exactly, every byte of every tensor
// storage and heap allocation on every thread (core/tensor.h, core/heap_counter.h), not sampled
// from the kernel -- lets go of every page of the mapped checkpoint, and gives the same bytes
// whatever the threads, each packed row exactly kernels::QuantizeRow of its source row.
#include "model/weights.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/heap_counter.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/quantize.h"
#include "model/checkpoint_layout.h"
#include "model/shard.h"
#include "model/testing.h"

namespace moeserve::model {
namespace {

namespace fs = std::filesystem;
using testing::ForEachMatrix;
using testing::MatrixBytes;

// Qwen3-Next (GDN, gated attention, shared expert, MTP) at 2 layers, with matrices large enough
// that an f32 copy of any expert or of the embedding is far above the loader's scratch.
const std::string& ModelDir() {
  return testing::MadeModel(
      "weights", "--arch qwen3_next --preset tiny --hidden-size 1024 --num-layers 2 "
                 "--moe-intermediate-size 512 --shared-expert-intermediate-size 512 "
                 "--vocab-size 4096 --seed 7");
}

struct Loaded {
  io::ModelConfig config;
  io::SafetensorsCheckpoint checkpoint;
  ModelWeights weights;
};

Loaded Load(DType dtype, ThreadPool* pool) {
  Result<io::ModelConfig> config = io::LoadModelConfig(ModelDir());
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(ModelDir());
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  Result<ShardLayout> shard = MakeShardLayout(*config, ShardSpec{});
  EXPECT_TRUE(shard.ok());
  Result<ModelWeights> w = LoadWeights(*config, *shard, *checkpoint, dtype, pool);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return Loaded{std::move(*config), std::move(*checkpoint), std::move(*w)};
}

// Pages of `bytes` this process maps (/proc/self/pagemap, bit 63).
size_t MappedPages(std::span<const std::byte> bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  size_t mapped = 0;
  const uintptr_t first = reinterpret_cast<uintptr_t>(bytes.data()) / page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size() - 1) / page;
  std::vector<uint64_t> entries(last - first + 1);
  EXPECT_EQ(::pread(fd, entries.data(), entries.size() * sizeof(uint64_t),
                    static_cast<off_t>(first * sizeof(uint64_t))),
            static_cast<ssize_t>(entries.size() * sizeof(uint64_t)));
  ::close(fd);
  for (uint64_t e : entries) mapped += (e >> 63) & 1;
  return mapped;
}

class LoadMemoryTest : public ::testing::TestWithParam<DType> {};

TEST_P(LoadMemoryTest, HoldsOnlyTheWeightsAndAFewRowsAndLetsGoOfTheCheckpoint) {
  Result<io::ModelConfig> config = io::LoadModelConfig(ModelDir());
  ASSERT_TRUE(config.ok());
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(ModelDir());
  ASSERT_TRUE(checkpoint.ok());
  Result<ShardLayout> shard = MakeShardLayout(*config, ShardSpec{});
  ASSERT_TRUE(shard.ok());
  ThreadPool pool(2);

  // What the loader may hold beside the weights: an f32 row per thread, the row indices of its
  // planned copies (at most every row of every matrix at once), its list of the checkpoint's
  // tensors, and a fixed allowance.
  Result<std::vector<ResolvedTensor>> tensors = ResolveCheckpoint(*config, *checkpoint);
  ASSERT_TRUE(tensors.ok());
  size_t max_cols = 0, rows = 0, smallest_big_f32 = SIZE_MAX;
  for (const ResolvedTensor& t : *tensors) {
    if (t.spec.kind != TensorKind::kLinear && t.spec.kind != TensorKind::kEmbedding) continue;
    const size_t cols = static_cast<size_t>(t.spec.shape.back());
    max_cols = std::max(max_cols, cols);
    rows += static_cast<size_t>(t.stored->numel()) / cols;
    if (t.spec.role == TensorRole::kEmbedding || t.spec.use == TensorUse::kRoutedExperts) {
      smallest_big_f32 = std::min(smallest_big_f32, static_cast<size_t>(t.stored->numel()) * 4);
    }
  }
  const size_t scratch = pool.num_threads() * max_cols * sizeof(float) + rows * sizeof(int64_t) +
                         tensors->size() * 512 + (size_t{256} << 10);
  // An f32 copy of any expert or of the embedding would break the bound.
  ASSERT_LT(scratch, smallest_big_f32);

  const int64_t heap_before = HeapBytes();
  const size_t storage_before = TensorStorageBytes();
  ResetPeakHeapBytes();
  ResetPeakTensorStorageBytes();
  Result<ModelWeights> w = LoadWeights(*config, *shard, *checkpoint, GetParam(), &pool);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const size_t storage = TensorStorageBytes() - storage_before;
  const size_t heap = static_cast<size_t>(HeapBytes() - heap_before);  // the weights' vectors
  const size_t peak_storage = PeakTensorStorageBytes() - storage_before;
  const size_t peak_heap = static_cast<size_t>(PeakHeapBytes() - heap_before);

  // The counters see the weights: at least the embedding and the experts' packed bytes.
  size_t matrix_bytes = 0;
  ForEachMatrix(*w, [&](const Tensor& t) { matrix_bytes += t.rank() == 2 ? t.bytes() : 0; });
  EXPECT_GE(storage, matrix_bytes);
  // No tensor is made but the weights' own, each once at its stored size.
  EXPECT_EQ(peak_storage, storage);
  EXPECT_LE(peak_heap, heap + scratch) << "weights' vectors " << heap << ", scratch " << scratch;
  RecordProperty("peak_over_weights_bytes", std::to_string(peak_heap - heap));

  // The checkpoint stays open and readable, but this process maps none of its pages.
  for (const io::SafetensorsFile* file : checkpoint->files()) {
    EXPECT_EQ(MappedPages(file->mapping()), 0u) << file->path();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoadMemoryTest,
                         ::testing::Values(DType::kQ4, DType::kQ8, DType::kQ4A8, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(LoadWeightsTest, SameBytesWhateverTheThreadsEachRowQuantizedOnItsOwn) {
  for (DType dtype : {DType::kQ4, DType::kQ8A8, DType::kF32}) {
    ThreadPool pool(3);
    const Loaded inline_load = Load(dtype, nullptr);
    const Loaded pooled = Load(dtype, &pool);
    std::vector<std::string> a, b;
    ForEachMatrix(inline_load.weights, [&](const Tensor& t) { a.push_back(MatrixBytes(t)); });
    ForEachMatrix(pooled.weights, [&](const Tensor& t) { b.push_back(MatrixBytes(t)); });
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(a[i] == b[i]) << DTypeName(dtype) << " #" << i;

    // Layer 1's expert 3 down projection [H, I] from model.layers.1.mlp.experts.3.down_proj:
    // row by row, widened to f32 and packed by QuantizeRow (or converted) alone.
    const Tensor& down = pooled.weights.layers[1].experts.experts[3].down.view();
    const io::SafetensorsTensor* src =
        pooled.checkpoint.Find("model.layers.1.mlp.experts.3.down_proj.weight");
    ASSERT_NE(src, nullptr);
    ASSERT_EQ(down.dtype(), dtype);
    const int64_t N = src->shape[0], K = src->shape[1];
    OwnedTensor expected(dtype, {N, K});
    std::vector<float> row(K);
    for (int64_t n = 0; n < N; ++n) {
      ConvertToF32(src->dtype, src->bytes.data() + n * K * DTypeSize(src->dtype), row.data(), K);
      if (IsPackedDType(dtype)) {
        kernels::QuantizeRow(row.data(), expected.view(), n);
      } else {
        ConvertFromF32(row.data(), dtype,
                       static_cast<std::byte*>(expected.view().data()) + n * K * DTypeSize(dtype),
                       K);
      }
    }
    EXPECT_TRUE(MatrixBytes(down) == MatrixBytes(expected.view())) << DTypeName(dtype);
  }
}

// A dtype the load cannot hold matrices in is refused, for the weights and for lm_head alike,
// naming which.
TEST(LoadWeightsTest, RefusesMatrixDTypesItCannotHold) {
  Result<io::ModelConfig> config = io::LoadModelConfig(ModelDir());
  ASSERT_TRUE(config.ok());
  Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(ModelDir());
  ASSERT_TRUE(checkpoint.ok());
  Result<ShardLayout> shard = MakeShardLayout(*config, ShardSpec{});
  ASSERT_TRUE(shard.ok());
  Result<ModelWeights> w = LoadWeights(*config, *shard, *checkpoint, DType::kI32, nullptr);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("weight dtype i32 is not supported"), std::string::npos)
      << w.status().message();
  w = LoadWeights(*config, *shard, *checkpoint, DType::kQ4, nullptr, DType::kF16);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("lm_head dtype f16 is not supported"), std::string::npos)
      << w.status().message();
}

}  // namespace
}  // namespace moeserve::model
