#include "cli/engine_flags.h"

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/check.h"
#include "core/log.h"
#include "core/memory_info.h"
#include "io/model_config.h"
#include "model/model_files.h"

namespace moeserve::cli {

void EngineFlags::RegisterSizing(FlagSet& flags) {
  flags.Int("max-num-seqs", &config.max_num_seqs, "requests running at once, at most");
  flags.Int("max-num-batched-tokens", &config.max_num_batched_tokens,
            "tokens in one engine step, at most (prefills longer than that are chunked)");
  flags.Int("max-model-len", &config.max_model_len,
            "prompt + output tokens of a request, at most (0: the model's "
            "max_position_embeddings)");
  flags.Double("kv-cache-memory", &config.kv_cache_memory_gib,
               "GiB of KV cache (0: enough for --max-num-seqs requests of --max-model-len, at "
               "most 4)");
  flags.Int("block-size", &config.block_size, "token positions per KV cache block");
  flags.Bool("no-enable-prefix-caching", &no_enable_prefix_caching,
             "do not reuse the KV blocks (and, for hybrid models, GDN state checkpoints) of "
             "common prompt prefixes");
  flags.Double("state-cache-memory", &config.state_cache_memory_gib,
               "hybrid models' prefix caching: GiB of GDN state checkpoints (0: one per 256 KV "
               "cache positions, at least 16, in at most 2 GiB and an eighth of the memory "
               "available)");
  flags.String("spec", &spec,
               "speculative decoding: mtp:K (the model's MTP head drafts K tokens), ngram:K "
               "(prompt lookup), K in 1..4; mtp:auto / ngram:auto (each step's drafts, 0..4, "
               "chosen by measured step cost and running acceptance); auto (mtp:auto on a model "
               "with an MTP head, else none); or none");
}

void EngineFlags::Register(FlagSet& flags) {
  RegisterSizing(flags);
  flags.Int("state-checkpoint-interval", &config.state_checkpoint_interval,
            "hybrid models' prefix caching: a GDN state checkpoint every this many prompt "
            "tokens, besides the ends of prompts and outputs and where shared prefixes "
            "diverge (a multiple of 64; 0: only those)");
  flags.Int("long-prefill-token-threshold", &config.long_prefill_token_threshold,
            "tokens of a prefill chunk, at most (0: no cap beyond --max-num-batched-tokens)");
  flags.Bool("no-greedy-argmax", &no_greedy_argmax,
             "case study #8/#9 off: greedy steps and MTP drafts gather full logits rows and scan "
             "them, instead of taking the forward's argmax");
  flags.Int("spec-disable-batch-size", &config.spec.disable_batch_size,
            "no drafts while more requests than this run in a step (0: always draft)");
  flags.Double("spec-min-acceptance", &config.spec.min_acceptance,
               "a request drafts a position only while its running chance of getting that far "
               "is at least this (0: always K drafts)");
  flags.Bool("ignore-memory-plan", &ignore_memory_plan,
             "load even when the memory plan (`inspect` prints it) says the run does not fit "
             "the memory available (swap, overcommit, a plan that overestimates)");
}

Status EngineFlags::Validate() const {
  if (config.max_num_seqs < 1) return InvalidArgument("--max-num-seqs: must be >= 1");
  if (config.max_num_batched_tokens < 1) {
    return InvalidArgument("--max-num-batched-tokens: must be >= 1");
  }
  if (config.max_model_len < 0) return InvalidArgument("--max-model-len: must not be negative");
  if (config.kv_cache_memory_gib < 0) {
    return InvalidArgument("--kv-cache-memory: must not be negative");
  }
  if (config.block_size < 1) return InvalidArgument("--block-size: must be >= 1");
  if (!(config.state_cache_memory_gib >= 0 && config.state_cache_memory_gib <= 1 << 20)) {
    return InvalidArgument("--state-cache-memory: must be in [0, 1048576] GiB");
  }
  if (config.state_checkpoint_interval < 0 || config.state_checkpoint_interval % 64 != 0 ||
      config.state_checkpoint_interval > (int64_t{1} << 40)) {
    return InvalidArgument("--state-checkpoint-interval: must be a non-negative multiple of 64");
  }
  if (config.long_prefill_token_threshold < 0) {
    return InvalidArgument("--long-prefill-token-threshold: must not be negative");
  }
  if (config.spec.disable_batch_size < 0) {
    return InvalidArgument("--spec-disable-batch-size: must not be negative");
  }
  if (!(config.spec.min_acceptance >= 0 && config.spec.min_acceptance <= 1)) {
    return InvalidArgument("--spec-min-acceptance: must be in [0, 1]");
  }
  return engine::ParseSpecFlag(spec).status();
}

engine::EngineConfig EngineFlags::ToConfig() const {
  engine::EngineConfig c = config;
  c.enable_prefix_caching = !no_enable_prefix_caching;
  c.greedy_argmax = !no_greedy_argmax;
  const Result<engine::SpecConfig> spec_config = engine::ParseSpecFlag(spec);
  CHECK(spec_config.ok()) << "Validate first: " << spec_config.status().ToString();
  c.spec.method = spec_config->method;
  c.spec.num_speculative_tokens = spec_config->num_speculative_tokens;
  c.spec.sized_by_cost = spec_config->sized_by_cost;
  return c;
}

Result<engine::MemoryPlan> PlanRun(const ModelFlags& model, const io::ModelConfig& model_config,
                                   const engine::EngineConfig& config) {
  engine::MemoryPlanOptions options;
  if (!model.weight_dtype.empty()) options.weight_dtype = ParseDTypeName(model.weight_dtype);
  if (!model.lm_head_dtype.empty()) options.lm_head_dtype = ParseDTypeName(model.lm_head_dtype);
  options.tp = static_cast<int>(model.tp);
  options.ep = model.ep;
  options.ranks_here = static_cast<int>(model.RanksOnThisMachine());
  options.engine = config;
  options.available_bytes = AvailableMemoryBytes();
  // A GGUF file is used as stored by default: the bytes its load holds, from the file.
  std::optional<model::ModelFiles> files;
  if (Result<std::string> dir = model.Dir(); dir.ok() && model::IsGgufModel(*dir)) {
    Result<model::ModelFiles> opened = model::OpenModelFiles(*dir);
    if (!opened.ok()) return opened.status();
    files = std::move(*opened);
    options.stored_weights = [&](const model::ShardLayout& shard) {
      return model::StoredWeightBytes(files->config, shard, files->checkpoint);
    };
  }
  return engine::PlanMemory(model_config, options);
}

std::optional<int> CheckMemoryPlan(const ModelFlags& model, const EngineFlags& engine,
                                   const engine::EngineConfig& config, const std::string& command) {
  // No config.json, or one that does not parse: the load says so.
  Result<std::string> dir = model.Dir();
  if (!dir.ok()) return std::nullopt;
  Result<io::ModelConfig> model_config = model::LoadModelConfigAt(*dir);
  if (!model_config.ok()) return std::nullopt;
  Result<engine::MemoryPlan> plan = PlanRun(model, *model_config, config);
  if (!plan.ok()) return InputOrRuntimeError(command, plan.status());
  std::string text = plan->ToText();
  text.pop_back();  // its last newline: the log and the error add theirs
  if (plan->fits()) {
    LogDebug("{}", text);
    return std::nullopt;
  }
  if (engine.ignore_memory_plan) {
    LogWarning("--ignore-memory-plan: loading although the run does not fit:\n{}", text);
    return std::nullopt;
  }
  return RuntimeError(
      command, Unavailable("the run does not fit in memory: it needs {:.2f} GiB, {:.2f} GiB are "
                           "available; nothing was loaded. Lower --max-model-len, --max-num-seqs "
                           "or --kv-cache-memory, pick a smaller --weight-dtype (int4, w4a8), or "
                           "load anyway with --ignore-memory-plan.\n{}",
                           plan->total() / 1073741824.0,
                           plan->options.available_bytes / 1073741824.0, text));
}

Result<std::unique_ptr<engine::Engine>> CreateEngine(model::ModelGroup& group,
                                                     const engine::EngineConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(group, config));
  const engine::EngineLayout& l = engine->layout();
  // Bytes as integers too: tests size --kv-cache-memory from kv_bytes / num_blocks.
  LogInfo(
      "engine: max_model_len {}, {} KV blocks of {} tokens ({} bytes, {:.1f} MiB), {} GDN "
      "state slots ({:.1f} MiB), prefix caching {}, speculative decoding {}",
      l.max_model_len, l.num_blocks, l.block_size, l.kv_bytes, l.kv_bytes / 1048576.0,
      l.num_state_slots, l.num_state_slots * l.state_slot_bytes / 1048576.0,
      !l.prefix_caching ? std::string("off")
      : l.state_slot_bytes == 0
          ? std::string("on")
          : fmt::format("on: {} GDN state checkpoints of {:.2f} MiB "
                        "({:.1f} MiB; {:.1f} KiB of KV per cached token), "
                        "at prompt and output ends, shared prefixes' "
                        "junctions and every {} prompt tokens",
                        l.num_checkpoints, l.state_slot_bytes / 1048576.0,
                        l.num_checkpoints * l.state_slot_bytes / 1048576.0,
                        l.kv_bytes / 1024.0 / (l.num_blocks * l.block_size), l.checkpoint_interval),
      !l.spec.enabled() ? std::string("off")
      : l.spec.disable_batch_size == 0
          ? engine::SpecName(l.spec)
          : fmt::format("{} (paused above {} requests)", engine::SpecName(l.spec),
                        l.spec.disable_batch_size));
  return engine;
}

Result<const std::vector<engine::Request*>*> StepEngine(engine::Engine& engine) {
  const std::vector<engine::Request*>& updated = engine.Step();
  const engine::SchedulerOutput& out = engine.last_schedule();
  if (out.scheduled.empty() && out.preempted_ids.empty()) {
    return Internal("an engine step scheduled nothing with {} requests running and {} waiting",
                    engine.num_running(), engine.num_waiting());
  }
  return &updated;
}

}  // namespace moeserve::cli
