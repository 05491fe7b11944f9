// moeserve make-model: a Hugging Face model folder with random weights, for tests and
// benchmarks. Deterministic for a seed: each tensor's values depend only on (seed, tensor name),
// not on thread count or tensor order.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/inflate_model.h"
#include "cli/make_model_corpus.h"
#include "cli/preset_files.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/json.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace moeserve::cli {
namespace {

using io::Architecture;
using io::ModelConfig;
using model::CheckpointTensor;
using model::TensorKind;

constexpr char kCommand[] = "make-model";

// ---- Presets ----

// What the shapes of a preset depend on: the hybrid models have GDN layers and a shared expert,
// qwen3_moe routed experts only, the dense ones neither.
enum class Family { kHybrid, kMoe, kDense };

struct ArchitectureTraits {
  Architecture arch;
  const char* architecture_name;  // config.json "architectures"
  const char* model_type;
  Family family;
  double rope_theta;
};

constexpr ArchitectureTraits kArchitectures[] = {
    {Architecture::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next", Family::kHybrid, 1e7},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text",
     Family::kHybrid, 1e7},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", Family::kMoe, 1e6},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3", Family::kDense, 1e6},
    {Architecture::kLlama, "LlamaForCausalLM", "llama", Family::kDense, 5e5},
};

// The shapes of one preset for one family; 0 where the family has no such part.
struct PresetShapes {
  const char* preset;
  Family family;
  int64_t vocab, hidden, layers;
  int64_t heads, kv_heads, head_dim;               // full attention
  int64_t gdn_k_heads, gdn_v_heads, gdn_head_dim;  // Gated DeltaNet (key and value heads alike)
  int64_t mlp_width;                               // dense MLP (intermediate_size)
  int64_t experts, top_k, expert_width, shared_expert_width;
  int64_t max_positions;
};

// tiny: a few MB, for tests (the hybrid row has the shapes of testdata/tiny-qwen3next). small:
// ~100 M parameters, the demo model. bench: per-layer shapes of the real models with 8 layers and
// 32 experts top-8 -- hybrid: Qwen3-Next / Qwen3.5-35B-A3B (16 q heads x 256, GDN 16 k / 32 v
// heads x 128, experts of width 512); moe: Qwen3-30B-A3B; dense: Qwen3-1.7B.
// Columns as PresetShapes: preset, family, vocab, hidden, layers | attention heads, KV heads,
// head dim | GDN key heads, value heads, head dim | MLP width | experts, top-k, expert width,
// shared expert width | max positions.
using enum Family;
// clang-format off
constexpr PresetShapes kPresets[] = {
    {"tiny",  kHybrid, 512,   256,  4,  4,  2, 64,  2,  4,  64,  512,  8,  2, 128, 128, 4096},
    {"tiny",  kMoe,    512,   256,  4,  4,  2, 64,  0,  0,  0,   512,  8,  2, 128, 0,   4096},
    {"tiny",  kDense,  512,   256,  4,  4,  2, 64,  0,  0,  0,   512,  0,  0, 0,   0,   4096},
    {"small", kHybrid, 8192,  768,  8,  8,  2, 128, 4,  8,  128, 2048, 16, 4, 192, 512, 32768},
    {"small", kMoe,    8192,  768,  8,  12, 4, 64,  0,  0,  0,   2048, 16, 4, 256, 0,   32768},
    {"small", kDense,  8192,  768,  14, 12, 4, 64,  0,  0,  0,   2048, 0,  0, 0,   0,   32768},
    {"bench", kHybrid, 32768, 2048, 8,  16, 2, 256, 16, 32, 128, 6144, 32, 8, 512, 512, 32768},
    {"bench", kMoe,    32768, 2048, 8,  32, 4, 128, 0,  0,  0,   6144, 32, 8, 768, 0,   32768},
    {"bench", kDense,  32768, 2048, 8,  16, 8, 128, 0,  0,  0,   6144, 0,  0, 0,   0,   32768},
};
// clang-format on

// The shapes of `preset` for the family, or null when no preset has that name.
const PresetShapes* FindPreset(const std::string& preset, Family family) {
  for (const PresetShapes& p : kPresets) {
    if (p.preset == preset && p.family == family) return &p;
  }
  return nullptr;
}

const ArchitectureTraits& TraitsOf(Architecture arch) {
  for (const ArchitectureTraits& t : kArchitectures) {
    if (t.arch == arch) return t;
  }
  CHECK(false) << "no traits for architecture " << static_cast<int>(arch);
  return kArchitectures[0];
}

// The config.json fields every preset shares, from its architecture.
ModelConfig ArchitectureConfig(const ArchitectureTraits& traits) {
  const bool hybrid = traits.family == Family::kHybrid;
  ModelConfig c;
  c.architecture = traits.arch;
  c.architecture_name = traits.architecture_name;
  c.model_type = traits.model_type;
  c.one_centered_norm = hybrid;
  c.attn_output_gate = hybrid;
  c.qk_norm = traits.arch != Architecture::kLlama;
  c.rope_theta = traits.rope_theta;
  c.partial_rotary_factor = hybrid ? 0.25 : 1.0;
  c.torch_dtype = "bfloat16";
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig PresetConfig(const ArchitectureTraits& traits, const PresetShapes& p) {
  const bool hybrid = traits.family == Family::kHybrid;
  ModelConfig c = ArchitectureConfig(traits);
  c.max_position_embeddings = p.max_positions;
  c.vocab_size = p.vocab;
  c.hidden_size = p.hidden;
  c.num_hidden_layers = p.layers;
  c.num_attention_heads = p.heads;
  c.num_key_value_heads = p.kv_heads;
  c.head_dim = p.head_dim;
  c.linear_num_key_heads = p.gdn_k_heads;
  c.linear_num_value_heads = p.gdn_v_heads;
  c.linear_key_head_dim = c.linear_value_head_dim = p.gdn_head_dim;
  c.intermediate_size = p.mlp_width;
  c.num_experts = p.experts;
  c.num_experts_per_tok = p.top_k;
  c.moe_intermediate_size = p.expert_width;
  c.shared_expert_intermediate_size = p.shared_expert_width;
  if (hybrid) {
    c.linear_conv_kernel_dim = 4;
    c.full_attention_interval = 4;
    c.num_mtp_layers = 1;
  }
  return c;
}

// ---- Real shapes ----

// Which chat template a real-shape preset writes with the Qwen3 tokenizer.
enum class ChatTemplateSource {
  kQwen3,    // tokenizer_config.json's own (hermes-style JSON tool calls): Qwen3, Qwen3-Next
  kQwen3_5,  // testdata/chat-templates/qwen3.5.jinja (XML tool calls): the Qwen3.5 family
};

// A published configuration: the config.json of the model on the Hub, as checked against copies
// of the published files and training recipes that restate them (docs/spec/model.md §1.3 lists
// the values and the sources).
struct PublishedModel {
  const char* preset;
  Architecture arch;
  int64_t vocab, hidden, layers;
  int64_t heads, kv_heads, head_dim;               // full attention
  int64_t gdn_k_heads, gdn_v_heads, gdn_head_dim;  // Gated DeltaNet (0: none)
  int64_t conv_kernel, full_attention_interval;    // Gated DeltaNet
  int64_t mlp_width;                               // intermediate_size (0: absent)
  int64_t experts, top_k, expert_width, shared_expert_width;
  int64_t mtp_layers, max_positions;
  double rope_theta, partial_rotary_factor;
  ChatTemplateSource chat_template;
};

// Every field named (0: the model has no such part).
// clang-format off
constexpr PublishedModel kPublishedModels[] = {
    {.preset = "qwen3-30b-a3b", .arch = Architecture::kQwen3Moe,
     .vocab = 151936, .hidden = 2048, .layers = 48,
     .heads = 32, .kv_heads = 4, .head_dim = 128,
     .gdn_k_heads = 0, .gdn_v_heads = 0, .gdn_head_dim = 0,
     .conv_kernel = 0, .full_attention_interval = 0,
     .mlp_width = 6144,
     .experts = 128, .top_k = 8, .expert_width = 768, .shared_expert_width = 0,
     .mtp_layers = 0, .max_positions = 40960,
     .rope_theta = 1e6, .partial_rotary_factor = 1.0,
     .chat_template = ChatTemplateSource::kQwen3},
    {.preset = "qwen3.5-35b-a3b", .arch = Architecture::kQwen3_5Moe,
     .vocab = 248320, .hidden = 2048, .layers = 40,
     .heads = 16, .kv_heads = 2, .head_dim = 256,
     .gdn_k_heads = 16, .gdn_v_heads = 32, .gdn_head_dim = 128,
     .conv_kernel = 4, .full_attention_interval = 4,
     .mlp_width = 0,
     .experts = 256, .top_k = 8, .expert_width = 512, .shared_expert_width = 512,
     .mtp_layers = 1, .max_positions = 262144,
     .rope_theta = 1e7, .partial_rotary_factor = 0.25,
     .chat_template = ChatTemplateSource::kQwen3_5},
    {.preset = "qwen3-next-80b-a3b", .arch = Architecture::kQwen3Next,
     .vocab = 151936, .hidden = 2048, .layers = 48,
     .heads = 16, .kv_heads = 2, .head_dim = 256,
     .gdn_k_heads = 16, .gdn_v_heads = 32, .gdn_head_dim = 128,
     .conv_kernel = 4, .full_attention_interval = 4,
     .mlp_width = 5120,
     .experts = 512, .top_k = 10, .expert_width = 512, .shared_expert_width = 512,
     .mtp_layers = 1, .max_positions = 262144,
     .rope_theta = 1e7, .partial_rotary_factor = 0.25,
     .chat_template = ChatTemplateSource::kQwen3},
};
// clang-format on

const PublishedModel* FindPublishedModel(const std::string& preset) {
  for (const PublishedModel& m : kPublishedModels) {
    if (m.preset == preset) return &m;
  }
  return nullptr;
}

// The real-shape presets as a table for --help, a column each (indented: a code block in
// docs/cli.md).
std::string PublishedModelTable() {
  // 1e6 for 1000000: the way model cards write RoPE bases.
  const auto power_of_ten = [](double x) {
    const int e = static_cast<int>(std::lround(std::log10(x)));
    return std::pow(10.0, e) == x ? fmt::format("1e{}", e) : fmt::format("{:g}", x);
  };
  const auto row = [](const char* name, const auto& cell) {
    std::string line = fmt::format("    {:<26}", name);
    for (const PublishedModel& m : kPublishedModels) line += fmt::format("{:<20}", cell(m));
    while (line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  using M = PublishedModel;
  return row("", [](const M& m) { return std::string(m.preset); }) +
         row("arch", [](const M& m) { return std::string(io::ArchitectureFlagName(m.arch)); }) +
         row("layers x hidden",
             [](const M& m) { return fmt::format("{} x {}", m.layers, m.hidden); }) +
         row("attention q/kv x dim",
             [](const M& m) {
               return fmt::format("{}/{} x {}", m.heads, m.kv_heads, m.head_dim);
             }) +
         row("GDN k/v heads x dim",
             [](const M& m) {
               return m.gdn_k_heads == 0
                          ? std::string("-")
                          : fmt::format("{}/{} x {}", m.gdn_k_heads, m.gdn_v_heads, m.gdn_head_dim);
             }) +
         row("full attention",
             [](const M& m) {
               return m.full_attention_interval == 0
                          ? std::string("every layer")
                          : fmt::format("every {}th layer", m.full_attention_interval);
             }) +
         row("experts top-k/E x width",
             [](const M& m) {
               return fmt::format("{}/{} x {}", m.top_k, m.experts, m.expert_width);
             }) +
         row("shared expert",
             [](const M& m) {
               return m.shared_expert_width == 0 ? std::string("-")
                                                 : std::to_string(m.shared_expert_width);
             }) +
         row("dense MLP (unused)",
             [](const M& m) {
               return m.mlp_width == 0 ? std::string("-") : std::to_string(m.mlp_width);
             }) +
         row("MTP layers", [](const M& m) { return std::to_string(m.mtp_layers); }) +
         row("vocab", [](const M& m) { return std::to_string(m.vocab); }) +
         row("rope theta (rotary)",
             [&](const M& m) {
               return fmt::format("{} ({:g})", power_of_ten(m.rope_theta), m.partial_rotary_factor);
             }) +
         row("context", [](const M& m) { return std::to_string(m.max_positions); }) +
         row("chat template", [](const M& m) {
           return std::string(m.chat_template == ChatTemplateSource::kQwen3 ? "Qwen3" : "Qwen3.5");
         });
}

ModelConfig PublishedConfig(const PublishedModel& m) {
  ModelConfig c = ArchitectureConfig(TraitsOf(m.arch));
  c.vocab_size = m.vocab;
  c.hidden_size = m.hidden;
  c.num_hidden_layers = m.layers;
  c.num_attention_heads = m.heads;
  c.num_key_value_heads = m.kv_heads;
  c.head_dim = m.head_dim;
  c.linear_num_key_heads = m.gdn_k_heads;
  c.linear_num_value_heads = m.gdn_v_heads;
  c.linear_key_head_dim = c.linear_value_head_dim = m.gdn_head_dim;
  c.linear_conv_kernel_dim = m.conv_kernel;
  if (m.full_attention_interval > 0) c.full_attention_interval = m.full_attention_interval;
  c.intermediate_size = m.mlp_width;
  c.num_experts = m.experts;
  c.num_experts_per_tok = m.top_k;
  c.moe_intermediate_size = m.expert_width;
  c.shared_expert_intermediate_size = m.shared_expert_width;
  c.num_mtp_layers = m.mtp_layers;
  c.max_position_embeddings = m.max_positions;
  c.rope_theta = m.rope_theta;
  c.partial_rotary_factor = m.partial_rotary_factor;
  return c;
}

// ---- Random values ----

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// xoshiro256** seeded through SplitMix64: fast, and good enough for weights.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1): 53 random bits, never exactly 0.
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// How a tensor's values are drawn. std 1/sqrt(fan_in) keeps every projection's output at the
// scale of its input, so each sub-layer moves the residual stream.
struct Init {
  enum { kNormal, kUniformLog } dist = kNormal;
  double mean = 0.0;
  double scale = 1.0;  // std, or the upper end of the uniform for kUniformLog
};

Init InitFor(const CheckpointTensor& t) {
  switch (t.kind) {
    case TensorKind::kEmbedding:
      return {Init::kNormal, 0.0, 1.0};
    case TensorKind::kLinear:
      return {Init::kNormal, 0.0, 1.0 / std::sqrt(static_cast<double>(t.shape.back()))};
    case TensorKind::kBias:
      return {Init::kNormal, 0.0, 0.02};
    case TensorKind::kNormOneCentered:  // stored offsets around 0: the norm scales by 1 + w
      return {Init::kNormal, 0.0, 0.1};
    case TensorKind::kNormPlain:
      return {Init::kNormal, 1.0, 0.1};
    case TensorKind::kConvWeight:
      return {Init::kNormal, 0.0, 1.0 / std::sqrt(static_cast<double>(t.shape.back()))};
    case TensorKind::kALog:  // A ~ U(1, 16) as HF's init (which draws U(0, 16)), stored as log A
      return {Init::kUniformLog, 0.0, 16.0};
    case TensorKind::kDtBias:  // HF initializes dt_bias to ones
      return {Init::kNormal, 1.0, 0.1};
  }
  return {};
}

// Fills out[0, n) with values of chunk `chunk` of the tensor; chunks are independent streams.
void DrawChunk(const Init& init, uint64_t stream, float* out, size_t n) {
  Rng rng(stream);
  if (init.dist == Init::kUniformLog) {
    for (size_t i = 0; i < n; ++i) {
      out[i] = static_cast<float>(std::log(1.0 + rng.Uniform() * (init.scale - 1.0)));
    }
    return;
  }
  for (size_t i = 0; i < n; i += 2) {  // Box-Muller: two normals per pair of uniforms
    const double r = std::sqrt(-2.0 * std::log(rng.Uniform()));
    const double theta = 2.0 * M_PI * rng.Uniform();
    out[i] = static_cast<float>(init.mean + init.scale * r * std::cos(theta));
    if (i + 1 < n) out[i + 1] = static_cast<float>(init.mean + init.scale * r * std::sin(theta));
  }
}

constexpr size_t kChunkElements = size_t{1} << 18;

// Progress on stderr for large models: a bar redrawn in place on a terminal, a line per 10 %
// otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(uint64_t total) : total_(total), tty_(isatty(2) == 1) {}
  void Advance(uint64_t bytes) {
    done_ += bytes;
    const int percent = static_cast<int>(100 * done_ / std::max<uint64_t>(total_, 1));
    if (tty_) {
      if (percent == last_) return;
      const int filled = percent / 4;
      std::fprintf(stderr, "\r[%-25s] %3d%% %.2f / %.2f GB", std::string(filled, '#').c_str(),
                   percent, done_ * 1e-9, total_ * 1e-9);
      if (done_ >= total_) std::fprintf(stderr, "\n");
    } else if (percent / 10 != last_ / 10) {
      std::fprintf(stderr, "make-model: %d%% (%.2f / %.2f GB)\n", percent, done_ * 1e-9,
                   total_ * 1e-9);
    }
    last_ = percent;
  }

 private:
  uint64_t total_;
  uint64_t done_ = 0;
  int last_ = -1;
  bool tty_;
};

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("cannot write {}", path);
  out << text;
  out.close();
  if (!out) return IoError("writing {} failed", path);
  return OkStatus();
}

struct Options {
  std::string arch = "qwen3_next";
  std::string preset = "tiny";
  std::string out;
  std::string dtype = "bf16";
  int64_t seed = 0;
  int64_t mtp_layers = -1;  // -1: the preset's (1 for the hybrid models, 0 otherwise)
  int64_t hidden_size = 0, num_layers = 0, num_experts = 0, experts_per_token = 0;
  int64_t vocab_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t moe_intermediate_size = 0, shared_expert_intermediate_size = -1;
  int64_t intermediate_size = 0, full_attention_interval = 0;
  int64_t max_shard_size_mb = 2048;
  int64_t threads = 0;
  bool no_weights = false;
  std::string inflate_from;  // another mode: DIR's model with its experts widened (inflate_model.h)
  int64_t inflate_factor = 0;
};

// The preset's config with the size overrides applied, validated by a round trip through the
// config.json text (so the file written is exactly one that parses).
Result<ModelConfig> BuildConfig(const Options& o, const FlagSet& flags) {
  Architecture arch;
  if (!io::ParseArchitectureFlagName(o.arch, &arch)) {
    return InvalidArgument(
        "--arch: '{}' is not one of qwen3_next, qwen3_5_moe, qwen3_moe, qwen3, "
        "llama",
        o.arch);
  }
  ModelConfig c;
  if (const PublishedModel* published = FindPublishedModel(o.preset)) {
    // The name says the architecture: --arch may be left out, and must agree when given.
    if (flags.WasSet("arch") && arch != published->arch) {
      return InvalidArgument("--arch {} disagrees with --preset {}, a {} model (leave --arch out)",
                             o.arch, o.preset, io::ArchitectureFlagName(published->arch));
    }
    c = PublishedConfig(*published);
  } else {
    const PresetShapes* preset = FindPreset(o.preset, TraitsOf(arch).family);
    if (preset == nullptr) {
      std::string names = "tiny, small, bench";
      for (const PublishedModel& m : kPublishedModels) names += fmt::format(", {}", m.preset);
      return InvalidArgument("--preset: '{}' is not one of {}", o.preset, names);
    }
    c = PresetConfig(TraitsOf(arch), *preset);
  }
  const std::string arch_name(io::ArchitectureFlagName(c.architecture));
  auto override_positive = [&](const char* flag, int64_t value, int64_t* field) -> Status {
    if (!flags.WasSet(flag)) return OkStatus();
    if (value <= 0) return InvalidArgument("--{}: must be positive (got {})", flag, value);
    *field = value;
    return OkStatus();
  };
  RETURN_IF_ERROR(override_positive("hidden-size", o.hidden_size, &c.hidden_size));
  RETURN_IF_ERROR(override_positive("num-layers", o.num_layers, &c.num_hidden_layers));
  RETURN_IF_ERROR(override_positive("num-heads", o.num_heads, &c.num_attention_heads));
  RETURN_IF_ERROR(override_positive("num-kv-heads", o.num_kv_heads, &c.num_key_value_heads));
  RETURN_IF_ERROR(override_positive("head-dim", o.head_dim, &c.head_dim));
  RETURN_IF_ERROR(override_positive("vocab-size", o.vocab_size, &c.vocab_size));
  RETURN_IF_ERROR(
      override_positive("intermediate-size", o.intermediate_size, &c.intermediate_size));
  RETURN_IF_ERROR(override_positive("full-attention-interval", o.full_attention_interval,
                                    &c.full_attention_interval));
  const bool moe = c.num_experts > 0;
  for (const char* flag : {"num-experts", "experts-per-token", "moe-intermediate-size"}) {
    if (!moe && flags.WasSet(flag)) {
      return InvalidArgument("--{}: {} is a dense architecture", flag, arch_name);
    }
  }
  RETURN_IF_ERROR(override_positive("num-experts", o.num_experts, &c.num_experts));
  RETURN_IF_ERROR(
      override_positive("experts-per-token", o.experts_per_token, &c.num_experts_per_tok));
  RETURN_IF_ERROR(override_positive("moe-intermediate-size", o.moe_intermediate_size,
                                    &c.moe_intermediate_size));
  if (flags.WasSet("shared-expert-intermediate-size")) {
    if (!c.is_hybrid()) {
      return InvalidArgument("--shared-expert-intermediate-size: {} has no shared expert",
                             arch_name);
    }
    if (o.shared_expert_intermediate_size < 0) {
      return InvalidArgument("--shared-expert-intermediate-size: must not be negative");
    }
    c.shared_expert_intermediate_size = o.shared_expert_intermediate_size;
  }
  if (flags.WasSet("mtp-layers")) {
    if (o.mtp_layers < 0) return InvalidArgument("--mtp-layers: must not be negative");
    if (o.mtp_layers > 0 && !c.is_hybrid()) {
      return InvalidArgument("--mtp-layers: {} has no MTP head (only qwen3_next, qwen3_5_moe)",
                             arch_name);
    }
    c.num_mtp_layers = o.mtp_layers;
  }
  // Three special tokens follow the byte-level BPE vocabulary, which starts with 256 bytes (a
  // real-shape preset's vocabulary is checked against its tokenizer's ids instead).
  if (FindPublishedModel(o.preset) == nullptr && c.vocab_size < 259) {
    return InvalidArgument("--vocab-size: must be at least 259 (256 byte tokens + 3 special)");
  }
  if (c.is_hybrid()) {
    c.layer_types = io::IntervalLayerTypes(c.num_hidden_layers, c.full_attention_interval);
  } else {
    c.layer_types.assign(c.num_hidden_layers, io::LayerType::kFullAttention);
  }
  c.rotary_dim = static_cast<int64_t>(c.head_dim * c.partial_rotary_factor);
  c.eos_token_ids = {0};  // validated here; MakeModel sets the tokenizer's id
  Result<ModelConfig> parsed = io::ParseModelConfig(io::ModelConfigToJson(c));
  if (!parsed.ok()) return parsed.status();
  return c;
}

// The tokenizer files of a folder and the ids config.json and generation_config.json name.
struct TokenizerFiles {
  std::string tokenizer_json, tokenizer_config_json;
  int64_t bos = 0;                      // <|endoftext|>
  int64_t eos = 0;                      // <|im_end|>: config.json's eos_token_id
  std::vector<int64_t> generation_eos;  // generation_config.json's eos_token_id
};

// tiny, small, bench: a byte-level BPE trained on the embedded corpus for vocab_size - 3 tokens,
// then the three ChatML specials, with the ChatML template.
TokenizerFiles TrainedTokenizer(const ModelConfig& config) {
  const tokenizer::BpeVocab vocab =
      tokenizer::TrainByteLevelBpe(kMakeModelCorpus, static_cast<size_t>(config.vocab_size - 3));
  const int first_special = static_cast<int>(vocab.tokens.size());
  const std::vector<tokenizer::SpecialToken> specials = {{"<|endoftext|>", first_special},
                                                         {"<|im_start|>", first_special + 1},
                                                         {"<|im_end|>", first_special + 2}};
  TokenizerFiles files;
  files.tokenizer_json = tokenizer::MakeTokenizerJson(vocab, specials);
  files.tokenizer_config_json = tokenizer::MakeTokenizerConfigJson(
      specials, tokenizer::kChatMlTemplate, static_cast<int>(config.max_position_embeddings));
  files.bos = first_special;
  files.eos = first_special + 2;
  files.generation_eos = {files.eos};
  return files;
}

// A real-shape preset: the real Qwen3 tokenizer (preset_files.h) with the model's chat template.
// The vocabulary (--vocab-size) must cover the tokenizer's ids. generation_config.json stops on
// <|im_end|> and <|endoftext|>, as the published ones do.
Result<TokenizerFiles> PublishedTokenizer(const PublishedModel& m, const ModelConfig& config) {
  TokenizerFiles files;
  ASSIGN_OR_RETURN(files.tokenizer_json, Qwen3TokenizerJson());
  files.tokenizer_config_json = std::string(Qwen3TokenizerConfigJson());
  if (m.chat_template == ChatTemplateSource::kQwen3_5) {
    ASSIGN_OR_RETURN(nlohmann::ordered_json tokenizer_config,
                     ParseJson<nlohmann::ordered_json>(files.tokenizer_config_json,
                                                       "the embedded tokenizer_config.json"));
    tokenizer_config["chat_template"] = std::string(Qwen35ChatTemplate());
    files.tokenizer_config_json = tokenizer_config.dump(2) + "\n";
  }
  // Loaded as moeserve will load the folder: the files are checked before they are written.
  ASSIGN_OR_RETURN(
      std::unique_ptr<tokenizer::Tokenizer> tok,
      tokenizer::Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json));
  RETURN_IF_ERROR(
      tokenizer::ChatTemplate::FromTokenizerConfig(files.tokenizer_config_json).status());
  if (config.vocab_size < tok->id_limit()) {
    return InvalidArgument(
        "--vocab-size {}: the Qwen3 tokenizer of --preset {} has ids up to {}, so the vocabulary "
        "must be at least {}",
        config.vocab_size, m.preset, tok->id_limit() - 1, tok->id_limit());
  }
  const std::optional<int32_t> endoftext = tok->TokenToId("<|endoftext|>");
  const std::optional<int32_t> im_end = tok->TokenToId("<|im_end|>");
  if (!endoftext || !im_end) {
    return Internal("the embedded Qwen3 tokenizer lacks <|endoftext|> or <|im_end|>");
  }
  files.bos = *endoftext;
  files.eos = *im_end;
  files.generation_eos = {*im_end, *endoftext};
  return files;
}

// Returns the config written.
Result<ModelConfig> MakeModel(const Options& o, const FlagSet& flags) {
  ASSIGN_OR_RETURN(ModelConfig config, BuildConfig(o, flags));
  const std::optional<DType> dtype = ParseDTypeName(o.dtype);
  if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32)) {
    return InvalidArgument("--dtype: '{}' is not bf16 or f32", o.dtype);
  }
  config.torch_dtype = *dtype == DType::kBF16 ? "bfloat16" : "float32";
  if (o.out.empty()) return InvalidArgument("--out is required");
  if (o.max_shard_size_mb <= 0) return InvalidArgument("--max-shard-size: must be positive");

  const PublishedModel* published = FindPublishedModel(o.preset);
  TokenizerFiles files;
  if (published != nullptr) {
    ASSIGN_OR_RETURN(files, PublishedTokenizer(*published, config));
  } else {
    files = TrainedTokenizer(config);
  }
  config.bos_token_id = files.bos;
  config.eos_token_ids = {files.eos};

  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out)) {
    return IoError("cannot create the folder {}: {}", o.out, ec ? ec.message() : "not a folder");
  }
  RETURN_IF_ERROR(WriteTextFile(o.out + "/tokenizer.json", files.tokenizer_json));
  RETURN_IF_ERROR(WriteTextFile(o.out + "/tokenizer_config.json", files.tokenizer_config_json));
  RETURN_IF_ERROR(WriteTextFile(o.out + "/config.json", io::ModelConfigToJson(config)));
  RETURN_IF_ERROR(WriteTextFile(
      o.out + "/generation_config.json",
      fmt::format(
          "{{\n  \"bos_token_id\": {},\n  \"eos_token_id\": {},\n  \"do_sample\": false\n}}\n",
          config.bos_token_id,
          files.generation_eos.size() == 1
              ? fmt::format("{}", files.generation_eos[0])
              : fmt::format("[{}]", fmt::join(files.generation_eos, ", ")))));
  if (o.no_weights) return config;

  // Weights.
  std::vector<io::SafetensorsTensorSpec> specs;
  std::vector<Init> inits;
  uint64_t total_bytes = 0;
  model::ForEachCheckpointTensor(config, [&](const CheckpointTensor& t) {
    specs.push_back({t.name, *dtype, t.shape});
    inits.push_back(InitFor(t));
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    total_bytes += numel * DTypeSize(*dtype);
  });
  const size_t threads = o.threads > 0 ? static_cast<size_t>(o.threads)
                                       : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  ProgressBar progress(total_bytes);
  const bool show_progress = total_bytes > (uint64_t{256} << 20);
  std::vector<float> scratch;
  auto fill = [&](size_t index, std::span<std::byte> out) {
    const size_t n = out.size() / DTypeSize(*dtype);
    float* values = reinterpret_cast<float*>(out.data());
    if (*dtype != DType::kF32) {
      scratch.resize(n);
      values = scratch.data();
    }
    // Chunk c of a tensor draws from stream (seed, name, c): independent of threads and order.
    uint64_t seed_state = static_cast<uint64_t>(o.seed);
    const uint64_t base = Fnv1a(specs[index].name) ^ SplitMix64(seed_state);
    const size_t chunks = (n + kChunkElements - 1) / kChunkElements;
    pool.ParallelFor(chunks, [&](size_t chunk, size_t) {
      const size_t begin = chunk * kChunkElements, end = std::min(n, begin + kChunkElements);
      DrawChunk(inits[index], base + chunk * 0xd1b54a32d192ed03ull, values + begin, end - begin);
      if (*dtype != DType::kF32) {
        ConvertFromF32(values + begin, *dtype, out.data() + begin * DTypeSize(*dtype), end - begin);
      }
    });
    if (show_progress) progress.Advance(out.size());
  };
  RETURN_IF_ERROR(io::WriteSafetensorsCheckpoint(o.out, specs, fill,
                                                 static_cast<uint64_t>(o.max_shard_size_mb) << 20));
  return config;
}

}  // namespace

int RunMakeModel(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve make-model",
      "Writes a Hugging Face model folder (config.json, generation_config.json, safetensors\n"
      "weights, tokenizer.json, tokenizer_config.json) with random weights, deterministic for\n"
      "a seed. The presets tiny (a few MB, for tests), small (~100 M parameters) and bench\n"
      "(the real models' layer shapes, 8 layers, 32 experts) exist for every --arch and get a\n"
      "byte-level BPE tokenizer trained on an embedded corpus with a ChatML template. The\n"
      "real-shape presets have a published model's config.json (the size flags below still\n"
      "override it: --num-layers 8 cuts one for tests and benchmarks), the real Qwen3\n"
      "tokenizer and the model's chat template; the name implies --arch:\n"
      "\n" +
          PublishedModelTable());
  flags.String("arch", &o.arch,
               "qwen3_next | qwen3_5_moe | qwen3_moe | qwen3 | llama (a real-shape preset "
               "implies its own)");
  flags.String("preset", &o.preset,
               "tiny | small | bench | qwen3-30b-a3b | qwen3.5-35b-a3b | qwen3-next-80b-a3b");
  flags.String("out", &o.out, "output folder (created if absent)");
  flags.Int("seed", &o.seed, "random seed");
  flags.String("dtype", &o.dtype, "weight dtype: bf16 | f32");
  flags.Int("mtp-layers", &o.mtp_layers, "MTP layers (hybrid archs; preset: 1, others 0)");
  flags.Int("hidden-size", &o.hidden_size, "override the preset's hidden size");
  flags.Int("num-layers", &o.num_layers, "override the number of decoder layers");
  flags.Int("num-experts", &o.num_experts, "override the number of routed experts");
  flags.Int("experts-per-token", &o.experts_per_token, "override top-k");
  flags.Int("vocab-size", &o.vocab_size, "override the vocabulary size (>= 259)");
  flags.Int("num-heads", &o.num_heads, "override the attention query heads");
  flags.Int("num-kv-heads", &o.num_kv_heads, "override the attention KV heads");
  flags.Int("head-dim", &o.head_dim, "override the attention head dim");
  flags.Int("intermediate-size", &o.intermediate_size, "override the dense MLP width");
  flags.Int("moe-intermediate-size", &o.moe_intermediate_size, "override the expert width");
  flags.Int("shared-expert-intermediate-size", &o.shared_expert_intermediate_size,
            "override the shared expert width (0: none)");
  flags.Int("full-attention-interval", &o.full_attention_interval,
            "hybrid archs: every N-th layer is full attention");
  flags.Int("max-shard-size", &o.max_shard_size_mb,
            "MiB per safetensors file; larger models are sharded with an index");
  flags.Int("threads", &o.threads, "threads drawing weights (0: all cores)");
  flags.Bool("no-weights", &o.no_weights,
             "write everything but the safetensors (a folder inspect can plan a run for)");
  flags.String("inflate-from", &o.inflate_from,
               "instead of random weights: this model folder with every routed expert widened "
               "--inflate-factor times (the same function, that many times the expert bytes per "
               "token; docs/performance.md)");
  flags.Int("inflate-factor", &o.inflate_factor,
            "with --inflate-from: the widening, a power of two in 2..1024");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  Stopwatch watch;
  if (flags.WasSet("inflate-from") || flags.WasSet("inflate-factor")) {
    for (const char* flag :
         {"arch", "preset", "seed", "dtype", "mtp-layers", "hidden-size", "num-layers",
          "num-experts", "experts-per-token", "vocab-size", "num-heads", "num-kv-heads", "head-dim",
          "intermediate-size", "moe-intermediate-size", "shared-expert-intermediate-size",
          "full-attention-interval", "no-weights"}) {
      if (flags.WasSet(flag)) {
        return UsageError(kCommand, InvalidArgument("--{}: not with --inflate-from (the model is "
                                                    "--inflate-from's)",
                                                    flag));
      }
    }
    if (o.inflate_from.empty() || o.out.empty()) {
      return UsageError(kCommand,
                        InvalidArgument("--inflate-from DIR, --inflate-factor R and --out go "
                                        "together"));
    }
    const Status inflated = InflateModel(o.inflate_from, o.inflate_factor, o.out,
                                         static_cast<uint64_t>(o.max_shard_size_mb) << 20);
    if (inflated.code() == StatusCode::kInvalidArgument) return UsageError(kCommand, inflated);
    if (!inflated.ok()) return RuntimeError(kCommand, inflated);
    fmt::print(stderr, "make-model: wrote {} ({} with its experts {}x as wide) in {:.1f} s\n",
               o.out, o.inflate_from, o.inflate_factor, watch.ElapsedSeconds());
    return 0;
  }
  Result<ModelConfig> made = MakeModel(o, flags);
  if (made.status().code() == StatusCode::kInvalidArgument) {
    return UsageError(kCommand, made.status());
  }
  if (!made.ok()) return RuntimeError(kCommand, made.status());
  fmt::print(stderr, "make-model: wrote {} ({}, preset {}{}) in {:.1f} s\n", o.out,
             io::ArchitectureFlagName(made->architecture), o.preset,
             o.no_weights ? ", no weights" : "", watch.ElapsedSeconds());
  return 0;
}

}  // namespace moeserve::cli
