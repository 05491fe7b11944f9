#include "io/model_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include "core/json.h"

namespace moeserve::io {
namespace {

using nlohmann::json;

struct ArchInfo {
  Architecture arch;
  std::string_view hf_name;
  std::string_view flag_name;
  std::string_view model_type;  // model_type when architectures is absent
};

constexpr ArchInfo kArchs[] = {
    {Architecture::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next", "qwen3_next"},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
     "qwen3_5_moe"},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForCausalLM", "qwen3_5_moe", "qwen3_5_moe_text"},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", "qwen3_moe"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3", "qwen3"},
    {Architecture::kLlama, "LlamaForCausalLM", "llama", "llama"},
};

std::string SupportedArchitectures() {
  std::string s;
  for (const ArchInfo& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.hf_name;
  }
  return s;
}

const char* JsonTypeName(const json& v) { return v.type_name(); }

// Reads typed keys of one JSON object; the first problem is kept in status_ and later reads
// are no-ops, so parsing reads straight through and checks once at the end.
class KeyReader {
 public:
  KeyReader(const json& object, std::string where) : obj_(object), where_(std::move(where)) {}

  const Status& status() const { return status_; }
  bool Has(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  void Int(const char* key, int64_t* out, bool required) {
    const json* v = Lookup(key, required);
    if (v == nullptr) return;
    if (!v->is_number_integer()) return Fail(key, "an integer", *v);
    *out = v->get<int64_t>();
  }
  void Double(const char* key, double* out) {
    const json* v = Lookup(key, false);
    if (v == nullptr) return;
    if (!v->is_number()) return Fail(key, "a number", *v);
    *out = v->get<double>();
  }
  void Bool(const char* key, bool* out) {
    const json* v = Lookup(key, false);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Fail(key, "true or false", *v);
    *out = v->get<bool>();
  }
  void String(const char* key, std::string* out) {
    const json* v = Lookup(key, false);
    if (v == nullptr) return;
    if (!v->is_string()) return Fail(key, "a string", *v);
    *out = v->get<std::string>();
  }
  // An integer or a list of integers (eos_token_id).
  void IntList(const char* key, std::vector<int64_t>* out) {
    const json* v = Lookup(key, false);
    if (v == nullptr) return;
    out->clear();
    if (v->is_number_integer()) {
      out->push_back(v->get<int64_t>());
      return;
    }
    if (!v->is_array()) return Fail(key, "an integer or a list of integers", *v);
    for (const json& e : *v) {
      if (!e.is_number_integer()) return Fail(key, "a list of integers", *v);
      out->push_back(e.get<int64_t>());
    }
  }
  void Error(std::string message) {
    if (status_.ok()) status_ = Status(StatusCode::kInvalidArgument, where_ + ": " + message);
  }

 private:
  const json* Lookup(const char* key, bool required) {
    if (!status_.ok()) return nullptr;
    const json* v = Find(key);
    if (v == nullptr && required) Error(fmt::format("missing required key '{}'", key));
    return v;
  }
  void Fail(const char* key, const char* expected, const json& got) {
    Error(fmt::format("key '{}' must be {} (got {} {})", key, expected, JsonTypeName(got),
                      got.dump().substr(0, 60)));
  }

  const json& obj_;
  std::string where_;
  Status status_;
};

Status Validate(const ModelConfig& c) {
  auto positive = [](const char* key, int64_t v) -> Status {
    if (v <= 0) return InvalidArgument("key '{}' must be positive (got {})", key, v);
    return OkStatus();
  };
  RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  RETURN_IF_ERROR(positive("num_hidden_layers", c.num_hidden_layers));
  RETURN_IF_ERROR(positive("num_attention_heads", c.num_attention_heads));
  RETURN_IF_ERROR(positive("num_key_value_heads", c.num_key_value_heads));
  RETURN_IF_ERROR(positive("head_dim", c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgument("num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                           c.num_attention_heads, c.num_key_value_heads);
  }
  if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0)) {
    return InvalidArgument("key 'partial_rotary_factor' must be in (0, 1] (got {})",
                           c.partial_rotary_factor);
  }
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0) {
    return InvalidArgument("rotary dim head_dim * partial_rotary_factor = {} must be even and > 0",
                           c.rotary_dim);
  }
  if (!(c.rope_theta > 0.0)) return InvalidArgument("key 'rope_theta' must be positive");
  if (!(c.rms_norm_eps > 0.0)) return InvalidArgument("key 'rms_norm_eps' must be positive");
  if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
    return InvalidArgument("key 'layer_types' has {} entries but num_hidden_layers is {}",
                           c.layer_types.size(), c.num_hidden_layers);
  }
  if (c.num_layers_of(LayerType::kLinearAttention) > 0) {
    RETURN_IF_ERROR(positive("linear_num_key_heads", c.linear_num_key_heads));
    RETURN_IF_ERROR(positive("linear_num_value_heads", c.linear_num_value_heads));
    RETURN_IF_ERROR(positive("linear_key_head_dim", c.linear_key_head_dim));
    RETURN_IF_ERROR(positive("linear_value_head_dim", c.linear_value_head_dim));
    RETURN_IF_ERROR(positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim));
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
      return InvalidArgument(
          "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
          c.linear_num_value_heads, c.linear_num_key_heads);
    }
  }
  if (c.num_experts < 0) return InvalidArgument("key 'num_experts' must not be negative");
  // Before IsMoeLayer divides by it (found by model_config_fuzzer).
  if (c.decoder_sparse_step <= 0) {
    return InvalidArgument("key 'decoder_sparse_step' must be positive");
  }
  bool any_moe = false, any_dense = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) (c.IsMoeLayer(i) ? any_moe : any_dense) = true;
  if (any_moe) {
    RETURN_IF_ERROR(positive("num_experts_per_tok", c.num_experts_per_tok));
    RETURN_IF_ERROR(positive("moe_intermediate_size", c.moe_intermediate_size));
    if (c.num_experts_per_tok > c.num_experts) {
      return InvalidArgument("num_experts_per_tok ({}) exceeds num_experts ({})",
                             c.num_experts_per_tok, c.num_experts);
    }
    if (c.shared_expert_intermediate_size < 0) {
      return InvalidArgument("key 'shared_expert_intermediate_size' must not be negative");
    }
  }
  if (any_dense) {
    RETURN_IF_ERROR(positive("intermediate_size", c.intermediate_size));
  }
  if (c.num_mtp_layers < 0) return InvalidArgument("the number of MTP layers must not be negative");
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return InvalidArgument("eos_token_id {} is outside the vocabulary of {}", id, c.vocab_size);
    }
  }
  return OkStatus();
}

Result<ModelConfig> Parse(const json& root) {
  ModelConfig c;
  if (!root.is_object()) return InvalidArgument("config.json must hold a JSON object");

  // Architecture: architectures[0], else model_type.
  KeyReader top(root, "config.json");
  const ArchInfo* arch = nullptr;
  if (const json* archs = top.Find("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return InvalidArgument("config.json: key 'architectures' must be a non-empty list of strings");
    }
    c.architecture_name = (*archs)[0].get<std::string>();
    for (const ArchInfo& a : kArchs) {
      if (a.hf_name == c.architecture_name) arch = &a;
    }
    if (arch == nullptr) {
      return InvalidArgument("config.json: unknown architecture '{}' (supported: {})",
                             c.architecture_name, SupportedArchitectures());
    }
  } else {
    std::string model_type;
    top.String("model_type", &model_type);
    RETURN_IF_ERROR(top.status());
    for (const ArchInfo& a : kArchs) {
      if (!model_type.empty() && a.model_type == model_type) arch = &a;
    }
    if (arch == nullptr) {
      return InvalidArgument(
          "config.json: missing required key 'architectures' (and model_type '{}' is not one "
          "moeserve knows)",
          model_type);
    }
    c.architecture_name = std::string(arch->hf_name);
  }
  c.architecture = arch->arch;

  // Qwen3.5 keeps the text model's keys under text_config.
  const json* text_json = &root;
  std::string where = "config.json";
  if (const json* t = top.Find("text_config"); t != nullptr) {
    if (!t->is_object()) return InvalidArgument("config.json: key 'text_config' must be an object");
    text_json = t;
    where = "config.json text_config";
  }
  KeyReader r(*text_json, where);
  r.String("model_type", &c.model_type);
  if (c.model_type.empty()) top.String("model_type", &c.model_type);

  r.Int("vocab_size", &c.vocab_size, true);
  r.Int("hidden_size", &c.hidden_size, true);
  r.Int("num_hidden_layers", &c.num_hidden_layers, true);
  r.Int("num_attention_heads", &c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  r.Int("num_key_value_heads", &c.num_key_value_heads, false);
  const bool llama = c.architecture == Architecture::kLlama;
  if (llama && !r.Has("head_dim") && c.num_attention_heads > 0) {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  } else {
    r.Int("head_dim", &c.head_dim, true);
  }
  r.Double("rms_norm_eps", &c.rms_norm_eps);
  r.Bool("attention_bias", &c.attention_bias);
  r.Bool("tie_word_embeddings", &c.tie_word_embeddings);
  if (!r.Has("tie_word_embeddings")) top.Bool("tie_word_embeddings", &c.tie_word_embeddings);
  r.Int("max_position_embeddings", &c.max_position_embeddings, false);
  r.String("torch_dtype", &c.torch_dtype);
  if (c.torch_dtype.empty()) r.String("dtype", &c.torch_dtype);
  if (c.torch_dtype.empty()) top.String("torch_dtype", &c.torch_dtype);
  for (KeyReader* k : {&r, &top}) {
    if (c.eos_token_ids.empty()) k->IntList("eos_token_id", &c.eos_token_ids);
    if (c.bos_token_id < 0) k->Int("bos_token_id", &c.bos_token_id, false);
  }

  // RoPE: rope_parameters (Qwen3.5, newer transformers) or top-level keys + rope_scaling.
  if (const json* rp = r.Find("rope_parameters"); rp != nullptr) {
    if (!rp->is_object()) return InvalidArgument("{}: key 'rope_parameters' must be an object", where);
    KeyReader rope(*rp, where + " rope_parameters");
    rope.Double("rope_theta", &c.rope_theta);
    rope.Double("partial_rotary_factor", &c.partial_rotary_factor);
    rope.String("rope_type", &c.rope_type);
    RETURN_IF_ERROR(rope.status());
  } else {
    r.Double("rope_theta", &c.rope_theta);
    r.Double("partial_rotary_factor", &c.partial_rotary_factor);
    if (const json* rs = r.Find("rope_scaling"); rs != nullptr) {
      if (!rs->is_object()) return InvalidArgument("{}: key 'rope_scaling' must be an object", where);
      KeyReader scaling(*rs, where + " rope_scaling");
      scaling.String("type", &c.rope_type);
      scaling.String("rope_type", &c.rope_type);
      RETURN_IF_ERROR(scaling.status());
    }
  }

  const bool hybrid = c.is_hybrid();
  const bool qwen3_5 = c.architecture == Architecture::kQwen3_5Moe;
  c.one_centered_norm = hybrid;
  c.qk_norm = !llama;
  c.attn_output_gate = hybrid;
  if (qwen3_5) r.Bool("attn_output_gate", &c.attn_output_gate);

  if (hybrid) {
    r.Int("linear_num_key_heads", &c.linear_num_key_heads, true);
    r.Int("linear_num_value_heads", &c.linear_num_value_heads, true);
    r.Int("linear_key_head_dim", &c.linear_key_head_dim, true);
    r.Int("linear_value_head_dim", &c.linear_value_head_dim, true);
    r.Int("linear_conv_kernel_dim", &c.linear_conv_kernel_dim, true);
    r.Int("full_attention_interval", &c.full_attention_interval, false);
    r.Int(qwen3_5 ? "mtp_num_hidden_layers" : "num_nextn_predict_layers", &c.num_mtp_layers,
          false);
  }
  const bool moe = c.architecture != Architecture::kQwen3 && !llama;
  if (moe) {
    r.Int("num_experts", &c.num_experts, true);
    r.Int("num_experts_per_tok", &c.num_experts_per_tok, true);
    r.Int("moe_intermediate_size", &c.moe_intermediate_size, true);
    if (hybrid) r.Int("shared_expert_intermediate_size", &c.shared_expert_intermediate_size, true);
    // Qwen3-MoE's HF default is false; Qwen3-Next's true; Qwen3.5 always renormalises.
    c.norm_topk_prob = c.architecture != Architecture::kQwen3Moe;
    if (!qwen3_5) r.Bool("norm_topk_prob", &c.norm_topk_prob);
    if (!qwen3_5) {
      r.Int("decoder_sparse_step", &c.decoder_sparse_step, false);
      if (const json* m = r.Find("mlp_only_layers"); m != nullptr) {
        if (!m->is_array()) return InvalidArgument("{}: key 'mlp_only_layers' must be a list", where);
        for (const json& e : *m) {
          if (!e.is_number_integer()) {
            return InvalidArgument("{}: key 'mlp_only_layers' must be a list of integers", where);
          }
          c.mlp_only_layers.push_back(e.get<int64_t>());
        }
      }
    }
  }
  // intermediate_size is required when some layer is dense; checked in Validate().
  r.Int("intermediate_size", &c.intermediate_size, !moe);
  RETURN_IF_ERROR(r.status());
  RETURN_IF_ERROR(top.status());

  // layer_types: explicit list, or every full_attention_interval-th layer (docs/spec/model.md
  // §1.2).
  if (const json* lt = r.Find("layer_types"); lt != nullptr) {
    if (!lt->is_array()) return InvalidArgument("{}: key 'layer_types' must be a list", where);
    for (const json& e : *lt) {
      const std::string name = e.is_string() ? e.get<std::string>() : e.dump();
      if (name == "full_attention") {
        c.layer_types.push_back(LayerType::kFullAttention);
      } else if (name == "linear_attention" && hybrid) {
        c.layer_types.push_back(LayerType::kLinearAttention);
      } else {
        return InvalidArgument("{}: key 'layer_types' holds '{}' (expected {})", where, name,
                               hybrid ? "'linear_attention' or 'full_attention'"
                                      : "'full_attention' for this architecture");
      }
    }
  } else if (hybrid) {
    if (c.full_attention_interval <= 0) {
      return InvalidArgument("{}: key 'full_attention_interval' must be positive", where);
    }
    c.layer_types = IntervalLayerTypes(c.num_hidden_layers, c.full_attention_interval);
  } else {
    c.layer_types.assign(static_cast<size_t>(std::max<int64_t>(c.num_hidden_layers, 0)),
                         LayerType::kFullAttention);
  }

  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  Status valid = Validate(c);
  if (!valid.ok()) return valid.WithContext(where);
  return c;
}

}  // namespace

std::string_view ArchitectureName(Architecture arch) {
  for (const ArchInfo& a : kArchs) {
    if (a.arch == arch) return a.hf_name;
  }
  return "unknown";
}

std::string_view ArchitectureFlagName(Architecture arch) {
  for (const ArchInfo& a : kArchs) {
    if (a.arch == arch) return a.flag_name;
  }
  return "unknown";
}

bool ParseArchitectureFlagName(std::string_view name, Architecture* arch) {
  for (const ArchInfo& a : kArchs) {
    if (a.flag_name == name) {
      *arch = a.arch;
      return true;
    }
  }
  return false;
}

std::string_view LayerTypeName(LayerType type) {
  return type == LayerType::kLinearAttention ? "linear_attention" : "full_attention";
}

std::vector<LayerType> IntervalLayerTypes(int64_t num_layers, int64_t full_attention_interval) {
  std::vector<LayerType> types;
  for (int64_t i = 0; i < num_layers; ++i) {
    types.push_back((i + 1) % full_attention_interval != 0 ? LayerType::kLinearAttention
                                                           : LayerType::kFullAttention);
  }
  return types;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (architecture == Architecture::kQwen3_5Moe) return true;
  for (int64_t l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_layers_of(LayerType type) const {
  int64_t n = 0;
  for (LayerType t : layer_types) n += t == type;
  return n;
}

Result<ModelConfig> ParseModelConfig(std::string_view json_text) {
  ASSIGN_OR_RETURN(const json root, ParseJson(json_text, "config.json"));
  return Parse(root);
}

Result<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open {}", path);
  std::stringstream text;
  text << in.rdbuf();
  Result<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) return config.status().WithContext(path);
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  using ojson = nlohmann::ordered_json;
  const bool hybrid = c.is_hybrid();
  const bool qwen3_5 = c.architecture == Architecture::kQwen3_5Moe;
  const bool nested = qwen3_5 && c.architecture_name != "Qwen3_5MoeForCausalLM";

  ojson text;
  text["model_type"] = c.model_type;
  text["vocab_size"] = c.vocab_size;
  text["hidden_size"] = c.hidden_size;
  if (c.intermediate_size > 0) text["intermediate_size"] = c.intermediate_size;
  text["num_hidden_layers"] = c.num_hidden_layers;
  text["num_attention_heads"] = c.num_attention_heads;
  text["num_key_value_heads"] = c.num_key_value_heads;
  text["head_dim"] = c.head_dim;
  text["hidden_act"] = "silu";
  text["max_position_embeddings"] = c.max_position_embeddings;
  text["rms_norm_eps"] = c.rms_norm_eps;
  text["tie_word_embeddings"] = c.tie_word_embeddings;
  text["attention_bias"] = c.attention_bias;
  if (qwen3_5) {
    text["attn_output_gate"] = c.attn_output_gate;
    text["rope_parameters"] = {{"rope_type", c.rope_type},
                               {"rope_theta", c.rope_theta},
                               {"partial_rotary_factor", c.partial_rotary_factor}};
  } else {
    text["rope_theta"] = c.rope_theta;
    if (c.partial_rotary_factor != 1.0 || hybrid) {
      text["partial_rotary_factor"] = c.partial_rotary_factor;
    }
    text["rope_scaling"] = nullptr;
  }
  if (hybrid) {
    text["linear_num_key_heads"] = c.linear_num_key_heads;
    text["linear_num_value_heads"] = c.linear_num_value_heads;
    text["linear_key_head_dim"] = c.linear_key_head_dim;
    text["linear_value_head_dim"] = c.linear_value_head_dim;
    text["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
    text["full_attention_interval"] = c.full_attention_interval;
    ojson types = ojson::array();
    for (LayerType t : c.layer_types) types.push_back(LayerTypeName(t));
    text["layer_types"] = types;
  }
  if (c.num_experts > 0) {
    text["num_experts"] = c.num_experts;
    text["num_experts_per_tok"] = c.num_experts_per_tok;
    text["moe_intermediate_size"] = c.moe_intermediate_size;
    if (hybrid) text["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    if (!qwen3_5) {
      text["norm_topk_prob"] = c.norm_topk_prob;
      text["decoder_sparse_step"] = c.decoder_sparse_step;
      text["mlp_only_layers"] = c.mlp_only_layers;
    }
  }
  if (hybrid) text[qwen3_5 ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = c.num_mtp_layers;
  if (c.bos_token_id >= 0) text["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) text["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) text["eos_token_id"] = c.eos_token_ids;
  if (!c.torch_dtype.empty()) text["torch_dtype"] = c.torch_dtype;

  ojson root;
  root["architectures"] = {c.architecture_name};
  if (nested) {
    root["model_type"] = "qwen3_5_moe";
    root["tie_word_embeddings"] = c.tie_word_embeddings;
    root["text_config"] = std::move(text);
  } else {
    for (auto& [key, value] : text.items()) root[key] = value;
  }
  return root.dump(2) + "\n";
}

}  // namespace moeserve::io
