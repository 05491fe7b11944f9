#include "model/gguf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

namespace moeserve::model {
namespace {

using io::Architecture;
using io::GgufFile;
using io::GgufTensor;
using io::GgufType;
using io::GgufValue;

struct ArchInfo {
  std::string_view gguf;        // general.architecture
  Architecture arch;
  std::string_view hf_name;     // config.json's architectures[0]
  std::string_view model_type;  // config.json's model_type
};

constexpr ArchInfo kArchitectures[] = {
    {"qwen3moe", Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {"qwen3", Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {"qwen3next", Architecture::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next"},
    {"qwen35moe", Architecture::kQwen3_5Moe, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"},
    {"llama", Architecture::kLlama, "LlamaForCausalLM", "llama"},
};

// Reads the metadata keys of one file, each checked for its type and range.
class Keys {
 public:
  Keys(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  // `{arch}.name` as an integer in [lo, hi]; `fallback` when absent (nullopt: required).
  Result<int64_t> Int(std::string_view name, int64_t lo, int64_t hi,
                      std::optional<int64_t> fallback = std::nullopt) const {
    const std::string key = Key(name);
    const GgufValue* v = file_.FindValue(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return NotFound("{}: no key {}, which {} needs", file_.path(), key, arch_);
    }
    if (!v->value.is_number_integer()) {
      return InvalidArgument("{}: key {} is {}, not an integer", file_.path(), key,
                             v->value.dump().substr(0, 80));
    }
    // Unsigned 64-bit values above int64's range read as out of range, not wrapped.
    const bool too_big =
        v->value.is_number_unsigned() &&
        v->value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    const int64_t x = too_big ? std::numeric_limits<int64_t>::max() : v->value.get<int64_t>();
    if (x < lo || x > hi) {
      return InvalidArgument("{}: key {} is {}, outside [{}, {}]", file_.path(), key,
                             v->value.dump(), lo, hi);
    }
    return x;
  }

  Result<double> Float(std::string_view name, double fallback) const {
    const std::string key = Key(name);
    const GgufValue* v = file_.FindValue(key);
    if (v == nullptr) return fallback;
    if (!v->value.is_number()) {
      return InvalidArgument("{}: key {} is {}, not a number", file_.path(), key,
                             v->value.dump().substr(0, 80));
    }
    return v->value.get<double>();
  }

  // A key outside `{arch}.`: its string value, or "" when absent.
  Result<std::string> String(const std::string& key) const {
    const GgufValue* v = file_.FindValue(key);
    if (v == nullptr) return std::string();
    if (!v->value.is_string()) return InvalidArgument("{}: key {} is not a string", file_.path(), key);
    return v->value.get<std::string>();
  }

  std::string Key(std::string_view name) const { return fmt::format("{}.{}", arch_, name); }

 private:
  const GgufFile& file_;
  std::string arch_;
};

constexpr int64_t kMaxDim = int64_t{1} << 20;  // ParseModelConfig bounds the sizes again

// A tensor's ne reversed: its row-major shape.
std::vector<int64_t> Shape(const GgufTensor& t) { return {t.ne.rbegin(), t.ne.rend()}; }

// A shape without its dimensions of 1: the converter squeezes some (a conv weight's channel
// dimension), which changes no byte.
std::vector<int64_t> Squeezed(std::vector<int64_t> shape) {
  std::erase(shape, 1);
  return shape;
}

// The Gated DeltaNet and MoE keys of a qwen3next or qwen35moe file, into c.
Status ReadHybridKeys(const GgufFile& file, const Keys& k, io::ModelConfig& c) {
  ASSIGN_OR_RETURN(c.linear_conv_kernel_dim, k.Int("ssm.conv_kernel", 1, 64));
  ASSIGN_OR_RETURN(c.linear_key_head_dim, k.Int("ssm.state_size", 1, 4096));
  ASSIGN_OR_RETURN(c.linear_num_key_heads, k.Int("ssm.group_count", 1, 4096));
  ASSIGN_OR_RETURN(c.linear_num_value_heads, k.Int("ssm.time_step_rank", 1, 4096));
  ASSIGN_OR_RETURN(const int64_t inner, k.Int("ssm.inner_size", 1, kMaxDim));
  if (inner % c.linear_num_value_heads != 0) {
    return InvalidArgument("key {} ({}) is not a multiple of {} ({})", k.Key("ssm.inner_size"),
                           inner, k.Key("ssm.time_step_rank"), c.linear_num_value_heads);
  }
  c.linear_value_head_dim = inner / c.linear_num_value_heads;
  ASSIGN_OR_RETURN(c.full_attention_interval,
                   k.Int("full_attention_interval", 1, c.num_hidden_layers, 4));
  c.layer_types = io::IntervalLayerTypes(c.num_hidden_layers, c.full_attention_interval);
  // The converter writes the layer types as a list when config.json has one (one flag per
  // block, the MTP blocks' false); it wins over the interval, as in llama.cpp.
  const std::string recurrent_key = k.Key("attention.recurrent_layers");
  if (const GgufValue* v = file.FindValue(recurrent_key); v != nullptr) {
    const size_t blocks = static_cast<size_t>(c.num_hidden_layers + c.num_mtp_layers);
    if (!v->value.is_array() || v->value.size() != blocks) {
      return InvalidArgument("key {} is not a list of {} flags (one per block)", recurrent_key,
                             blocks);
    }
    for (size_t i = 0; i < blocks; ++i) {
      const nlohmann::json& flag = v->value[i];
      if (!flag.is_boolean() || (i >= static_cast<size_t>(c.num_hidden_layers) && flag)) {
        return InvalidArgument("key {}: entry {} is {}, not {}", recurrent_key, i,
                               flag.dump().substr(0, 80),
                               i < static_cast<size_t>(c.num_hidden_layers)
                                   ? "a boolean"
                                   : "false (an MTP block has full attention)");
      }
      if (i < static_cast<size_t>(c.num_hidden_layers)) {
        c.layer_types[i] = flag ? io::LayerType::kLinearAttention : io::LayerType::kFullAttention;
      }
    }
  }
  ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                   k.Int("expert_shared_feed_forward_length", 0, kMaxDim, 0));
  c.attn_output_gate = true;
  // What llama.cpp's converter rewrote (Qwen3NextModel.modify_tensors, which Qwen3.5's
  // converter inherits): A as -exp(A_log), the norms' 1 added.
  c.gguf.gdn_a_negated = true;
  c.gguf.norms_with_one = true;
  if (c.architecture == Architecture::kQwen3Next) {
    c.gguf.gdn_qkv_z_split = true;  // in_proj_qkvz as attn_qkv + attn_gate
  } else {
    // _LinearAttentionVReorderBase: value heads in tiled order (a no-op when nk == nv).
    c.gguf.gdn_v_heads_tiled = true;
    // Qwen2MoeModel.modify_tensors splits the fused experts.gate_up_proj into ffn_gate_exps and
    // ffn_up_exps; a file with llama.cpp's merged ffn_gate_up_exps (gate rows, then up) is
    // Hugging Face's fused layout as it stands.
    c.gguf.experts_split = file.Find("blk.0.ffn_gate_up_exps.weight") == nullptr;
  }
  return OkStatus();
}

// The bos id and the ids generation stops on, from the tokenizer keys, into c.
Status ReadTokenIds(const GgufFile& file, io::ModelConfig& c) {
  auto id = [&](const char* key) -> Result<int64_t> {
    const GgufValue* v = file.FindValue(key);
    if (v == nullptr) return int64_t{-1};
    if (!v->value.is_number_integer() || v->value.get<int64_t>() < 0 ||
        v->value.get<int64_t>() >= c.vocab_size) {
      return InvalidArgument("{}: key {} is {}, not a token id below the vocabulary's {}",
                             file.path(), key, v->value.dump().substr(0, 80), c.vocab_size);
    }
    return v->value.get<int64_t>();
  };
  ASSIGN_OR_RETURN(c.bos_token_id, id("tokenizer.ggml.bos_token_id"));
  auto stop_on = [&](int64_t token) {
    if (token >= 0 && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), token) ==
                          c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(token);
    }
  };
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    ASSIGN_OR_RETURN(const int64_t token, id(key));
    stop_on(token);
  }
  // What a folder's generation_config.json adds (Qwen3 stops on <|endoftext|> as well as
  // <|im_end|>) a GGUF file does not hold: as llama.cpp does, the control tokens that end a turn
  // or a text stop generation too.
  const GgufValue* tokens = file.FindValue("tokenizer.ggml.tokens");
  const GgufValue* types = file.FindValue("tokenizer.ggml.token_type");
  if (tokens == nullptr || types == nullptr || !tokens->value.is_array() ||
      !types->value.is_array() || tokens->value.size() != types->value.size()) {
    return OkStatus();  // the tokenizer's own checks name what is wrong with them
  }
  constexpr int kControl = 3;  // llama.cpp's token type CONTROL
  for (size_t i = 0; i < tokens->value.size() && i < static_cast<size_t>(c.vocab_size); ++i) {
    const nlohmann::json& text = tokens->value[i];
    if (!text.is_string() || types->value[i] != kControl) continue;
    const std::string& t = text.get_ref<const std::string&>();
    if (t == "<|endoftext|>" || t == "<|im_end|>" || t == "<|eot_id|>" || t == "<|eom_id|>" ||
        t == "<|end_of_text|>") {
      stop_on(static_cast<int64_t>(i));
    }
  }
  return OkStatus();
}

}  // namespace

std::string_view GgufArchitectureName(Architecture arch) {
  for (const ArchInfo& a : kArchitectures) {
    if (a.arch == arch) return a.gguf;
  }
  return "";
}

bool IsGgufFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, sizeof(magic)) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<io::ModelConfig> GgufModelConfig(const GgufFile& file) {
  const io::GgufValue* arch_value = file.FindValue("general.architecture");
  if (arch_value == nullptr || !arch_value->value.is_string()) {
    return InvalidArgument("{}: no string key general.architecture", file.path());
  }
  const std::string arch_name = arch_value->value.get<std::string>();
  const ArchInfo* arch = nullptr;
  for (const ArchInfo& a : kArchitectures) {
    if (a.gguf == arch_name) arch = &a;
  }
  if (arch == nullptr) {
    std::vector<std::string_view> known;
    for (const ArchInfo& a : kArchitectures) known.push_back(a.gguf);
    return Unimplemented("{}: general.architecture '{}' is not one moeserve reads ({})",
                         file.path(), arch_name.substr(0, 80), fmt::join(known, ", "));
  }
  const Keys k(file, arch_name);
  io::ModelConfig c;
  c.architecture = arch->arch;
  c.architecture_name = std::string(arch->hf_name);
  c.model_type = std::string(arch->model_type);
  ASSIGN_OR_RETURN(c.hidden_size, k.Int("embedding_length", 1, kMaxDim));
  // block_count counts the MTP (nextn) layers, which the converter appends.
  ASSIGN_OR_RETURN(const int64_t blocks, k.Int("block_count", 1, 4096));
  ASSIGN_OR_RETURN(c.num_mtp_layers, k.Int("nextn_predict_layers", 0, blocks - 1, 0));
  c.num_hidden_layers = blocks - c.num_mtp_layers;
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   k.Int("context_length", 1, int64_t{1} << 24, 32768));
  ASSIGN_OR_RETURN(c.num_attention_heads, k.Int("attention.head_count", 1, 4096));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   k.Int("attention.head_count_kv", 1, 4096, c.num_attention_heads));
  ASSIGN_OR_RETURN(c.head_dim, k.Int("attention.key_length", 1, 4096,
                                     c.hidden_size / c.num_attention_heads));
  ASSIGN_OR_RETURN(const int64_t value_length,
                   k.Int("attention.value_length", 1, 4096, c.head_dim));
  if (value_length != c.head_dim) {
    return Unimplemented("{}: key {} ({}) differs from the key length {}", file.path(),
                         k.Key("attention.value_length"), value_length, c.head_dim);
  }
  ASSIGN_OR_RETURN(const int64_t rope_dims,
                   k.Int("rope.dimension_count", 2, c.head_dim, c.head_dim));
  c.partial_rotary_factor = static_cast<double>(rope_dims) / static_cast<double>(c.head_dim);
  ASSIGN_OR_RETURN(c.rope_theta, k.Float("rope.freq_base", 10000.0));
  ASSIGN_OR_RETURN(const std::string rope_scaling, k.String(k.Key("rope.scaling.type")));
  if (!rope_scaling.empty() && rope_scaling != "none") {
    return Unimplemented("{}: key {} is '{}'; moeserve implements no rope scaling", file.path(),
                         k.Key("rope.scaling.type"), rope_scaling.substr(0, 80));
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, k.Float("attention.layer_norm_rms_epsilon", 1e-6));
  ASSIGN_OR_RETURN(c.intermediate_size, k.Int("feed_forward_length", 0, kMaxDim, 0));
  if (c.architecture == Architecture::kQwen3Moe || c.is_hybrid()) {
    ASSIGN_OR_RETURN(c.num_experts, k.Int("expert_count", 1, 4096));
    ASSIGN_OR_RETURN(c.num_experts_per_tok, k.Int("expert_used_count", 1, c.num_experts));
    ASSIGN_OR_RETURN(c.moe_intermediate_size, k.Int("expert_feed_forward_length", 1, kMaxDim));
    // Qwen3-MoE checkpoints renormalize the top-k weights; llama.cpp's qwen3moe always does.
    c.norm_topk_prob = true;
  }
  if (c.architecture == Architecture::kLlama) {
    // LlamaModel.modify_tensors interleaves the rotary halves of each q and k head.
    c.gguf.rope_rows_interleaved = true;
    if (file.Find("rope_freqs.weight") != nullptr) {
      return Unimplemented("{}: tensor rope_freqs.weight (Llama 3.1's rope scaling) is not "
                           "implemented", file.path());
    }
  }
  if (c.is_hybrid()) {
    // Qwen3.5's rope.dimension_sections (interleaved MRoPE) pick which of a token's (t, h, w)
    // positions rotates each pair; a text token's three are equal, so the rotation is the
    // plain one over rope.dimension_count dimensions and the key is not needed.
    const Status hybrid = ReadHybridKeys(file, k, c);
    if (!hybrid.ok()) return hybrid.WithContext(file.path());
  }
  const GgufTensor* embedding = file.Find("token_embd.weight");
  if (embedding == nullptr || embedding->ne.size() != 2) {
    return NotFound("{}: no 2-D tensor token_embd.weight, which gives the vocabulary", file.path());
  }
  c.vocab_size = embedding->ne[1];
  c.tie_word_embeddings = file.Find("output.weight") == nullptr;
  c.attention_bias = file.Find("blk.0.attn_q.bias") != nullptr;
  RETURN_IF_ERROR(ReadTokenIds(file, c));
  // The stored precision: bf16 when the matrices are, else f32 (what a load widens to).
  bool bf16 = false;
  for (const GgufTensor& t : file.tensors()) {
    const std::optional<DType> d = io::DTypeOfGgmlType(t.type);
    if (t.ne.size() < 2 || !d) continue;
    bf16 |= *d == DType::kBF16;
    c.gguf.block_quantized |= IsGgmlBlockDType(*d);
  }
  c.torch_dtype = bf16 && !c.gguf.block_quantized ? "bfloat16" : "float32";
  // Through config.json's parser: the same defaults derived and the same bounds checked.
  Result<io::ModelConfig> parsed = io::ParseModelConfig(io::ModelConfigToJson(c));
  if (!parsed.ok()) return parsed.status().WithContext(file.path());
  parsed->gguf = c.gguf;
  return parsed;
}

GgufName GgufNameOf(const io::ModelConfig& config, const CheckpointTensor& spec) {
  // The converter appends the MTP layers after the decoder's: blk.{L + i}.
  const int64_t layer = spec.mtp ? config.num_hidden_layers + std::max<int64_t>(spec.layer, 0)
                                 : spec.layer;
  const std::string blk = fmt::format("blk.{}.", layer);
  switch (spec.role) {
    case TensorRole::kEmbedding: return {"token_embd.weight"};
    case TensorRole::kFinalNorm: return {"output_norm.weight"};
    case TensorRole::kLmHead: return {"output.weight"};
    case TensorRole::kInputNorm: return {blk + "attn_norm.weight"};
    case TensorRole::kPostAttentionNorm:
      return {blk + (config.is_hybrid() ? "post_attention_norm.weight" : "ffn_norm.weight")};
    case TensorRole::kQProj: return {blk + "attn_q.weight"};
    case TensorRole::kKProj: return {blk + "attn_k.weight"};
    case TensorRole::kVProj: return {blk + "attn_v.weight"};
    case TensorRole::kOProj: return {blk + "attn_output.weight"};
    case TensorRole::kQBias: return {blk + "attn_q.bias"};
    case TensorRole::kKBias: return {blk + "attn_k.bias"};
    case TensorRole::kVBias: return {blk + "attn_v.bias"};
    case TensorRole::kOBias: return {blk + "attn_output.bias"};
    case TensorRole::kQNorm: return {blk + "attn_q_norm.weight"};
    case TensorRole::kKNorm: return {blk + "attn_k_norm.weight"};
    case TensorRole::kGdnInProjQkv: return {blk + "attn_qkv.weight"};
    case TensorRole::kGdnInProjZ: return {blk + "attn_gate.weight"};
    case TensorRole::kGdnInProjBa: return {blk + "ssm_ba.weight"};
    case TensorRole::kGdnInProjB: return {blk + "ssm_beta.weight"};
    case TensorRole::kGdnInProjA: return {blk + "ssm_alpha.weight"};
    case TensorRole::kGdnConv: return {blk + "ssm_conv1d.weight"};
    case TensorRole::kGdnDtBias: return {blk + "ssm_dt.bias"};
    case TensorRole::kGdnALog: return {blk + "ssm_a"};
    case TensorRole::kGdnNorm: return {blk + "ssm_norm.weight"};
    case TensorRole::kGdnOutProj: return {blk + "ssm_out.weight"};
    case TensorRole::kRouter: return {blk + "ffn_gate_inp.weight"};
    case TensorRole::kExpertGate: return {blk + "ffn_gate_exps.weight", spec.expert};
    case TensorRole::kExpertUp: return {blk + "ffn_up_exps.weight", spec.expert};
    case TensorRole::kExpertDown: return {blk + "ffn_down_exps.weight", spec.expert};
    case TensorRole::kSharedExpertGate: return {blk + "ffn_gate_shexp.weight"};
    case TensorRole::kSharedExpertUp: return {blk + "ffn_up_shexp.weight"};
    case TensorRole::kSharedExpertDown: return {blk + "ffn_down_shexp.weight"};
    case TensorRole::kSharedExpertGateScalar: return {blk + "ffn_gate_inp_shexp.weight"};
    case TensorRole::kMlpGate: return {blk + "ffn_gate.weight"};
    case TensorRole::kMlpUp: return {blk + "ffn_up.weight"};
    case TensorRole::kMlpDown: return {blk + "ffn_down.weight"};
    case TensorRole::kMtpFc: return {blk + "nextn.eh_proj.weight"};
    case TensorRole::kMtpPreFcNormEmbedding: return {blk + "nextn.enorm.weight"};
    case TensorRole::kMtpPreFcNormHidden: return {blk + "nextn.hnorm.weight"};
    case TensorRole::kMtpNorm: return {blk + "nextn.shared_head_norm.weight"};
    // Without gguf.experts_split: llama.cpp's merged [E, 2I, H] and the [E, H, I] down.
    case TensorRole::kExpertsGateUp: return {blk + "ffn_gate_up_exps.weight"};
    case TensorRole::kExpertsDown: return {blk + "ffn_down_exps.weight"};
    case TensorRole::kGdnInProjQkvz: break;  // the converter splits it (gguf.gdn_qkv_z_split)
  }
  return {fmt::format("({} has no GGUF name)", spec.name)};
}

Result<GgufCheckpoint> OpenGgufCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> opened, GgufFile::Open(path));
  std::shared_ptr<const GgufFile> file(std::move(opened));
  ASSIGN_OR_RETURN(io::ModelConfig config, GgufModelConfig(*file));
  std::vector<io::SafetensorsTensor> tensors;
  Status status;
  ForEachCheckpointTensor(config, [&](const CheckpointTensor& spec) {
    if (!status.ok()) return;
    const GgufName where = GgufNameOf(config, spec);
    const GgufTensor* t = file->Find(where.name);
    if (t == nullptr) {
      status = NotFound("{}: no tensor {} (for {}, shape [{}])", path, where.name, spec.name,
                        fmt::join(spec.shape, ", "));
      return;
    }
    const std::optional<DType> dtype = io::DTypeOfGgmlType(t->type);
    if (!dtype) {
      status = Unimplemented("{}: tensor {} has type {}, which moeserve does not read", path,
                             t->name, io::GgmlType(t->type).name);
      return;
    }
    std::vector<int64_t> want = spec.shape;
    if (where.expert >= 0) want.insert(want.begin(), config.num_experts);
    if (Squeezed(Shape(*t)) != Squeezed(want)) {
      status = InvalidArgument("{}: tensor {} has shape [{}] (ne reversed), but the config implies [{}]",
                               path, t->name, fmt::join(Shape(*t), ", "), fmt::join(want, ", "));
      return;
    }
    std::span<const std::byte> bytes = t->bytes;
    if (where.expert >= 0) {
      const size_t per_expert = bytes.size() / static_cast<size_t>(config.num_experts);
      bytes = bytes.subspan(static_cast<size_t>(where.expert) * per_expert, per_expert);
    }
    tensors.push_back({spec.name, *dtype, spec.shape, bytes, path});
  });
  if (!status.ok()) return status;
  const std::span<const std::byte> mapping = file->mapping();
  GgufCheckpoint out{file, std::move(config), {}};
  out.checkpoint = io::SafetensorsCheckpoint::FromFile(
      io::SafetensorsFile::FromMapping(path, file, mapping, std::move(tensors)));
  return out;
}

}  // namespace moeserve::model
