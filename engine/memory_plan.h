// What a run will hold in memory, planned from config.json and the flags alone, before a weight
// is read: the weights by kind at the --weight-dtype (model/weight_bytes.h: the loader's own
// dtype rule), the KV cache, the GDN state slots and prefix-cache checkpoints (ResolveLayout:
// the engine's own sizing), the forward's scratch (CausalLm::ReserveBytes) and the engine's
// rows, a reserve for the rest of the process, for every rank this machine holds -- against
// the memory available. `inspect` prints it; serve, generate, chat and bench latency refuse a
// run that does not fit before loading anything (docs/engine.md, "Memory plan").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "engine/engine.h"
#include "io/model_config.h"
#include "model/weight_bytes.h"

namespace moeserve::engine {

// The process's memory besides what the plan counts: code, the tokenizer (the Qwen3 one holds
// ~100 MB), the heap's slack, thread stacks, the requests' sampler tables. docs/engine.md gives
// the measurement it comes from.
inline constexpr int64_t kRuntimeReserveBytes = int64_t{512} << 20;

struct MemoryPlanOptions {
  std::optional<DType> weight_dtype;   // --weight-dtype; nullopt: config.json's torch_dtype
  std::optional<DType> lm_head_dtype;  // --lm-head-dtype; nullopt: as weight_dtype implies
  int tp = 1;                          // --tp ranks
  bool ep = false;                     // --ep
  int ranks_here = 1;  // ranks this machine holds: --tp under --comm local, mpirun's per node
  EngineConfig engine;
  int64_t available_bytes = 0;  // MemAvailable (core/memory_info.h); 0: unknown
  // A GGUF file used as stored (no weight_dtype): the bytes rank `shard`'s load holds
  // (model::StoredWeightBytes over the file), instead of a plan from the config.
  std::function<Result<model::WeightBytes>(const model::ShardLayout&)> stored_weights;
};

struct MemoryPlan {
  MemoryPlanOptions options;
  DType matrix_dtype = DType::kBF16;  // the --weight-dtype the load will use
  DType base_dtype = DType::kBF16;    // what a packed format keeps in the checkpoint's precision
  DType lm_head_dtype = DType::kBF16;
  bool stored_formats = false;  // the weights as stored (MemoryPlanOptions::stored_weights)
  // Every rank this machine holds.
  model::WeightBytes weights;
  int64_t kv_bytes = 0;          // KV cache
  int64_t state_bytes = 0;       // GDN state slots of the running requests (and their drafts)
  int64_t checkpoint_bytes = 0;  // prefix caching's GDN state checkpoints
  int64_t scratch_bytes = 0;     // the forward's activations and logits, the engine's rows
  int64_t reserve_bytes = kRuntimeReserveBytes;
  EngineLayout layout;  // rank 0's (per rank: its shard's KV heads)

  int64_t total() const;
  // Unknown available memory (0) is not checked: fits.
  bool fits() const { return options.available_bytes == 0 || total() <= options.available_bytes; }
  // The plan as a table, a line per part ("  weights   14.21 GiB  int4 ..."), ending with the
  // total against the memory available.
  std::string ToText() const;
};

// An InvalidArgument names what the flags ask that the model or the split refuses, as a load
// would (ResolveLayout, MakeShardLayout).
Result<MemoryPlan> PlanMemory(const io::ModelConfig& config, const MemoryPlanOptions& options);

}  // namespace moeserve::engine
