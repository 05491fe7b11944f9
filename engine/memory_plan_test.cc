// The memory plan against what a run allocates: an engine over the loaded model holds exactly
// the planned weights, KV cache, GDN state (slots and checkpoints) and forward buffers.
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "core/memory_info.h"
#include "engine/engine_test_util.h"
#include "model/model_group.h"
#include "model/weight_bytes.h"

namespace moeserve::engine {
namespace {

using test_util::MadeModel;

struct PlanCase {
  std::string name;
  std::string dir;
  std::optional<DType> weight_dtype;
  int tp;
  EngineConfig engine;
};

EngineConfig Sized(int64_t max_num_seqs, int64_t max_model_len, int64_t tokens,
                   const std::string& spec = "none", bool prefix_caching = true) {
  EngineConfig e;
  e.max_num_seqs = max_num_seqs;
  e.max_model_len = max_model_len;
  e.max_num_batched_tokens = tokens;
  e.enable_prefix_caching = prefix_caching;
  Result<SpecConfig> parsed = ParseSpecFlag(spec);
  CHECK(parsed.ok()) << parsed.status().ToString();
  e.spec.method = parsed->method;
  e.spec.num_speculative_tokens = parsed->num_speculative_tokens;
  return e;
}

TEST(MemoryPlanTest, TheEngineAllocatesWhatThePlanSays) {
  const std::string hybrid = test_util::HybridMtpDir();  // GDN state slots and an MTP head
  const std::string moe = test_util::Qwen3MoeDir();      // attention only, prefix caching
  const std::vector<PlanCase> cases = {
      {"hybrid bf16", hybrid, std::nullopt, 1, Sized(4, 256, 128)},
      {"hybrid int4, mtp:2", hybrid, DType::kQ4, 1, Sized(3, 512, 256, "mtp:2")},
      {"hybrid w8a8, no prefix caching", hybrid, DType::kQ8A8, 1, Sized(2, 128, 64, "none", false)},
      {"qwen3_moe int8", moe, DType::kQ8, 1, Sized(8, 300, 100)},
      {"qwen3_moe f32, --tp 2", moe, DType::kF32, 2, Sized(2, 64, 32)},
  };
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(c.name);
    Result<io::ModelConfig> config = io::LoadModelConfig(c.dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    MemoryPlanOptions options;
    options.weight_dtype = c.weight_dtype;
    options.tp = c.tp;
    options.ranks_here = c.tp;
    options.engine = c.engine;
    options.available_bytes = AvailableMemoryBytes();
    Result<MemoryPlan> plan = PlanMemory(*config, options);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();

    model::ParallelOptions parallel;
    parallel.tp = c.tp;
    Result<std::unique_ptr<model::ModelGroup>> group =
        model::ModelGroup::Load(c.dir, {.weight_dtype = c.weight_dtype, .threads = 1}, parallel);
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    model::CausalLm& lm = (*group)->model();
    Result<std::unique_ptr<Engine>> engine = Engine::Create(**group, c.engine);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();

    // Rank 0's share; the ranks of this even split hold the same.
    const model::WeightBytes loaded = model::CountWeightBytes(lm.weights());
    EXPECT_EQ(plan->weights.total(), c.tp * loaded.total());
    EXPECT_EQ(plan->matrix_dtype, lm.weights().matrix_dtype);
    const model::ModelCache& cache = (*engine)->runner().cache();
    EXPECT_EQ(plan->kv_bytes, c.tp * cache.kv_bytes());
    EXPECT_EQ(plan->state_bytes + plan->checkpoint_bytes, c.tp * cache.state_bytes());
    EXPECT_EQ(plan->layout.num_blocks, (*engine)->layout().num_blocks);
    EXPECT_EQ(plan->layout.num_checkpoints, (*engine)->layout().num_checkpoints);
    if (config->is_hybrid()) {
      EXPECT_GT(plan->state_bytes, 0);
      EXPECT_EQ(plan->checkpoint_bytes > 0, c.engine.enable_prefix_caching);
    }
    // The forward's buffers as Reserve left them in rank 0.
    const int64_t K = c.engine.spec.enabled() ? c.engine.spec.num_speculative_tokens : 0;
    const int64_t tokens = c.engine.max_num_batched_tokens;
    const int64_t rows = std::min(tokens, std::min(c.engine.max_num_seqs, tokens) * (1 + K));
    EXPECT_EQ(model::CausalLm::ReserveBytes(*config, lm.shard(), tokens, rows),
              lm.reserved_bytes());
    EXPECT_GT(plan->scratch_bytes, c.tp * lm.reserved_bytes() - 1);
    EXPECT_EQ(plan->total(), plan->weights.total() + plan->kv_bytes + plan->state_bytes +
                                 plan->checkpoint_bytes + plan->scratch_bytes +
                                 kRuntimeReserveBytes);
  }
}

TEST(MemoryPlanTest, FitsAgainstTheMemoryAvailable) {
  Result<io::ModelConfig> config = io::LoadModelConfig(test_util::kHybridDir);
  ASSERT_TRUE(config.ok());
  MemoryPlanOptions options;
  options.engine = Sized(1, 128, 64);
  Result<MemoryPlan> plan = PlanMemory(*config, options);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->fits());  // unknown: not checked
  EXPECT_NE(plan->ToText().find("not checked"), std::string::npos) << plan->ToText();
  for (int64_t available : {plan->total(), plan->total() - 1, int64_t{1} << 50}) {
    options.available_bytes = available;
    plan = PlanMemory(*config, options);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->fits(), plan->total() <= available);
    const std::string text = plan->ToText();
    EXPECT_NE(text.find(plan->fits() ? ": fits" : "does not fit (short by"), std::string::npos)
        << text;
    for (const char* part : {"weights", "embedding", "gdn", "experts", "shared expert", "mtp",
                             "KV cache", "GDN state slots", "state checkpoints", "scratch",
                             "runtime reserve", "total", "available"}) {
      EXPECT_NE(text.find(std::string("  ") + part), std::string::npos) << part << "\n" << text;
    }
  }
}

// What a load would refuse, the plan refuses the same way.
TEST(MemoryPlanTest, RefusesWhatTheEngineAndTheSplitRefuse) {
  Result<io::ModelConfig> config = io::LoadModelConfig(test_util::kHybridDir);
  ASSERT_TRUE(config.ok());
  MemoryPlanOptions options;
  options.engine = Sized(1, 1 << 20, 64);  // past max_position_embeddings
  Result<MemoryPlan> plan = PlanMemory(*config, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--max-model-len"), std::string::npos);
  options.engine = Sized(1, 128, 64);
  options.tp = 3;  // does not divide the heads
  options.ranks_here = 3;
  plan = PlanMemory(*config, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--tp 3"), std::string::npos) << plan.status().message();
}

}  // namespace
}  // namespace moeserve::engine
