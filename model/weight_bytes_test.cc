// PlanWeightBytes (from config.json alone) against CountWeightBytes of what LoadWeights allocates:
// exactly equal, kind by kind, for every architecture, --weight-dtype and rank of a --tp / --ep
// split -- the memory plan's weights are the loader's.
#include "model/weight_bytes.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/testing.h"

namespace moeserve::model {
namespace {

namespace fs = std::filesystem;

using testing::MadeModel;

struct Model {
  std::string name, flags;
};

// Every layout the loader knows: Qwen3-Next's interleaved GDN projections and per-expert
// tensors, Qwen3.5's split projections and fused experts, attention-only MoE with an expert
// width int4 cannot pack (48: not a multiple of 32), one whose packed rows do not fill the
// tensors' 64-byte alignment (an expert's [100, 40] int8 down_proj: 4,000 bytes, while its
// gate and up are one [80, 100] matrix of 8,000), dense with and without q/k norm, an f32
// checkpoint (packed formats keep its routers and embedding in f32).
const Model kModels[] = {
    {"qwen3_next", "--arch qwen3_next --preset tiny --seed 1"},
    {"qwen3_5_moe", "--arch qwen3_5_moe --preset tiny --seed 2"},
    {"qwen3_moe_w48", "--arch qwen3_moe --preset tiny --moe-intermediate-size 48 --seed 3"},
    {"qwen3_moe_h100",
     "--arch qwen3_moe --preset tiny --hidden-size 100 --moe-intermediate-size 40 --seed 6"},
    {"qwen3", "--arch qwen3 --preset tiny --seed 4"},
    {"llama_f32", "--arch llama --preset tiny --dtype f32 --seed 5"},
};

const DType kDTypes[] = {DType::kBF16, DType::kF32,  DType::kQ8,
                         DType::kQ4,   DType::kQ8A8, DType::kQ4A8};

TEST(WeightBytesTest, PlanEqualsWhatTheLoaderAllocates) {
  for (const Model& m : kModels) {
    SCOPED_TRACE(m.name);
    const std::string dir = MadeModel("wb_" + m.name, m.flags);
    Result<io::ModelConfig> config = io::LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    Result<io::SafetensorsCheckpoint> checkpoint = io::SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
    const DType base = ConfigMatrixDType(*config);
    const std::vector<ShardSpec> specs = {
        {0, 1, false}, {0, 2, false}, {1, 2, false}, {1, 2, true}};
    for (const ShardSpec& spec : specs) {
      Result<ShardLayout> shard = MakeShardLayout(*config, spec);
      if (!shard.ok()) continue;  // --ep without experts
      for (DType dtype : kDTypes) {
        SCOPED_TRACE(fmt::format("rank {} of {}{}, {}", spec.rank, spec.size,
                                 spec.expert_parallel ? " --ep" : "", DTypeName(dtype)));
        Result<ModelWeights> weights = LoadWeights(*config, *shard, *checkpoint, dtype);
        ASSERT_TRUE(weights.ok()) << weights.status().ToString();
        if (IsPackedDType(dtype)) {
          EXPECT_EQ(weights->base_dtype, base);
        }
        const WeightBytes planned =
            PlanWeightBytes(*config, *shard, dtype, IsPackedDType(dtype) ? base : dtype);
        const WeightBytes loaded = CountWeightBytes(*weights);
        for (int k = 0; k < kNumWeightKinds; ++k) {
          const auto kind = static_cast<WeightKind>(k);
          EXPECT_EQ(planned[kind], loaded[kind]) << WeightKindName(kind);
        }
        EXPECT_GT(loaded.total(), 0);
      }
      // --lm-head-dtype: lm_head at 4 bits under int4, and at bf16 under int8.
      for (auto [dtype, lm_head] :
           {std::pair{DType::kQ4, DType::kQ4}, std::pair{DType::kQ8, DType::kBF16}}) {
        SCOPED_TRACE(fmt::format("rank {} of {}, {}, lm_head {}", spec.rank, spec.size,
                                 DTypeName(dtype), DTypeName(lm_head)));
        Result<ModelWeights> weights = LoadWeights(*config, *shard, *checkpoint, dtype, nullptr, lm_head);
        ASSERT_TRUE(weights.ok()) << weights.status().ToString();
        EXPECT_EQ(PlanWeightBytes(*config, *shard, dtype, base, lm_head)[WeightKind::kLmHead],
                  CountWeightBytes(*weights)[WeightKind::kLmHead]);
      }
    }
    fs::remove_all(dir);
  }
}

// At bf16 the plan is the checkpoint's bytes but for the vectors the loader widens to f32
// (norms, biases, GDN's conv and decay parameters): a cross-check against the checkpoint walk.
TEST(WeightBytesTest, Bf16PlanIsTheCheckpointWithVectorsInF32) {
  io::ModelConfig config;
  {
    const std::string dir = MadeModel("wb_walk", "--arch qwen3_next --preset tiny --no-weights");
    Result<io::ModelConfig> loaded = io::LoadModelConfig(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    config = *loaded;
    fs::remove_all(dir);
  }
  int64_t matrices = 0, vectors = 0;
  ForEachCheckpointTensor(config, [&](const CheckpointTensor& t) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const bool matrix = (t.kind == TensorKind::kLinear || t.kind == TensorKind::kEmbedding) &&
                        t.role != TensorRole::kSharedExpertGateScalar;
    (matrix ? matrices : vectors) += numel;
  });
  Result<ShardLayout> shard = MakeShardLayout(config, {});
  ASSERT_TRUE(shard.ok());
  const WeightBytes planned = PlanWeightBytes(config, *shard, DType::kBF16, DType::kBF16);
  EXPECT_EQ(planned.total(), 2 * matrices + 4 * vectors);
}

}  // namespace
}  // namespace moeserve::model
