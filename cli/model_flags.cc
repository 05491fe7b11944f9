#include "cli/model_flags.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include "cli/commands.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "kernels/isa.h"
#include "model/model_files.h"
#include "parallel/link_model.h"
#include "parallel/mpi_communicator.h"

namespace moeserve::cli {

void ModelFlags::Register(FlagSet& flags) {
  flags.String("model", &model, "model: a Hugging Face folder or a GGUF file (default: the embedded default model)");
  flags.String("weight-dtype", &weight_dtype,
               "bf16 | f32 | int8 (per output channel) | int4 (groups of 32) | w8a8 (int8 "
               "weights and int8 activations, one scale per token) | w4a8 (int4 weights, int8 "
               "activations) (default: as stored; a GGUF file's formats are used in place); the "
               "packed formats are quantized at load");
  flags.String("ggml-activations", &ggml_activations,
               "int8 (per block of 32 or 256, as llama.cpp) | f32: the activations of matmuls "
               "against a GGUF file's quantized blocks, used in place");
  flags.String("lm-head-dtype", &lm_head_dtype,
               "lm_head's dtype, one of --weight-dtype's (default: --weight-dtype's, but int8 "
               "under int4 and w8a8 under w4a8; a tied lm_head stays the embedding's dtype)");
  flags.Int("threads", &threads,
            "compute threads per rank (0: this machine's cores divided among its ranks)");
  flags.Int("tp", &tp, "tensor-parallel ranks: heads, expert widths and vocabulary split");
  flags.Bool("ep", &ep, "expert parallel: each rank holds num_experts / tp whole experts");
  flags.String("comm", &comm,
               "local (ranks are threads of this process) | mpi (processes under mpirun; "
               "-np must equal --tp)");
  flags.Bool("no-fused-allreduce-norm", &no_fused_allreduce_norm,
             "case study #15 off: all-reduce, residual add and RMSNorm as three passes");
  flags.Int("mc2-max-tokens", &mc2_max_tokens,
            "--ep: steps of up to this many tokens combine experts by all-to-all to the tokens' "
            "owners (MC2), larger ones by one all-reduce (0: never all-to-all)");
  flags.Bool("no-mc2", &no_mc2,
             "case study #13 off: --ep's all-to-all blocks after the expert compute instead of "
             "pipelining with it");
  flags.Bool("no-shared-expert-overlap", &no_shared_expert_overlap,
             "case study #1 off: the shared expert after the routed ones (own joins), not with "
             "them or behind the all-to-all");
  flags.String("trace", &trace,
               "write a Chrome-trace JSON of every engine step (per op, thread and rank; open in "
               "Perfetto) to this file at exit; MPI rank r > 0 writes FILE.rank<r>");
  flags.String("isa", &isa,
               "SIMD target the kernels run with, at most: avx3 (AVX-512), avx2, ... (default: "
               "$MOESERVE_ISA, else the CPU's best)");
  flags.Bool("no-fused-gdn-step", &no_fused_gdn_step,
             "case study #5 off: a GDN layer's decode tokens take layer-wide passes (conv, "
             "norms and gates on one thread, then the delta rule) instead of one fused task per "
             "key head");
  flags.Bool("no-weight-prefetch", &no_weight_prefetch,
             "case study #12 off: a rank waiting in a collective idles instead of prefetching the "
             "weights it reads next (the next layer's input projections, the MoE's router and "
             "shared expert, lm_head)");
  flags.String("comm-sim", &comm_sim,
               "LATENCY_US,GBPS: add a modelled link's time to every collective (\"\": none)");
}

Status ModelFlags::Validate() const {
  if (!weight_dtype.empty()) {
    std::optional<DType> dtype = ParseDTypeName(weight_dtype);
    if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32 && !IsPackedDType(*dtype))) {
      return InvalidArgument("--weight-dtype: '{}' is not bf16, f32, int8, int4, w8a8 or w4a8",
                             weight_dtype);
    }
  }
  if (ggml_activations != "int8" && ggml_activations != "f32") {
    return InvalidArgument("--ggml-activations: '{}' is not int8 or f32", ggml_activations);
  }
  if (!lm_head_dtype.empty()) {
    std::optional<DType> dtype = ParseDTypeName(lm_head_dtype);
    if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32 && !IsPackedDType(*dtype))) {
      return InvalidArgument("--lm-head-dtype: '{}' is not bf16, f32, int8, int4, w8a8 or w4a8",
                             lm_head_dtype);
    }
  }
  if (threads < 0) return InvalidArgument("--threads: must not be negative");
  if (!isa.empty()) {
    if (Status s = kernels::SelectIsa(isa); !s.ok())
      return InvalidArgument("--isa: {}", s.message());
  }
  if (!trace.empty()) RETURN_IF_ERROR(CheckWritableFile("--trace", trace));
  if (tp < 1 || tp > 1024) return InvalidArgument("--tp: {} is outside [1, 1024]", tp);
  if (mc2_max_tokens < 0) {
    return InvalidArgument("--mc2-max-tokens: must not be negative (got {})", mc2_max_tokens);
  }
  if (comm != "local" && comm != "mpi") {
    return InvalidArgument("--comm: '{}' is not local or mpi", comm);
  }
  if (comm == "mpi" && !parallel::MpiAvailable()) {
    return InvalidArgument("--comm mpi: this build has no Open MPI");
  }
  if (!comm_sim.empty()) {
    if (Result<parallel::LinkModel> link = parallel::ParseLinkModel(comm_sim); !link.ok()) {
      return InvalidArgument("--comm-sim: {}", link.status().message());
    }
  }
  return OkStatus();
}

Result<std::string> ModelFlags::Dir() const {
  if (!model.empty()) return model;
  std::string dir = DefaultModelDir();
  if (!std::filesystem::exists(dir + "/config.json")) {
    return NotFound(
        "no default model at {} (scripts/run.sh creates it, or: moeserve make-model "
        "--preset small --out {})",
        dir, dir);
  }
  return dir;
}

Result<std::unique_ptr<model::CausalLm>> ModelFlags::Load() const {
  RETURN_IF_ERROR(Validate());
  model::LoadOptions options;
  if (!weight_dtype.empty()) options.weight_dtype = ParseDTypeName(weight_dtype);
  if (!lm_head_dtype.empty()) options.lm_head_dtype = ParseDTypeName(lm_head_dtype);
  options.threads = static_cast<size_t>(threads);
  options.ggml_activations = ggml_activations == "f32" ? kernels::GgmlActivations::kF32
                                                       : kernels::GgmlActivations::kInt8;
  ASSIGN_OR_RETURN(const std::string dir, Dir());
  Stopwatch watch;
  Result<std::unique_ptr<model::CausalLm>> lm = model::CausalLm::Load(dir, options);
  if (!lm.ok()) return lm.status();
  LogDebug("loaded {} ({}, {} weights, SIMD {}) in {:.2f} s", dir,
           (*lm)->config().architecture_name, model::WeightFormatName((*lm)->weights()),
           kernels::ActiveIsa(), watch.ElapsedSeconds());
  if (!trace.empty()) trace::Start(trace);
  return lm;
}

Status ModelFlags::CheckParallel() const {
  if (tp == 1 && !ep) return OkStatus();
  Result<std::string> dir = Dir();
  if (!dir.ok()) return OkStatus();
  Result<io::ModelConfig> config = model::LoadModelConfigAt(*dir);
  if (!config.ok()) return OkStatus();
  for (int r = 0; r < tp; ++r) {
    RETURN_IF_ERROR(model::MakeShardLayout(*config, {r, static_cast<int>(tp), ep}).status());
  }
  if (mpi()) {
    ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world,
                     parallel::CreateMpiCommunicator());
    if (world->size() != tp) {
      return InvalidArgument("--tp {} but mpirun started {} processes (-np must equal --tp)", tp,
                             world->size());
    }
  }
  return OkStatus();
}

int64_t ModelFlags::RanksOnThisMachine() const {
  if (!mpi()) return tp;
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return local_size != nullptr ? std::max<int64_t>(1, std::atoll(local_size)) : 1;
}

Result<std::unique_ptr<model::ModelGroup>> ModelFlags::LoadGroup() const {
  RETURN_IF_ERROR(Validate());
  model::LoadOptions options;
  if (!weight_dtype.empty()) options.weight_dtype = ParseDTypeName(weight_dtype);
  if (!lm_head_dtype.empty()) options.lm_head_dtype = ParseDTypeName(lm_head_dtype);
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  options.threads = static_cast<size_t>(
      threads > 0 ? threads : std::max<int64_t>(1, cores / RanksOnThisMachine()));
  options.forward.fused_allreduce_norm = !no_fused_allreduce_norm;
  options.forward.mc2 = !no_mc2;
  options.forward.shared_expert_overlap = !no_shared_expert_overlap;
  options.forward.fused_gdn_step = !no_fused_gdn_step;
  options.forward.warm_next_weights = !no_weight_prefetch;
  options.forward.mc2_max_tokens = mc2_max_tokens;
  options.ggml_activations = ggml_activations == "f32" ? kernels::GgmlActivations::kF32
                                                       : kernels::GgmlActivations::kInt8;
  model::ParallelOptions parallel;
  parallel.tp = static_cast<int>(tp);
  parallel.ep = ep;
  parallel.comm = mpi() ? model::CommKind::kMpi : model::CommKind::kLocal;
  if (!comm_sim.empty()) parallel.link = *parallel::ParseLinkModel(comm_sim);
  ASSIGN_OR_RETURN(const std::string dir, Dir());
  Stopwatch watch;
  ASSIGN_OR_RETURN(std::unique_ptr<model::ModelGroup> group,
                   model::ModelGroup::Load(dir, options, parallel));
  const model::CausalLm& lm = group->model();
  LogDebug("loaded {} ({}, {} weights, --tp {}{}, {} threads per rank, SIMD {}) in {:.2f} s", dir,
           lm.config().architecture_name, model::WeightFormatName(lm.weights()), tp,
           ep ? " --ep" : "", options.threads, kernels::ActiveIsa(), watch.ElapsedSeconds());
  if (!trace.empty()) {
    trace::SetProcessRank(group->rank());
    trace::Start(trace);
  }
  return group;
}

LoadedModel LoadOrFollow(const ModelFlags& flags, const std::string& command,
                         FollowerSignals signals) {
  if (Status s = flags.CheckParallel(); !s.ok()) return {nullptr, UsageError(command, s)};
  Result<std::unique_ptr<model::ModelGroup>> loaded = flags.LoadGroup();
  if (!loaded.ok()) return {nullptr, RuntimeError(command, loaded.status())};
  if (!(*loaded)->leader()) {  // an MPI rank other than 0: rank 0 drives it
    if (signals == FollowerSignals::kBlock) {
      sigset_t stop_signals;
      sigemptyset(&stop_signals);
      sigaddset(&stop_signals, SIGINT);
      sigaddset(&stop_signals, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    }
    (*loaded)->Follow();
    return {nullptr, 0};
  }
  return {std::move(*loaded), 0};
}

namespace {

model::CacheSizes SingleSequenceSizes(int64_t max_positions) {
  model::CacheSizes sizes;
  sizes.num_blocks = (max_positions + sizes.block_size - 1) / sizes.block_size;
  return sizes;
}

}  // namespace

SingleSequence::SingleSequence(const io::ModelConfig& config, int64_t max_positions)
    : cache(config, SingleSequenceSizes(max_positions)), block_table(cache.sizes().num_blocks) {
  std::iota(block_table.begin(), block_table.end(), 0);
  cache.ResetSlot(0);
}

Result<std::vector<int32_t>> ParseTokenIds(const std::string& text, int64_t vocab_size) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) {
      return InvalidArgument("--token-ids: '{}' is not an integer", item);
    }
    if (v < 0 || v >= vocab_size) {
      return InvalidArgument("--token-ids: {} is outside the vocabulary [0, {})", v, vocab_size);
    }
    ids.push_back(static_cast<int32_t>(v));
    start = comma + 1;
  }
  return ids;
}

Status WriteF32File(const std::string& path, const float* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return IoError("cannot write {}", path);
  const size_t written = std::fwrite(data, sizeof(float), n, f);
  const bool closed = std::fclose(f) == 0;
  if (written != n || !closed) return IoError("writing {} failed", path);
  return OkStatus();
}

}  // namespace moeserve::cli
