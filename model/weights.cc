#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "model/arch/qwen3_next.h"
#include "model/checkpoint_layout.h"

namespace moeserve::model {
namespace {

using io::SafetensorsTensor;

bool IsFloatDType(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

OwnedTensor NewMatrix(DType dtype, int64_t rows, int64_t cols) {
  return OwnedTensor(dtype, {rows, cols});
}

// Copies rows [src_row, src_row + rows) of `src` (viewed as [R, cols]) into rows
// [dst_row, dst_row + rows) of the matrix `dst`, converting the dtype through f32 when needed.
void CopyRows(const SafetensorsTensor& src, int64_t cols, int64_t src_row, int64_t rows,
              const Tensor& dst, int64_t dst_row) {
  CHECK_EQ(dst.dim(1), cols);
  CHECK_LE(dst_row + rows, dst.dim(0));
  const size_t src_size = DTypeSize(src.dtype), dst_size = DTypeSize(dst.dtype());
  CHECK_LE(static_cast<size_t>((src_row + rows) * cols) * src_size, src.bytes.size());
  const std::byte* from = src.bytes.data() + src_row * cols * src_size;
  std::byte* to = static_cast<std::byte*>(dst.data()) + dst_row * cols * dst_size;
  if (src.dtype == dst.dtype()) {
    std::memcpy(to, from, static_cast<size_t>(rows * cols) * src_size);
    return;
  }
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    ConvertToF32(src.dtype, from + r * cols * src_size, row.data(), cols);
    ConvertFromF32(row.data(), dst.dtype(), to + r * cols * dst_size, cols);
  }
}

// Copies single source rows, dst row i <- src row source_rows[i] (Qwen3-Next's permutation).
void CopyPermutedRows(const SafetensorsTensor& src, int64_t cols,
                      const std::vector<int64_t>& source_rows, const Tensor& dst) {
  for (size_t i = 0; i < source_rows.size(); ++i) {
    CopyRows(src, cols, source_rows[i], 1, dst, static_cast<int64_t>(i));
  }
}

std::vector<float> ToF32(const SafetensorsTensor& t) {
  std::vector<float> out(t.numel());
  ConvertToF32(t.dtype, t.bytes.data(), out.data(), out.size());
  return out;
}

// A norm weight in f32, with the 1 of a (1 + w) RMSNorm added once here.
std::vector<float> NormWeight(const CheckpointTensor& spec, const SafetensorsTensor& t) {
  std::vector<float> w = ToF32(t);
  if (spec.kind == TensorKind::kNormOneCentered) {
    for (float& x : w) x += 1.0f;
  }
  return w;
}

// Allocates the matrices that several checkpoint tensors are copied into.
void AllocateLayer(const io::ModelConfig& c, DType dtype, io::LayerType type, bool moe,
                   DecoderLayerWeights* layer) {
  const int64_t H = c.hidden_size;
  layer->type = type;
  layer->moe = moe;
  if (type == io::LayerType::kFullAttention) {
    const int64_t q_rows = c.num_attention_heads * c.head_dim * (c.attn_output_gate ? 2 : 1);
    const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
    layer->attention.qkv = NewMatrix(dtype, q_rows + 2 * kv_rows, H);
    if (c.attention_bias) layer->attention.qkv_bias.assign(q_rows + 2 * kv_rows, 0.0f);
  } else {
    layer->gdn.in_proj_qkvz =
        NewMatrix(dtype, 2 * c.linear_key_dim() + 2 * c.linear_value_dim(), H);
    layer->gdn.in_proj_ba = NewMatrix(dtype, 2 * c.linear_num_value_heads, H);
  }
  if (moe) {
    layer->experts.experts.resize(c.num_experts);
    for (SwiGluWeights& e : layer->experts.experts) {
      e.gate_up = NewMatrix(dtype, 2 * c.moe_intermediate_size, H);
    }
    if (c.shared_expert_intermediate_size > 0) {
      layer->experts.shared.gate_up = NewMatrix(dtype, 2 * c.shared_expert_intermediate_size, H);
    }
  } else {
    layer->mlp.gate_up = NewMatrix(dtype, 2 * c.intermediate_size, H);
  }
}

DType ChooseMatrixDType(const std::vector<ResolvedTensor>& tensors) {
  for (const ResolvedTensor& t : tensors) {
    if (t.spec.kind == TensorKind::kLinear && t.stored->dtype == DType::kBF16) return DType::kBF16;
  }
  return DType::kF32;
}

}  // namespace

Result<ModelWeights> LoadWeights(const io::ModelConfig& c,
                                 const io::SafetensorsCheckpoint& checkpoint,
                                 std::optional<DType> matrix_dtype) {
  ASSIGN_OR_RETURN(std::vector<ResolvedTensor> tensors, ResolveCheckpoint(c, checkpoint));
  for (const ResolvedTensor& t : tensors) {
    if (!IsFloatDType(t.stored->dtype)) {
      return Unimplemented("tensor '{}' in {} has dtype {}; moeserve loads bf16, f16 and f32",
                           t.spec.name, t.stored->file, DTypeName(t.stored->dtype));
    }
  }
  ModelWeights w;
  w.matrix_dtype = matrix_dtype.value_or(ChooseMatrixDType(tensors));
  if (w.matrix_dtype != DType::kBF16 && w.matrix_dtype != DType::kF32) {
    return InvalidArgument("weight dtype {} is not supported (bf16 or f32)",
                           DTypeName(w.matrix_dtype));
  }
  const DType dt = w.matrix_dtype;
  w.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    AllocateLayer(c, dt, c.layer_types[i], c.IsMoeLayer(i), &w.layers[i]);
  }
  w.mtp.layers.resize(c.num_mtp_layers);
  for (DecoderLayerWeights& layer : w.mtp.layers) {
    AllocateLayer(c, dt, io::LayerType::kFullAttention, c.num_experts > 0, &layer);
  }

  const int64_t H = c.hidden_size;
  const int64_t q_rows = c.num_attention_heads * c.head_dim * (c.attn_output_gate ? 2 : 1);
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  const int64_t key_dim = c.linear_key_dim(), value_dim = c.linear_value_dim();
  const int64_t nv = c.linear_num_value_heads;
  const std::vector<int64_t> qkvz_rows =
      c.architecture == io::Architecture::kQwen3Next ? qwen3_next::QkvzSourceRows(c)
                                                     : std::vector<int64_t>();
  const std::vector<int64_t> ba_rows = c.architecture == io::Architecture::kQwen3Next
                                           ? qwen3_next::BaSourceRows(c)
                                           : std::vector<int64_t>();

  for (const ResolvedTensor& rt : tensors) {
    const CheckpointTensor& spec = rt.spec;
    const SafetensorsTensor& src = *rt.stored;
    DecoderLayerWeights* layer = nullptr;
    if (spec.layer >= 0) layer = spec.mtp ? &w.mtp.layers[spec.layer] : &w.layers[spec.layer];
    // A whole 2-D tensor as a new matrix.
    auto matrix = [&]() {
      OwnedTensor m = NewMatrix(dt, spec.shape[0], spec.shape[1]);
      CopyRows(src, spec.shape[1], 0, spec.shape[0], m.view(), 0);
      return m;
    };
    auto into_rows = [&](const OwnedTensor& dst, int64_t dst_row) {
      CopyRows(src, spec.shape.back(), 0, spec.shape[spec.shape.size() - 2], dst.view(), dst_row);
    };
    auto copy_bias = [&](std::vector<float>& dst, int64_t offset) {
      const std::vector<float> b = ToF32(src);
      std::copy(b.begin(), b.end(), dst.begin() + offset);
    };
    switch (spec.role) {
      case TensorRole::kEmbedding: w.embedding = matrix(); break;
      case TensorRole::kFinalNorm: w.final_norm = NormWeight(spec, src); break;
      case TensorRole::kLmHead: w.lm_head = matrix(); break;
      case TensorRole::kInputNorm: layer->input_norm = NormWeight(spec, src); break;
      case TensorRole::kPostAttentionNorm:
        layer->post_attention_norm = NormWeight(spec, src);
        break;

      case TensorRole::kQProj: into_rows(layer->attention.qkv, 0); break;
      case TensorRole::kKProj: into_rows(layer->attention.qkv, q_rows); break;
      case TensorRole::kVProj: into_rows(layer->attention.qkv, q_rows + kv_rows); break;
      case TensorRole::kOProj: layer->attention.o_proj = matrix(); break;
      case TensorRole::kQBias: copy_bias(layer->attention.qkv_bias, 0); break;
      case TensorRole::kKBias: copy_bias(layer->attention.qkv_bias, q_rows); break;
      case TensorRole::kVBias: copy_bias(layer->attention.qkv_bias, q_rows + kv_rows); break;
      case TensorRole::kOBias: layer->attention.o_bias = ToF32(src); break;
      case TensorRole::kQNorm: layer->attention.q_norm = NormWeight(spec, src); break;
      case TensorRole::kKNorm: layer->attention.k_norm = NormWeight(spec, src); break;

      case TensorRole::kGdnInProjQkvz:
        CopyPermutedRows(src, H, qkvz_rows, layer->gdn.in_proj_qkvz.view());
        break;
      case TensorRole::kGdnInProjBa:
        CopyPermutedRows(src, H, ba_rows, layer->gdn.in_proj_ba.view());
        break;
      case TensorRole::kGdnInProjQkv: into_rows(layer->gdn.in_proj_qkvz, 0); break;
      case TensorRole::kGdnInProjZ:
        into_rows(layer->gdn.in_proj_qkvz, 2 * key_dim + value_dim);
        break;
      case TensorRole::kGdnInProjB: into_rows(layer->gdn.in_proj_ba, 0); break;
      case TensorRole::kGdnInProjA: into_rows(layer->gdn.in_proj_ba, nv); break;
      case TensorRole::kGdnConv: {
        // [conv_dim, 1, Kc] -> [Kc][conv_dim], so the per-token conv runs across channels.
        const std::vector<float> conv = ToF32(src);
        const int64_t C = spec.shape[0], K = spec.shape[2];
        layer->gdn.conv.resize(C * K);
        for (int64_t ch = 0; ch < C; ++ch) {
          for (int64_t j = 0; j < K; ++j) layer->gdn.conv[j * C + ch] = conv[ch * K + j];
        }
        break;
      }
      case TensorRole::kGdnDtBias: layer->gdn.dt_bias = ToF32(src); break;
      case TensorRole::kGdnALog: {
        layer->gdn.neg_exp_a = ToF32(src);
        for (float& a : layer->gdn.neg_exp_a) a = -std::exp(a);
        break;
      }
      case TensorRole::kGdnNorm: layer->gdn.norm = NormWeight(spec, src); break;
      case TensorRole::kGdnOutProj: layer->gdn.out_proj = matrix(); break;

      case TensorRole::kRouter: layer->experts.router = matrix(); break;
      case TensorRole::kExpertGate:
        into_rows(layer->experts.experts[spec.expert].gate_up, 0);
        break;
      case TensorRole::kExpertUp:
        into_rows(layer->experts.experts[spec.expert].gate_up, c.moe_intermediate_size);
        break;
      case TensorRole::kExpertDown: layer->experts.experts[spec.expert].down = matrix(); break;
      case TensorRole::kExpertsGateUp:  // [E, 2I, H]: rows [0, I) gate, [I, 2I) up
        for (int64_t e = 0; e < spec.shape[0]; ++e) {
          CopyRows(src, H, e * spec.shape[1], spec.shape[1],
                   layer->experts.experts[e].gate_up.view(), 0);
        }
        break;
      case TensorRole::kExpertsDown:  // [E, H, I]
        for (int64_t e = 0; e < spec.shape[0]; ++e) {
          OwnedTensor down = NewMatrix(dt, spec.shape[1], spec.shape[2]);
          CopyRows(src, spec.shape[2], e * spec.shape[1], spec.shape[1], down.view(), 0);
          layer->experts.experts[e].down = std::move(down);
        }
        break;
      case TensorRole::kSharedExpertGate: into_rows(layer->experts.shared.gate_up, 0); break;
      case TensorRole::kSharedExpertUp:
        into_rows(layer->experts.shared.gate_up, c.shared_expert_intermediate_size);
        break;
      case TensorRole::kSharedExpertDown: layer->experts.shared.down = matrix(); break;
      case TensorRole::kSharedExpertGateScalar: layer->experts.shared_gate = ToF32(src); break;

      case TensorRole::kMlpGate: into_rows(layer->mlp.gate_up, 0); break;
      case TensorRole::kMlpUp: into_rows(layer->mlp.gate_up, c.intermediate_size); break;
      case TensorRole::kMlpDown: layer->mlp.down = matrix(); break;

      case TensorRole::kMtpFc: w.mtp.fc = matrix(); break;
      case TensorRole::kMtpPreFcNormEmbedding:
        w.mtp.pre_fc_norm_embedding = NormWeight(spec, src);
        break;
      case TensorRole::kMtpPreFcNormHidden:
        w.mtp.pre_fc_norm_hidden = NormWeight(spec, src);
        break;
      case TensorRole::kMtpNorm: w.mtp.norm = NormWeight(spec, src); break;
    }
  }
  return w;
}

}  // namespace moeserve::model
