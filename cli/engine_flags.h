// vLLM's engine arguments (docs/cli.md) for the subcommands that run the engine (generate, bench
// latency, later serve), and the engine they create. The flags' defaults are EngineConfig's, so
// `--help` shows what the engine does when a flag is not given; 0 means "derive" where
// EngineConfig says so (--max-model-len, --kv-cache-memory, --long-prefill-token-threshold).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "cli/model_flags.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "model/causal_lm.h"
#include "model/model_group.h"

namespace moeserve::cli {

struct EngineFlags {
  engine::EngineConfig config;  // the values flags write to, EngineConfig's defaults until set
  bool no_enable_prefix_caching = false;  // vLLM's spelling of the negated switch
  bool no_greedy_argmax = false;          // --no-greedy-argmax (case study #8/#9 off)
  std::string spec = "auto";              // --spec mtp:K | ngram:K | mtp:auto | ngram:auto | auto | none
  bool ignore_memory_plan = false;        // --ignore-memory-plan

  // Every flag, for the subcommands that run the engine.
  void Register(FlagSet& flags);
  // Only those that size the engine's memory (inspect's memory plan).
  void RegisterSizing(FlagSet& flags);
  // Checks each value on its own (a usage error naming the flag); what depends on the model
  // (--max-model-len against max_position_embeddings, the cache fitting one request) is
  // checked by Engine::Create.
  Status Validate() const;
  // The config the flags describe (after Validate).
  engine::EngineConfig ToConfig() const;
};

// The memory plan (engine/memory_plan.h) of a run of the model flags' folder, whose config.json
// is `model_config`, with the engine `config`, against this machine's MemAvailable. An
// InvalidArgument is what the flags ask that the model refuses (as the load would).
Result<engine::MemoryPlan> PlanRun(const ModelFlags& model, const io::ModelConfig& model_config,
                                   const engine::EngineConfig& config);

// Before a subcommand loads the weights (after its flags are validated): the run's memory plan,
// logged, and its refusal when
//   the plan does not fit the memory available    -> exit 1, the plan in the message (unless
//                                                    --ignore-memory-plan);
//   the engine would refuse the flags              -> exit 2, as after a load (a usage error).
// nullopt to go on; a config.json that does not load is left to the load to report.
std::optional<int> CheckMemoryPlan(const ModelFlags& model, const EngineFlags& engine,
                                   const engine::EngineConfig& config, const std::string& command);

// Creates the engine for `model` and logs its layout (KV blocks and bytes, GDN state slots,
// max_model_len, prefix caching). A config the model rejects came from the user's flags: the
// caller reports the error as a usage error (exit 2).
Result<std::unique_ptr<engine::Engine>> CreateEngine(model::ModelGroup& group,
                                                     const engine::EngineConfig& config);

// One engine step: the requests that got a token (Engine::Step). An Internal error when the step
// neither scheduled nor preempted anything with requests unfinished: stepping on would spin
// forever.
Result<const std::vector<engine::Request*>*> StepEngine(engine::Engine& engine);

}  // namespace moeserve::cli
