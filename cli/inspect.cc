// moeserve inspect: what a model folder holds and how fast it can decode on this machine.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/isa.h"
#include "kernels/memory_bandwidth.h"
#include "model/checkpoint_layout.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "inspect";

struct Options {
  std::string model;
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
  if (n >= 1'000'000'000) return fmt::format("{:.2f} GB", n * 1e-9);
  if (n >= 1'000'000) return fmt::format("{:.1f} MB", n * 1e-6);
  return fmt::format("{:.1f} KB", n * 1e-3);
}

Status Inspect(const Options& o) {
  ASSIGN_OR_RETURN(io::ModelConfig config, io::LoadModelConfig(o.model));
  ASSIGN_OR_RETURN(io::SafetensorsCheckpoint checkpoint, io::SafetensorsCheckpoint::Open(o.model));
  ASSIGN_OR_RETURN(std::vector<model::ResolvedTensor> tensors,
                   model::ResolveCheckpoint(config, checkpoint));

  // Bytes per element as stored, tensor by tensor (a checkpoint may mix bf16 and f32).
  std::map<std::string, size_t> element_size;
  std::map<std::string, int64_t> dtype_bytes;
  for (const model::ResolvedTensor& t : tensors) {
    element_size[t.spec.name] = DTypeSize(t.stored->dtype);
    dtype_bytes[std::string(DTypeName(t.stored->dtype))] += t.stored->bytes.size();
  }
  const model::ModelStats stats = model::ComputeModelStats(
      config, [&](const model::CheckpointTensor& t) { return element_size.at(t.name); });

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
    j["model"] = o.model;
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
    j["weight_bytes"] = checkpoint.total_bytes();
    j["bandwidth_gbs"] = bandwidth;
    j["bandwidth_measured"] = measured;
    j["roofline_tok_s"] = roofline;
    j["isa"] = kernels::ActiveIsa();
    j["isas_available"] = kernels::AvailableIsas();
    std::puts(j.dump(2).c_str());
    return OkStatus();
  }
  std::string dtypes;
  for (const auto& [name, bytes] : dtype_bytes) {
    dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", name, Bytes(bytes));
  }
  fmt::print("model            {}\n", o.model);
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
  fmt::print("weights          {} in {} file(s): {}\n", Bytes(checkpoint.total_bytes()),
             checkpoint.num_files(), dtypes);
  fmt::print("bytes per token  {} ({}) read per decoded token\n", Bytes(stats.bytes_per_token),
             stats.bytes_per_token);
  fmt::print("bandwidth        {:.1f} GB/s ({})\n", bandwidth,
             measured ? "measured read bandwidth, all threads" : "given by --bandwidth");
  fmt::print("roofline decode  {:.1f} tokens/s (bandwidth / bytes per token)\n", roofline);
  std::string available;
  for (const std::string& isa : kernels::AvailableIsas()) {
    available += (available.empty() ? "" : ", ") + isa;
  }
  fmt::print("SIMD             {} (this CPU and build: {}; --isa / MOESERVE_ISA restrict it)\n",
             kernels::ActiveIsa(), available);
  return OkStatus();
}

}  // namespace

int RunInspect(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve inspect",
                "Prints a model's architecture, layer types, parameter counts (total, active per\n"
                "token), weight bytes read per decoded token and the roofline decode rate.");
  flags.String("model", &o.model, "model folder (default: the embedded default model)");
  flags.Bool("json", &o.json, "print JSON");
  flags.Double("bandwidth", &o.bandwidth_gbs, "read bandwidth in GB/s (0: measure it)");
  flags.Int("threads", &o.threads, "threads for the bandwidth probe (0: all cores)");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  if (flags.WasSet("bandwidth") && o.bandwidth_gbs <= 0.0) {
    return UsageError(kCommand, InvalidArgument("--bandwidth: must be positive"));
  }
  if (o.model.empty()) {
    o.model = DefaultModelDir();
    if (!std::filesystem::exists(o.model + "/config.json")) {
      return RuntimeError(kCommand, NotFound("no default model at {} (scripts/run.sh creates it, "
                                             "or: moeserve make-model --preset small --out {})",
                                             o.model, o.model));
    }
  }
  Status s = Inspect(o);
  if (!s.ok()) return RuntimeError(kCommand, s);
  return 0;
}

}  // namespace moeserve::cli
