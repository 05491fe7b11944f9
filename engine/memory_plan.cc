#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/causal_lm.h"
#include "model/shard.h"

namespace moeserve::engine {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "14.21 GiB", or "312.0 MiB" under a GiB.
std::string Size(int64_t bytes) {
  if (bytes >= int64_t{1} << 30) return fmt::format("{:.2f} GiB", bytes / kGiB);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

// The engine's own buffers besides the model's (engine.cc, model_runner.cc, mtp_proposer.cc):
// the persistent block-table rows, the sampler's scratch and the MTP drafter's hidden rows.
int64_t EngineRowsBytes(const io::ModelConfig& c, const EngineConfig& e,
                        const EngineLayout& layout) {
  const int64_t blocks_per_request =
      (layout.max_model_len + layout.block_size - 1) / layout.block_size;
  int64_t bytes = e.max_num_seqs * blocks_per_request * static_cast<int64_t>(sizeof(int32_t)) +
                  2 * c.vocab_size * static_cast<int64_t>(sizeof(float));
  if (layout.spec.method == SpecMethod::kMtp) {
    bytes += e.max_num_batched_tokens * c.hidden_size * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

}  // namespace

int64_t MemoryPlan::total() const {
  return weights.total() + kv_bytes + state_bytes + checkpoint_bytes + scratch_bytes +
         reserve_bytes;
}

Result<MemoryPlan> PlanMemory(const io::ModelConfig& config, const MemoryPlanOptions& options) {
  MemoryPlan plan;
  plan.options = options;
  plan.base_dtype = model::ConfigMatrixDType(config);
  plan.matrix_dtype = options.weight_dtype.value_or(plan.base_dtype);
  if (plan.matrix_dtype != DType::kBF16 && plan.matrix_dtype != DType::kF32 &&
      !IsPackedDType(plan.matrix_dtype)) {
    return InvalidArgument("weight dtype {} is not supported", DTypeName(plan.matrix_dtype));
  }
  if (!IsPackedDType(plan.matrix_dtype)) plan.base_dtype = plan.matrix_dtype;
  plan.lm_head_dtype =
      model::MatrixDType(plan.matrix_dtype, plan.base_dtype, model::TensorRole::kLmHead,
                         config.hidden_size, options.lm_head_dtype);
  const int ranks_here = std::clamp(options.ranks_here, 1, options.tp);

  std::vector<model::ShardLayout> shards;
  for (int r = 0; r < ranks_here; ++r) {
    ASSIGN_OR_RETURN(model::ShardLayout shard,
                     model::MakeShardLayout(config, {r, options.tp, options.ep}));
    if (options.stored_weights && !options.weight_dtype) {
      ASSIGN_OR_RETURN(model::WeightBytes stored, options.stored_weights(shard));
      plan.weights += stored;
      plan.stored_formats = true;
    } else {
      plan.weights += model::PlanWeightBytes(config, shard, plan.matrix_dtype, plan.base_dtype,
                                             options.lm_head_dtype);
    }
    shards.push_back(std::move(shard));
  }
  // The engine sizes its default GDN state checkpoints against what is available once the
  // weights are loaded.
  const int64_t available_after_load =
      options.available_bytes > 0
          ? std::max<int64_t>(options.available_bytes - plan.weights.total(), 0)
          : 0;
  const EngineConfig& e = options.engine;
  const int64_t K = e.spec.enabled() ? e.spec.num_speculative_tokens : 0;
  // The runner's batch (model_runner.cc): a step's tokens, its sequences and sampled rows.
  const int64_t tokens = e.max_num_batched_tokens;
  const int64_t seqs = std::min(e.max_num_seqs, tokens);
  const int64_t sampled_rows = std::min(tokens, seqs * (1 + K));
  for (const model::ShardLayout& shard : shards) {
    ASSIGN_OR_RETURN(const EngineLayout layout,
                     ResolveLayout(shard.local, e, available_after_load));
    if (shard.spec.rank == 0) plan.layout = layout;
    plan.kv_bytes += layout.kv_bytes;
    plan.state_bytes += layout.num_state_slots * layout.state_slot_bytes;
    plan.checkpoint_bytes += layout.num_checkpoints * layout.state_slot_bytes;
    plan.scratch_bytes += model::CausalLm::ReserveBytes(config, shard, tokens, sampled_rows);
  }
  plan.scratch_bytes += EngineRowsBytes(config, e, plan.layout);
  return plan;
}

std::string MemoryPlan::ToText() const {
  const EngineConfig& e = options.engine;
  std::string out = fmt::format(
      "memory plan: weights at {}, --max-model-len {}, --max-num-seqs {}, "
      "--max-num-batched-tokens {}, {} rank{} on this machine\n",
      stored_formats ? "the file's own formats" : DTypeName(matrix_dtype), layout.max_model_len, e.max_num_seqs, e.max_num_batched_tokens,
      std::clamp(options.ranks_here, 1, options.tp), options.ranks_here > 1 ? "s" : "");
  const auto line = [&](std::string_view name, int64_t bytes, const std::string& detail) {
    out += fmt::format("  {:<20}{:>11}", name, Size(bytes));
    out += detail.empty() ? "\n" : "  " + detail + "\n";
  };
  line("weights", weights.total(),
       stored_formats ? "as stored, the file's pages used in place"
       : IsPackedDType(matrix_dtype)
           ? fmt::format("{} projections and experts; embedding and routers {}; lm_head {}",
                         DTypeName(matrix_dtype), DTypeName(base_dtype), DTypeName(lm_head_dtype))
           : std::string(DTypeName(matrix_dtype)));
  for (int k = 0; k < model::kNumWeightKinds; ++k) {
    const auto kind = static_cast<model::WeightKind>(k);
    if (weights[kind] == 0) continue;
    line(fmt::format("  {}", model::WeightKindName(kind)), weights[kind], "");
  }
  line("KV cache", kv_bytes,
       fmt::format("{} blocks of {} positions per rank (f32 K and V)", layout.num_blocks,
                   layout.block_size));
  if (layout.state_slot_bytes > 0) {
    line("GDN state slots", state_bytes,
         fmt::format("{} slots of {} (f32): the running requests' and their drafts'",
                     layout.num_state_slots, Size(layout.state_slot_bytes)));
    line("state checkpoints", checkpoint_bytes,
         fmt::format("{} prefix-cache checkpoints", layout.num_checkpoints));
  }
  line("scratch", scratch_bytes,
       fmt::format("activations and logits of {}-token steps, the engine's rows",
                   e.max_num_batched_tokens));
  line("runtime reserve", reserve_bytes, "code, tokenizer, heap, threads");
  line("total", total(), "");
  if (options.available_bytes == 0) {
    out += "  available: unknown (no /proc/meminfo MemAvailable): not checked\n";
  } else {
    line("available", options.available_bytes,
         fmt::format("/proc/meminfo MemAvailable: {}",
                     fits() ? "fits"
                            : fmt::format("does not fit (short by {})",
                                          Size(total() - options.available_bytes))));
  }
  return out;
}

}  // namespace moeserve::engine
