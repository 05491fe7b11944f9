// Flags shared by the subcommands that run a model (logits, generate, chat, serve, bench latency),
// and the loading they drive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "model/model_group.h"

namespace moeserve::cli {

struct ModelFlags {
  std::string model;           // "" = the default model
  std::string weight_dtype;    // "" = as the checkpoint
  std::string lm_head_dtype;   // "" = as --weight-dtype implies (model/weights.h: MatrixDType)
  std::string ggml_activations = "int8";  // int8 | f32 (kernels/matmul.h: GgmlActivations)
  int64_t threads = 0;         // per rank; 0 = the cores divided among this machine's ranks
  int64_t tp = 1;              // --tp: tensor-parallel ranks
  bool ep = false;             // --ep: experts split whole across the ranks
  std::string comm = "local";  // --comm local | mpi
  std::string comm_sim;        // --comm-sim LATENCY_US,GBPS ("" = none)
  std::string trace;           // --trace FILE: Chrome-trace JSON of every step ("" = none)
  std::string isa;             // --isa: restricts SIMD dispatch ("" = $MOESERVE_ISA or the best)
  bool no_fused_allreduce_norm = false;
  bool no_mc2 = false;
  bool no_shared_expert_overlap = false;
  bool no_fused_gdn_step = false;
  bool no_weight_prefetch = false;
  int64_t mc2_max_tokens = model::ForwardOptions{}.mc2_max_tokens;

  void Register(FlagSet& flags);
  // Checks the flag values (a usage error names the flag) and applies --isa.
  Status Validate() const;
  // The model folder: --model, else the default model's (NotFound when that does not exist).
  Result<std::string> Dir() const;
  // Loads the model (after Validate) as one rank, logging what was loaded and how long it took.
  Result<std::unique_ptr<model::CausalLm>> Load() const;
  // The --tp / --ep split against the model's config.json, and --tp against mpirun's process
  // count: an error names the numbers (a usage error). A config.json that does not load is left
  // to the load to report.
  Status CheckParallel() const;
  // Loads this process's ranks of --tp / --ep (after Validate). Under --comm mpi a process other
  // than rank 0 gets a group that is not the leader: it calls Follow() and exits.
  Result<std::unique_ptr<model::ModelGroup>> LoadGroup() const;
  bool mpi() const { return comm == "mpi"; }
  // Ranks sharing this machine's cores: --tp under local, mpirun's per-node count under mpi.
  int64_t RanksOnThisMachine() const;
};

// What an MPI rank other than 0 does with SIGINT / SIGTERM while it follows rank 0.
enum class FollowerSignals {
  kDefault,  // they end it, as they end rank 0 (mpirun forwards them to every rank)
  kBlock,    // blocked: the rank outlasts rank 0's graceful shutdown and is stopped by it (serve)
};

// What LoadOrFollow leaves the command: the group this process drives, or, when it is null, the
// code the command exits with at once.
struct LoadedModel {
  std::unique_ptr<model::ModelGroup> group;
  int exit_code = 0;
};

// The load every command that runs the model starts with (after its flags are validated):
//   CheckParallel fails       -> exit 2, "moeserve <command>: <message>" (a usage error);
//   LoadGroup fails           -> exit 1, the same line (a runtime failure);
//   an MPI rank other than 0  -> Follow()s rank 0's steps until rank 0 stops them, exit 0;
//   rank 0 or a local run     -> the group, to drive.
LoadedModel LoadOrFollow(const ModelFlags& flags, const std::string& command,
                         FollowerSignals signals = FollowerSignals::kDefault);

// The cache of one sequence for the subcommands that run a single prompt: enough KV blocks for
// max_positions, an identity block table, GDN state slot 0 zeroed.
struct SingleSequence {
  SingleSequence(const io::ModelConfig& config, int64_t max_positions);
  // The input for `n` new tokens at `first_pos`.
  model::SequenceInput Input(const int32_t* tokens, int64_t n, int64_t first_pos) const {
    return {tokens, n, first_pos, block_table.data(), 0};
  }
  model::ModelCache cache;
  std::vector<int32_t> block_table;
};

// Parses "1,2,3" into token ids, each in [0, vocab_size).
Result<std::vector<int32_t>> ParseTokenIds(const std::string& text, int64_t vocab_size);

// Writes floats as raw little-endian f32.
Status WriteF32File(const std::string& path, const float* data, size_t n);

}  // namespace moeserve::cli
