#include "cli/ablation.h"

namespace moeserve::cli {

std::vector<Optimization> AblatableOptimizations(const RunSwitches& on,
                                                 const io::ModelConfig& config, int ranks,
                                                 bool expert_parallel) {
  std::vector<Optimization> out;
  const model::ForwardOptions& f = on.forward;
  if (f.shared_expert_overlap && config.shared_expert_intermediate_size > 0) {
    out.push_back({"#1 shared expert overlapped with the routed ones", "--no-shared-expert-overlap",
                   [](RunSwitches s) {
                     s.forward.shared_expert_overlap = false;
                     return s;
                   }});
  }
  if (f.fused_gdn_step && config.is_hybrid()) {
    out.push_back(
        {"#5 fused GDN decode step per key head", "--no-fused-gdn-step", [](RunSwitches s) {
           s.forward.fused_gdn_step = false;
           return s;
         }});
  }
  if (on.engine.greedy_argmax) {
    out.push_back({"#8/#9 greedy argmax in the forward (no full logits)", "--no-greedy-argmax",
                   [](RunSwitches s) {
                     s.engine.greedy_argmax = false;
                     return s;
                   }});
  }
  // The waits it uses are the ranks' collectives.
  if (f.warm_next_weights && ranks > 1) {
    out.push_back({"#12 next weights prefetched while ranks wait",
                   "--no-weight-prefetch", [](RunSwitches s) {
                     s.forward.warm_next_weights = false;
                     return s;
                   }});
  }
  // MC2 pipelines --ep's all-to-all: only steps small enough to take the all-to-all path.
  if (expert_parallel && ranks > 1 && config.num_experts > 0 && f.mc2 && f.mc2_max_tokens > 0) {
    out.push_back(
        {"#13 MC2: all-to-all pipelined with expert compute", "--no-mc2", [](RunSwitches s) {
           s.forward.mc2 = false;
           return s;
         }});
  }
  // With one rank the fused path still saves two passes over the rows (add, then norm).
  if (f.fused_allreduce_norm) {
    out.push_back({"#15 fused all-reduce + residual add + RMSNorm", "--no-fused-allreduce-norm",
                   [](RunSwitches s) {
                     s.forward.fused_allreduce_norm = false;
                     return s;
                   }});
  }
  if (on.engine.spec.enabled()) {
    out.push_back({"#17 speculative decoding (" + engine::SpecName(on.engine.spec) + ")",
                   "--spec none", [](RunSwitches s) {
                     s.engine.spec.method = engine::SpecMethod::kNone;
                     s.engine.spec.num_speculative_tokens = 0;
                     return s;
                   }});
  }
  return out;
}

}  // namespace moeserve::cli
