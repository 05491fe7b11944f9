// moeserve inspect: what a model folder holds and how fast it can decode on this machine.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/isa.h"
#include "kernels/memory_bandwidth.h"
#include "model/model_files.h"
#include "model/checkpoint_layout.h"
#include "model/weight_bytes.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "inspect";

struct Options {
  ModelFlags model;    // --model, and what the memory plan reads: --weight-dtype, --tp, --ep
  EngineFlags engine;  // the memory plan's --max-model-len, --max-num-seqs, ...
  bool json = false;
  double bandwidth_gbs = 0.0;  // 0: measure
  int64_t threads = 0;
};

// "3 × linear_attention, full_attention" style run-length summary of the layer types.
std::string LayerSummary(const std::vector<io::LayerType>& types) {
  std::string out;
  for (size_t i = 0; i < types.size();) {
    size_t j = i;
    while (j < types.size() && types[j] == types[i]) ++j;
    if (!out.empty()) out += ", ";
    out += j - i > 1 ? fmt::format("{} x {}", j - i, io::LayerTypeName(types[i]))
                     : std::string(io::LayerTypeName(types[i]));
    i = j;
  }
  return out;
}

std::string Count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", n * 1e-9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", n * 1e-6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n * 1e-3);
  return std::to_string(n);
}

std::string Bytes(int64_t n) {
  if (n >= 1'000'000'000'000) return fmt::format("{:.2f} TB", n * 1e-12);
  if (n >= 1'000'000'000) return fmt::format("{:.2f} GB", n * 1e-9);
  if (n >= 1'000'000) return fmt::format("{:.1f} MB", n * 1e-6);
  return fmt::format("{:.1f} KB", n * 1e-3);
}

// `plan` is the memory plan, or why the flags (all defaults) give none.
Status Inspect(const Options& o, const io::ModelConfig& config,
               const Result<engine::MemoryPlan>& plan) {
  const std::string& dir = o.model.model;
  // A folder with config.json alone (make-model --no-weights, a download not yet done) still
  // gets its counts and memory plan, the stored dtype taken from torch_dtype.
  // A GGUF file is its own checkpoint (model_files.h).
  std::optional<io::SafetensorsCheckpoint> checkpoint;
  if (Result<model::ModelFiles> opened = model::OpenModelFiles(dir); opened.ok()) {
    checkpoint = std::move(opened->checkpoint);
  } else if (opened.status().code() != StatusCode::kNotFound) {
    return opened.status();
  }
  // Bytes per weight as stored (a checkpoint may mix dtypes; GGML's block formats hold their
  // scales inside their blocks).
  std::map<std::string, double> element_size;
  std::map<std::string, int64_t> dtype_bytes;
  if (checkpoint) {
    ASSIGN_OR_RETURN(std::vector<model::ResolvedTensor> tensors,
                     model::ResolveCheckpoint(config, *checkpoint));
    for (const model::ResolvedTensor& t : tensors) {
      element_size[t.spec.name] =
          static_cast<double>(t.stored->bytes.size()) / static_cast<double>(t.stored->numel());
      dtype_bytes[std::string(DTypeName(t.stored->dtype))] += t.stored->bytes.size();
    }
  }
  const size_t config_element_size = DTypeSize(model::ConfigMatrixDType(config));
  // Bytes per token as stored, or as --weight-dtype will hold the weights.
  const bool converted = !o.model.weight_dtype.empty() && plan.ok();
  const model::ModelStats stats =
      model::ComputeModelStats(config, [&](const model::CheckpointTensor& t) -> double {
        if (converted) {
          return model::LoadedBytesPerWeight(t, plan->matrix_dtype, plan->base_dtype,
                                             plan->lm_head_dtype);
        }
        return checkpoint ? element_size.at(t.name) : static_cast<double>(config_element_size);
      });

  double bandwidth = o.bandwidth_gbs;
  bool measured = false;
  if (bandwidth <= 0.0) {
    const size_t threads = o.threads > 0 ? static_cast<size_t>(o.threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
    ThreadPool pool(threads);
    bandwidth = kernels::MeasureReadBandwidth(pool).gb_per_s;
    measured = true;
  }
  const double roofline = bandwidth * 1e9 / static_cast<double>(stats.bytes_per_token);

  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = dir;
    j["architecture"] = config.architecture_name;
    std::vector<std::string> types;
    for (io::LayerType t : config.layer_types) types.emplace_back(io::LayerTypeName(t));
    j["layer_types"] = types;
    j["num_hidden_layers"] = config.num_hidden_layers;
    j["hidden_size"] = config.hidden_size;
    j["vocab_size"] = config.vocab_size;
    j["num_experts"] = config.num_experts;
    j["num_experts_per_tok"] = config.num_experts_per_tok;
    j["num_mtp_layers"] = config.num_mtp_layers;
    j["params_total"] = stats.params_total;
    j["params_active"] = stats.params_active;
    j["params_mtp"] = stats.params_mtp;
    j["bytes_per_token"] = stats.bytes_per_token;
    j["weight_bytes"] = checkpoint ? checkpoint->total_bytes() : 0;
    j["bandwidth_gbs"] = bandwidth;
    j["bandwidth_measured"] = measured;
    j["roofline_tok_s"] = roofline;
    j["isa"] = kernels::ActiveIsa();
    j["isas_available"] = kernels::AvailableIsas();
    nlohmann::ordered_json m;
    if (!plan.ok()) {
      m["error"] = plan.status().message();
    } else {
      m["weight_dtype"] = DTypeName(plan->matrix_dtype);
      m["max_model_len"] = plan->layout.max_model_len;
      m["max_num_seqs"] = plan->options.engine.max_num_seqs;
      m["ranks_here"] = plan->options.ranks_here;
      for (int k = 0; k < model::kNumWeightKinds; ++k) {
        const auto kind = static_cast<model::WeightKind>(k);
        m["weights"][std::string(model::WeightKindName(kind))] = plan->weights[kind];
      }
      m["weights_total"] = plan->weights.total();
      m["kv_cache"] = plan->kv_bytes;
      m["kv_blocks"] = plan->layout.num_blocks;
      m["gdn_state_slots"] = plan->state_bytes;
      m["gdn_state_checkpoints"] = plan->checkpoint_bytes;
      m["num_gdn_state_checkpoints"] = plan->layout.num_checkpoints;
      m["scratch"] = plan->scratch_bytes;
      m["runtime_reserve"] = plan->reserve_bytes;
      m["total"] = plan->total();
      m["available"] = plan->options.available_bytes;
      m["fits"] = plan->fits();
    }
    j["memory_plan"] = std::move(m);
    std::puts(j.dump(2).c_str());
    return OkStatus();
  }
  std::string dtypes;
  for (const auto& [name, bytes] : dtype_bytes) {
    dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", name, Bytes(bytes));
  }
  fmt::print("model            {}\n", dir);
  fmt::print("architecture     {} ({})\n", config.architecture_name, config.model_type);
  fmt::print("layers           {}: {}\n", config.num_hidden_layers,
             LayerSummary(config.layer_types));
  fmt::print("hidden size      {}, vocab {}\n", config.hidden_size, config.vocab_size);
  fmt::print("attention        {} q heads x {} ({} kv heads){}\n", config.num_attention_heads,
             config.head_dim, config.num_key_value_heads,
             config.attn_output_gate ? ", output gate" : "");
  if (config.num_layers_of(io::LayerType::kLinearAttention) > 0) {
    fmt::print("gated deltanet   {} k heads x {}, {} v heads x {}, conv {}\n",
               config.linear_num_key_heads, config.linear_key_head_dim,
               config.linear_num_value_heads, config.linear_value_head_dim,
               config.linear_conv_kernel_dim);
  }
  if (config.num_experts > 0) {
    fmt::print("experts          {} routed, top {}, width {}{}\n", config.num_experts,
               config.num_experts_per_tok, config.moe_intermediate_size,
               config.shared_expert_intermediate_size > 0
                   ? fmt::format(", shared expert width {}", config.shared_expert_intermediate_size)
                   : "");
  }
  fmt::print("mtp layers       {}\n", config.num_mtp_layers);
  fmt::print("params total     {} ({})\n", Count(stats.params_total), stats.params_total);
  fmt::print("params active    {} ({}) per token\n", Count(stats.params_active),
             stats.params_active);
  if (stats.params_mtp > 0) {
    fmt::print("params mtp       {} ({})\n", Count(stats.params_mtp), stats.params_mtp);
  }
  if (checkpoint) {
    fmt::print("weights          {} in {} file(s): {}\n", Bytes(checkpoint->total_bytes()),
               checkpoint->num_files(), dtypes);
  } else {
    fmt::print("weights          none in the folder (config.json only; {} assumed)\n",
               config.torch_dtype.empty() ? "bfloat16" : config.torch_dtype);
  }
  fmt::print("bytes per token  {} ({}) read per decoded token{}\n", Bytes(stats.bytes_per_token),
             stats.bytes_per_token,
             converted ? fmt::format(" at {}", DTypeName(plan->matrix_dtype)) : "");
  fmt::print("bandwidth        {:.1f} GB/s ({})\n", bandwidth,
             measured ? "measured read bandwidth, all threads" : "given by --bandwidth");
  fmt::print("roofline decode  {:.1f} tokens/s (bandwidth / bytes per token)\n", roofline);
  std::string available;
  for (const std::string& isa : kernels::AvailableIsas()) {
    available += (available.empty() ? "" : ", ") + isa;
  }
  fmt::print("SIMD             {} (this CPU and build: {}; --isa / MOESERVE_ISA restrict it)\n",
             kernels::ActiveIsa(), available);
  if (plan.ok()) {
    fmt::print("{}", plan->ToText());
  } else {
    fmt::print("memory plan      none with the default flags: {}\n", plan.status().message());
  }
  return OkStatus();
}

}  // namespace

int RunInspect(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve inspect",
                "Prints a model's architecture, layer types, parameter counts (total, active per\n"
                "token), weight bytes read per decoded token, the roofline decode rate, and the\n"
                "memory plan of a run with the flags below: weights by kind at --weight-dtype,\n"
                "KV cache, GDN state slots and checkpoints, scratch, against the memory\n"
                "available. serve, generate, chat and bench latency refuse a run whose plan does\n"
                "not fit before loading. A folder with config.json alone is enough.");
  flags.String("model", &o.model.model, "model: a Hugging Face folder or a GGUF file (default: the embedded default model)");
  flags.Bool("json", &o.json, "print JSON");
  flags.Double("bandwidth", &o.bandwidth_gbs, "read bandwidth in GB/s (0: measure it)");
  flags.Int("threads", &o.threads, "threads for the bandwidth probe (0: all cores)");
  flags.String("weight-dtype", &o.model.weight_dtype,
               "the memory plan's weights: bf16 | f32 | int8 | int4 | w8a8 | w4a8 (default: as "
               "config.json's torch_dtype)");
  flags.String("lm-head-dtype", &o.model.lm_head_dtype,
               "the memory plan's lm_head: one of --weight-dtype's (default: as --weight-dtype "
               "implies)");
  flags.Int("tp", &o.model.tp, "the memory plan's tensor-parallel ranks (all on this machine)");
  flags.Bool("ep", &o.model.ep, "the memory plan's expert parallelism");
  o.engine.RegisterSizing(flags);
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  if (flags.WasSet("bandwidth") && o.bandwidth_gbs <= 0.0) {
    return UsageError(kCommand, InvalidArgument("--bandwidth: must be positive"));
  }
  for (Status s : {o.model.Validate(), o.engine.Validate()}) {
    if (!s.ok()) return UsageError(kCommand, s);
  }
  if (o.model.model.empty()) {
    o.model.model = DefaultModelDir();
    if (!std::filesystem::exists(o.model.model + "/config.json")) {
      return RuntimeError(kCommand, NotFound("no default model at {} (scripts/run.sh creates it, "
                                             "or: moeserve make-model --preset small --out {})",
                                             o.model.model, o.model.model));
    }
  }
  Result<io::ModelConfig> config = model::LoadModelConfigAt(o.model.model);
  if (!config.ok()) return RuntimeError(kCommand, config.status());
  // What the flags ask that the model refuses (a KV cache that cannot hold one request of
  // --max-model-len, a split that does not divide) is a usage error, as it is for serve; with
  // every flag at its default (a long context's KV cache past the default 4 GiB) the rest is
  // printed, with the reason in the plan's place.
  Result<engine::MemoryPlan> plan = PlanRun(o.model, *config, o.engine.ToConfig());
  bool plan_flags = false;
  for (const FlagSet::Doc& f : flags.Docs()) {
    plan_flags |= f.name != "model" && f.name != "json" && f.name != "bandwidth" &&
                  f.name != "threads" && flags.WasSet(f.name);
  }
  if (!plan.ok() && (plan_flags || plan.status().code() != StatusCode::kInvalidArgument)) {
    return InputOrRuntimeError(kCommand, plan.status());
  }
  Status s = Inspect(o, *config, plan);
  if (!s.ok()) return RuntimeError(kCommand, s);
  return 0;
}

}  // namespace moeserve::cli
