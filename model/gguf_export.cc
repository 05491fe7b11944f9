#include "model/gguf_export.h"

#include <fmt/format.h>

#include <map>
#include <vector>

#include "kernels/ref/ggml_blocks_ref.h"
#include "model/checkpoint_layout.h"
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
  if (!c.eos_token_ids.empty()) w.SetU32("tokenizer.ggml.eos_token_id", c.eos_token_ids[0]);
  if (c.bos_token_id >= 0) w.SetU32("tokenizer.ggml.bos_token_id", c.bos_token_id);
}

// A stored tensor's rows in `dtype` (vectors and f32/f16/bf16 convert exactly through f32; block
// formats are quantized row by row).
std::string Encode(const io::SafetensorsTensor& t, DType dtype) {
  const int64_t cols = t.shape.back(), rows = t.numel() / cols;
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t in_row = StoredRowBytes(t.dtype, cols), out_row = StoredRowBytes(dtype, cols);
  std::string out(static_cast<size_t>(rows) * out_row, '\0');
  for (int64_t r = 0; r < rows; ++r) {
    const std::byte* from = t.bytes.data() + r * in_row;
    auto* to = reinterpret_cast<std::byte*>(out.data() + r * out_row);
    ConvertToF32(t.dtype, from, row.data(), cols);
    if (IsGgmlBlockDType(dtype)) {
      kernels::ref::QuantizeGgmlRowRef(dtype, row.data(), to, cols);
    } else {
      ConvertFromF32(row.data(), dtype, to, cols);
    }
  }
  return out;
}

}  // namespace

Status AddGgufModel(const io::ModelConfig& config, const io::SafetensorsCheckpoint& checkpoint,
                    DType matrix_dtype, io::GgufWriter& writer) {
  const std::string_view arch = GgufArchitectureName(config.architecture);
  if (arch.empty()) {
    return Unimplemented("GGUF export covers qwen3moe and qwen3, not {}",
                         config.architecture_name);
  }
  AddKeys(config, arch, writer);
  ASSIGN_OR_RETURN(const std::vector<ResolvedTensor> tensors, ResolveCheckpoint(config, checkpoint));
  // Routed experts' tensors are stacked in expert order under one GGUF name.
  struct Stacked {
    std::vector<int64_t> ne;
    DType dtype;
    std::string bytes;
  };
  std::vector<std::string> order;
  std::map<std::string, Stacked> out;
  for (const ResolvedTensor& t : tensors) {
    const GgufName where = GgufNameOf(t.spec);
    const bool matrix = t.spec.shape.size() == 2 && (t.spec.kind == TensorKind::kLinear ||
                                                     t.spec.kind == TensorKind::kEmbedding);
    const DType dtype = matrix ? matrix_dtype : DType::kF32;
    auto [it, added] = out.try_emplace(where.name);
    Stacked& s = it->second;
    if (added) {
      order.push_back(where.name);
      s.ne.assign(t.spec.shape.rbegin(), t.spec.shape.rend());
      if (where.expert >= 0) s.ne.push_back(config.num_experts);
      s.dtype = dtype;
    }
    s.bytes += Encode(*t.stored, dtype);
  }
  for (const std::string& name : order) {
    Stacked& s = out[name];
    writer.AddTensor(name, s.ne, io::GgmlTypeOfDType(s.dtype), std::move(s.bytes));
  }
  return OkStatus();
}

}  // namespace moeserve::model
