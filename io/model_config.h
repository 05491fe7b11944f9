// config.json -> ModelConfig: the hyper-parameters of every architecture moeserve runs, parsed
// once into a plain struct (no JSON past this file).
//
// Supported `architectures[0]`: Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration and
// Qwen3_5MoeForCausalLM (keys under "text_config" when present, RoPE under "rope_parameters"),
// Qwen3MoeForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM. Keys and defaults follow the Hugging
// Face config classes; docs/spec/model.md §1 is the reference for the hybrid models.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::io {

enum class Architecture {
  kQwen3Next,   // Qwen3NextForCausalLM: interleaved in_proj_qkvz / in_proj_ba, per-expert tensors
  kQwen3_5Moe,  // Qwen3.5-MoE: split GDN projections, fused experts
  kQwen3Moe,    // Qwen3MoeForCausalLM: full attention + routed experts (no shared expert)
  kQwen3,       // Qwen3ForCausalLM: dense, q/k norm
  kLlama,       // LlamaForCausalLM: dense, no q/k norm
};

enum class LayerType { kLinearAttention, kFullAttention };

// The HF name ("Qwen3NextForCausalLM", ...) and the make-model flag name ("qwen3_next", ...).
std::string_view ArchitectureName(Architecture arch);
std::string_view ArchitectureFlagName(Architecture arch);
bool ParseArchitectureFlagName(std::string_view name, Architecture* arch);
std::string_view LayerTypeName(LayerType type);  // "linear_attention" | "full_attention"

struct ModelConfig {
  Architecture architecture = Architecture::kQwen3Next;
  std::string architecture_name;  // as written in config.json
  std::string model_type;         // "qwen3_next", "qwen3_5_moe_text", ...

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  std::vector<LayerType> layer_types;  // size num_hidden_layers
  int64_t full_attention_interval = 4;

  // Full attention.
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim = 0;  // int(head_dim * partial_rotary_factor)
  double rope_theta = 10000.0;
  std::string rope_type = "default";
  bool attention_bias = false;
  bool attn_output_gate = false;  // q_proj doubled into [query; gate] per head (hybrid models)
  bool qk_norm = false;           // per-head q_norm / k_norm (Qwen3 family)

  // Gated DeltaNet (linear attention).
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;

  // MLP / MoE.
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t num_experts = 0;        // 0 = dense model
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // Norms: (1 + w) zero-centred RMSNorm (hybrid models) or plain w (Qwen3, Llama).
  bool one_centered_norm = false;
  double rms_norm_eps = 1e-6;

  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 32768;
  int64_t num_mtp_layers = 0;  // num_nextn_predict_layers (Next) / mtp_num_hidden_layers (3.5)
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;  // -1: none
  std::string torch_dtype;    // "bfloat16", ... ("" if absent)
  // How a GGUF file stores what Hugging Face's layout of the architecture would (llama.cpp's
  // converter rewrote these; model/gguf_checkpoint.h). All false for a Hugging Face folder.
  struct GgufLayout {
    bool block_quantized = false;  // matrices in GGML's block formats: loads default to int8
    bool gdn_qkv_z_split = false;  // Qwen3-Next's in_proj_qkvz as [q | k | v] and z
    bool gdn_a_negated = false;    // A_log stored as -exp(A_log)
    bool norms_with_one = false;   // (1 + w) norms stored with the 1 added
    // q and k rows of each head with their two rotary halves interleaved (llama: ggml's rope
    // pairs neighbours); head row 2j + t holds Hugging Face's row t * head_dim / 2 + j.
    bool rope_rows_interleaved = false;
    // Gated DeltaNet value heads in llama.cpp's tiled order (qwen35moe): value head p reads key
    // head p % nk, not p / (nv / nk) as in Hugging Face's grouped order. Every v-indexed tensor
    // (v rows of in_proj_qkv and their conv channels, z, b, a, A_log, dt_bias, out_proj's
    // columns) is stored in that order, so the layer runs the file as stored.
    bool gdn_v_heads_tiled = false;
    // Qwen3.5's fused experts.gate_up_proj / down_proj stored per projection (ffn_gate_exps,
    // ffn_up_exps, ffn_down_exps): walked as per-expert gate, up and down tensors.
    bool experts_split = false;
  } gguf;

  // Derived sizes of the GDN layers (docs/spec/model.md §1.4).
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }

  bool is_hybrid() const {
    return architecture == Architecture::kQwen3Next || architecture == Architecture::kQwen3_5Moe;
  }
  // Layer i has routed experts (else a dense MLP of intermediate_size).
  bool IsMoeLayer(int64_t layer) const;
  int64_t num_layers_of(LayerType type) const;
};

// docs/spec/model.md §1.2: every interval-th layer (0-based i with (i + 1) % interval == 0) is full
// attention, the others linear attention.
std::vector<LayerType> IntervalLayerTypes(int64_t num_layers, int64_t full_attention_interval);

// Parses the text of a config.json. Errors name the offending key.
Result<ModelConfig> ParseModelConfig(std::string_view json_text);
// Reads and parses dir/config.json; errors name the file.
Result<ModelConfig> LoadModelConfig(const std::string& dir);

// The config.json text for `config`, in the layout Hugging Face writes for its architecture
// (Qwen3.5-MoE: text keys under "text_config", RoPE under "rope_parameters"). Parsing the result
// gives back `config`.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace moeserve::io
