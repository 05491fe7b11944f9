// The case study's optimizations that moeserve can switch off (the --no-... flags), as a list
// that `bench latency --ablation` walks: TPOT with everything as configured, then with each one
// off in turn (docs/performance.md, "Ablation").
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/model_config.h"
#include "model/layer_context.h"

namespace moeserve::cli {

// What a run is configured with: the forward's switches (every rank's) and the engine's.
struct RunSwitches {
  model::ForwardOptions forward;
  engine::EngineConfig engine;
};

struct Optimization {
  std::string name;  // "#15 fused all-reduce + add + RMSNorm": case-study item and what it is
  std::string flag;  // how to switch it off by hand: "--no-fused-allreduce-norm"
  // `on` with this optimization off.
  RunSwitches (*off)(RunSwitches on);
};

// The optimizations that are on in `on` and do something for this model and a group of `ranks`
// ranks (--ep: `expert_parallel`), in the case study's order.
std::vector<Optimization> AblatableOptimizations(const RunSwitches& on,
                                                 const io::ModelConfig& config, int ranks,
                                                 bool expert_parallel);

}  // namespace moeserve::cli
