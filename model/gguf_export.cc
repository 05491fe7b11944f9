#include "model/gguf_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <span>
#include <vector>

#include "core/check.h"
#include "kernels/ref/ggml_blocks_ref.h"
#include "model/checkpoint_layout.h"
#include "model/arch/qwen3_next.h"
#include "model/gguf_checkpoint.h"

namespace moeserve::model {
namespace {

using io::GgufType;

void AddKeys(const io::ModelConfig& c, std::string_view arch, io::GgufWriter& w) {
  const std::string a(arch);
  auto u32 = [&](std::string_view key, int64_t v) {
    w.SetU32(fmt::format("{}.{}", a, key), static_cast<uint32_t>(v));
  };
  w.SetString("general.architecture", a);
  u32("block_count", c.num_hidden_layers);
  u32("context_length", c.max_position_embeddings);
  u32("embedding_length", c.hidden_size);
  if (c.intermediate_size > 0) u32("feed_forward_length", c.intermediate_size);
  u32("attention.head_count", c.num_attention_heads);
  u32("attention.head_count_kv", c.num_key_value_heads);
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  if (c.rotary_dim != c.head_dim) u32("rope.dimension_count", c.rotary_dim);
  w.SetF32(a + ".rope.freq_base", static_cast<float>(c.rope_theta));
  w.SetF32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  if (c.num_experts > 0) {
    u32("expert_count", c.num_experts);
    u32("expert_used_count", c.num_experts_per_tok);
    u32("expert_feed_forward_length", c.moe_intermediate_size);
  }
  if (c.is_hybrid()) {
    u32("block_count", c.num_hidden_layers + c.num_mtp_layers);
    if (c.num_mtp_layers > 0) u32("nextn_predict_layers", c.num_mtp_layers);
    u32("ssm.conv_kernel", c.linear_conv_kernel_dim);
    u32("ssm.state_size", c.linear_key_head_dim);
    u32("ssm.group_count", c.linear_num_key_heads);
    u32("ssm.time_step_rank", c.linear_num_value_heads);
    u32("ssm.inner_size", c.linear_value_dim());
    u32("full_attention_interval", c.full_attention_interval);
    // As the converter writes config.json's layer_types: a flag per block, the MTP blocks' false.
    nlohmann::json recurrent = nlohmann::json::array();
    for (int64_t i = 0; i < c.num_hidden_layers + c.num_mtp_layers; ++i) {
      recurrent.push_back(i < c.num_hidden_layers &&
                          c.layer_types[i] == io::LayerType::kLinearAttention);
    }
    w.SetArray(a + ".attention.recurrent_layers", GgufType::kBool, recurrent);
    u32("expert_shared_feed_forward_length", c.shared_expert_intermediate_size);
  }
  if (c.architecture == io::Architecture::kQwen3_5Moe) {
    // Interleaved MRoPE's (t, h, w) sections over the rotary pairs, which llama.cpp requires;
    // Hugging Face's [11, 11, 10] for 32 pairs. A text token's three positions are equal, so
    // they change nothing for text.
    const int64_t pairs = c.rotary_dim / 2, t = (pairs + 2) / 3, h = (pairs - t + 1) / 2;
    w.SetArray(a + ".rope.dimension_sections", GgufType::kInt32,
               nlohmann::json::array({t, h, pairs - t - h, 0}));
  }
  if (!c.eos_token_ids.empty()) w.SetU32("tokenizer.ggml.eos_token_id", c.eos_token_ids[0]);
  if (c.bos_token_id >= 0) w.SetU32("tokenizer.ggml.bos_token_id", c.bos_token_id);
}

// Rows `rows` of a stored [*, cols] tensor in `dtype` (f32, f16, bf16 convert exactly through
// f32; block formats are quantized row by row), each row's columns in the order `col_order`
// (empty: as stored).
std::string EncodeRows(const io::SafetensorsTensor& t, DType dtype, std::span<const int64_t> rows,
                       std::span<const int64_t> col_order = {}) {
  const int64_t cols = t.shape.back();
  std::vector<float> stored(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
  const size_t in_row = StoredRowBytes(t.dtype, cols), out_row = StoredRowBytes(dtype, cols);
  std::string out(rows.size() * out_row, '\0');
  for (size_t i = 0; i < rows.size(); ++i) {
    auto* to = reinterpret_cast<std::byte*>(out.data() + i * out_row);
    ConvertToF32(t.dtype, t.bytes.data() + rows[i] * in_row, stored.data(), cols);
    if (col_order.empty()) {
      row = stored;
    } else {
      for (int64_t c = 0; c < cols; ++c) row[c] = stored[col_order[c]];
    }
    if (IsGgmlBlockDType(dtype)) {
      kernels::ref::QuantizeGgmlRowRef(dtype, row.data(), to, cols);
    } else {
      ConvertFromF32(row.data(), dtype, to, cols);
    }
  }
  return out;
}

std::string Encode(const io::SafetensorsTensor& t, DType dtype) {
  std::vector<int64_t> rows(static_cast<size_t>(t.numel() / t.shape.back()));
  std::iota(rows.begin(), rows.end(), 0);
  return EncodeRows(t, dtype, rows);
}

// A vector as f32 with the converter's rewrite: the 1 of a (1 + w) norm added, A_log as
// -exp(A_log); viewed as [row_order.size(), *], its rows in the order `row_order` (empty: as
// stored).
std::string EncodeVector(const ResolvedTensor& t, std::span<const int64_t> row_order = {}) {
  std::vector<float> v(static_cast<size_t>(t.stored->numel()));
  ConvertToF32(t.stored->dtype, t.stored->bytes.data(), v.data(), static_cast<int64_t>(v.size()));
  for (float& x : v) {
    if (t.spec.kind == TensorKind::kNormOneCentered) x += 1.0f;
    if (t.spec.kind == TensorKind::kALog) x = -std::exp(x);
  }
  if (!row_order.empty()) {
    const size_t width = v.size() / row_order.size();
    std::vector<float> ordered(v.size());
    for (size_t i = 0; i < row_order.size(); ++i) {
      std::copy_n(v.begin() + static_cast<ptrdiff_t>(row_order[i] * width), width,
                  ordered.begin() + static_cast<ptrdiff_t>(i * width));
    }
    v = std::move(ordered);
  }
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// _LinearAttentionVReorderBase's value-head order, as the source index of each stored entry of a
// v-indexed dimension: `offset` entries kept in place (a qkv tensor's q and k), then nv heads of
// `unit` entries, position p = j * nk + g (tiled) holding Hugging Face's head g * r + j
// (grouped).
std::vector<int64_t> TiledValueOrder(const io::ModelConfig& c, int64_t unit, int64_t offset) {
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, r = nv / nk;
  std::vector<int64_t> order(static_cast<size_t>(offset + nv * unit));
  std::iota(order.begin(), order.begin() + offset, 0);
  for (int64_t p = 0; p < nv; ++p) {
    for (int64_t i = 0; i < unit; ++i) {
      order[offset + p * unit + i] = offset + ((p % nk) * r + p / nk) * unit + i;
    }
  }
  return order;
}

}  // namespace

Status AddGgufModel(const io::ModelConfig& config, const io::SafetensorsCheckpoint& checkpoint,
                    DType matrix_dtype, io::GgufWriter& writer) {
  // Every architecture moeserve runs has its GGUF name (gguf_checkpoint.cc's table).
  const std::string_view arch = GgufArchitectureName(config.architecture);
  CHECK(!arch.empty()) << config.architecture_name << " has no GGUF architecture name";
  const io::ModelConfig::GgufLayout& read = config.gguf;
  if (read.block_quantized || read.gdn_qkv_z_split || read.gdn_a_negated || read.norms_with_one ||
      read.rope_rows_interleaved || read.gdn_v_heads_tiled || read.experts_split) {
    return InvalidArgument("GGUF export writes a Hugging Face checkpoint; this model was read from "
                           "a GGUF file, whose rewrites would be applied twice");
  }
  AddKeys(config, arch, writer);
  ASSIGN_OR_RETURN(const std::vector<ResolvedTensor> tensors, ResolveCheckpoint(config, checkpoint));
  // The names of the file's own layout (the converter's rewrites, as OpenGgufCheckpoint reads).
  io::ModelConfig as_gguf = config;
  if (config.is_hybrid()) as_gguf.gguf.gdn_a_negated = as_gguf.gguf.norms_with_one = true;
  if (config.architecture == io::Architecture::kQwen3Next) as_gguf.gguf.gdn_qkv_z_split = true;
  const bool qwen3_5 = config.architecture == io::Architecture::kQwen3_5Moe;
  if (qwen3_5) as_gguf.gguf.gdn_v_heads_tiled = as_gguf.gguf.experts_split = true;
  // Qwen3.5: the order each v-indexed tensor is stored in (no-ops when nk == nv).
  const int64_t dv = config.linear_value_head_dim, key_dim = config.linear_key_dim();
  std::vector<int64_t> qkv_order, z_order, head_order;
  if (qwen3_5) {
    qkv_order = TiledValueOrder(config, dv, 2 * key_dim);  // qkv rows, conv channels
    z_order = TiledValueOrder(config, dv, 0);              // z rows, out_proj's columns
    head_order = TiledValueOrder(config, 1, 0);            // b, a rows, A_log, dt_bias
  }
  auto stored_order = [&](TensorRole role) -> std::span<const int64_t> {
    switch (role) {
      case TensorRole::kGdnInProjQkv:
      case TensorRole::kGdnConv: return qkv_order;
      case TensorRole::kGdnInProjZ:
      case TensorRole::kGdnOutProj: return z_order;
      case TensorRole::kGdnInProjB:
      case TensorRole::kGdnInProjA:
      case TensorRole::kGdnDtBias:
      case TensorRole::kGdnALog: return head_order;
      default: return {};
    }
  };
  // llama: each q and k head's rows with their rotary halves interleaved (row 2j + t of a head
  // holds Hugging Face's row t * head_dim / 2 + j).
  auto interleaved = [&](int64_t rows) {
    const int64_t hd = config.head_dim, half = hd / 2;
    std::vector<int64_t> out(static_cast<size_t>(rows));
    for (int64_t g = 0; g < rows; ++g) out[g] = g / hd * hd + g % hd % 2 * half + g % hd / 2;
    return out;
  };
  const bool permute_qk = config.architecture == io::Architecture::kLlama;
  // Routed experts' tensors are stacked in expert order under one GGUF name.
  struct Stacked {
    std::vector<int64_t> ne;
    DType dtype;
    std::string bytes;
  };
  std::vector<std::string> order;
  std::map<std::string, Stacked> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int64_t expert, DType dtype,
                 std::string bytes) {
    auto [it, added] = out.try_emplace(name);
    Stacked& s = it->second;
    if (added) {
      order.push_back(name);
      s.ne.assign(shape.rbegin(), shape.rend());
      if (expert >= 0) s.ne.push_back(config.num_experts);
      s.dtype = dtype;
    }
    s.bytes += bytes;
  };
  for (const ResolvedTensor& t : tensors) {
    const int64_t rows = t.spec.shape.front(), cols = t.spec.shape.back();
    // Matrices (stacked experts' [E, out, in] too), not the [1, H] shared expert gate.
    const bool matrix = (t.spec.shape.size() == 3 || rows > 1) &&
                        (t.spec.kind == TensorKind::kLinear || t.spec.kind == TensorKind::kEmbedding);
    const std::span<const int64_t> order = stored_order(t.spec.role);
    if (!matrix || t.spec.role == TensorRole::kRouter) {  // routers stay f32, as llama.cpp keeps them
      std::vector<int64_t> shape = t.spec.shape;
      if (t.spec.kind == TensorKind::kConvWeight) shape = {shape.front(), shape.back()};  // squeezed
      add(GgufNameOf(as_gguf, t.spec).name, shape, -1, DType::kF32,
          t.spec.role == TensorRole::kRouter ? Encode(*t.stored, DType::kF32)
                                             : EncodeVector(t, order));
    } else if (t.spec.role == TensorRole::kExpertsGateUp) {
      // Qwen3.5's [E, 2I, H] split as the converter splits it: ffn_gate_exps (each expert's rows
      // [0, I)) and ffn_up_exps (rows [I, 2I)), each [E, I, H].
      const int64_t E = t.spec.shape[0], I = t.spec.shape[1] / 2;
      for (const TensorRole half : {TensorRole::kExpertGate, TensorRole::kExpertUp}) {
        std::vector<int64_t> part_rows;
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t i = 0; i < I; ++i) {
            part_rows.push_back(e * 2 * I + (half == TensorRole::kExpertUp ? I : 0) + i);
          }
        }
        CheckpointTensor part = t.spec;
        part.role = half;
        add(GgufNameOf(as_gguf, part).name, {E, I, cols}, -1, matrix_dtype,
            EncodeRows(*t.stored, matrix_dtype, part_rows));
      }
    } else if (t.spec.role == TensorRole::kGdnOutProj && !order.empty()) {
      std::vector<int64_t> all(static_cast<size_t>(rows));
      std::iota(all.begin(), all.end(), 0);
      add(GgufNameOf(as_gguf, t.spec).name, t.spec.shape, -1, matrix_dtype,
          EncodeRows(*t.stored, matrix_dtype, all, order));
    } else if (!order.empty()) {
      add(GgufNameOf(as_gguf, t.spec).name, t.spec.shape, -1, matrix_dtype,
          EncodeRows(*t.stored, matrix_dtype, order));
    } else if (t.spec.role == TensorRole::kGdnInProjQkvz) {
      // Qwen3-Next's interleaved rows regrouped as [q | k | v] (attn_qkv) and z (attn_gate).
      const std::vector<int64_t> split = qwen3_next::QkvzSourceRows(config);
      const size_t qkv_rows = static_cast<size_t>(config.linear_conv_dim());
      CheckpointTensor part = t.spec;
      part.role = TensorRole::kGdnInProjQkv;
      add(GgufNameOf(as_gguf, part).name, {static_cast<int64_t>(qkv_rows), cols}, -1,
          matrix_dtype, EncodeRows(*t.stored, matrix_dtype, {split.data(), qkv_rows}));
      part.role = TensorRole::kGdnInProjZ;
      add(GgufNameOf(as_gguf, part).name, {rows - static_cast<int64_t>(qkv_rows), cols}, -1,
          matrix_dtype,
          EncodeRows(*t.stored, matrix_dtype, {split.data() + qkv_rows, split.size() - qkv_rows}));
    } else if (permute_qk &&
               (t.spec.role == TensorRole::kQProj || t.spec.role == TensorRole::kKProj)) {
      add(GgufNameOf(as_gguf, t.spec).name, t.spec.shape, -1, matrix_dtype,
          EncodeRows(*t.stored, matrix_dtype, interleaved(rows)));
    } else {
      const GgufName where = GgufNameOf(as_gguf, t.spec);
      add(where.name, t.spec.shape, where.expert, matrix_dtype, Encode(*t.stored, matrix_dtype));
    }
  }
  for (const std::string& name : order) {
    Stacked& s = out[name];
    writer.AddTensor(name, s.ne, io::GgmlTypeOfDType(s.dtype), std::move(s.bytes));
  }
  return OkStatus();
}

}  // namespace moeserve::model
