#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/quantize.h"
#include "model/arch/qwen3_next.h"
#include "model/checkpoint_layout.h"

namespace moeserve::model {
namespace {

using io::SafetensorsTensor;

bool IsFloatDType(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

// How the matrices of a load are stored: `base` (bf16 or f32), or for --weight-dtype int8 /
// int4 that packed format where MatrixDType allows it.
struct MatrixFormat {
  DType requested;
  DType base;
  DType For(TensorRole role, int64_t cols) const {
    return MatrixDType(requested, base, role, cols);
  }
};

OwnedTensor NewMatrix(const MatrixFormat& format, TensorRole role, int64_t rows, int64_t cols) {
  return OwnedTensor(format.For(role, cols), {rows, cols});
}

// Row indices of a source tensor: the concatenation of ranges, each shifted by `offset`.
std::vector<int64_t> Rows(std::initializer_list<Range> ranges, int64_t offset = 0) {
  std::vector<int64_t> rows;
  for (const Range& r : ranges) {
    for (int64_t i = r.begin; i < r.end(); ++i) rows.push_back(offset + i);
  }
  return rows;
}

// Copies columns `cols` of the source rows `rows` (of `src` viewed as [R, src_cols]) into
// consecutive rows of the matrix `dst` from dst_row, converting the dtype through f32 when
// needed.
void CopyBlock(const SafetensorsTensor& src, int64_t src_cols, const std::vector<int64_t>& rows,
               Range cols, const Tensor& dst, int64_t dst_row) {
  CHECK_EQ(dst.dim(1), cols.count);
  CHECK_LE(cols.end(), src_cols);
  CHECK_LE(dst_row + static_cast<int64_t>(rows.size()), dst.dim(0));
  const size_t src_size = DTypeSize(src.dtype), dst_size = DTypeSize(dst.dtype());
  const bool packed = IsPackedDType(dst.dtype());
  std::vector<float> row(src.dtype == dst.dtype() ? 0 : cols.count);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK_LE(static_cast<size_t>((rows[i] + 1) * src_cols) * src_size, src.bytes.size());
    const std::byte* from = src.bytes.data() + (rows[i] * src_cols + cols.begin) * src_size;
    if (packed) {  // whole rows: each is quantized on its own
      ConvertToF32(src.dtype, from, row.data(), cols.count);
      kernels::QuantizeRow(row.data(), dst, dst_row + static_cast<int64_t>(i));
      continue;
    }
    std::byte* to = static_cast<std::byte*>(dst.data()) +
                    (dst_row + static_cast<int64_t>(i)) * cols.count * dst_size;
    if (src.dtype == dst.dtype()) {
      std::memcpy(to, from, cols.count * src_size);
    } else {
      ConvertToF32(src.dtype, from, row.data(), cols.count);
      ConvertFromF32(row.data(), dst.dtype(), to, cols.count);
    }
  }
}

// The entries of a vector at the given indices.
std::vector<float> Gather(const std::vector<float>& v, const std::vector<int64_t>& at) {
  std::vector<float> out(at.size());
  for (size_t i = 0; i < at.size(); ++i) out[i] = v[at[i]];
  return out;
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

// Allocates the matrices that several checkpoint tensors are copied into, at this rank's sizes
// (`shard.local`); under --ep only the experts the rank holds.
void AllocateLayer(const ShardLayout& shard, const MatrixFormat& f, io::LayerType type, bool moe,
                   DecoderLayerWeights* layer) {
  const io::ModelConfig& c = shard.local;
  const int64_t H = c.hidden_size;
  layer->type = type;
  layer->moe = moe;
  if (type == io::LayerType::kFullAttention) {
    const int64_t q_rows = c.num_attention_heads * c.head_dim * (c.attn_output_gate ? 2 : 1);
    const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
    layer->attention.qkv = NewMatrix(f, TensorRole::kQProj, q_rows + 2 * kv_rows, H);
    if (c.attention_bias) layer->attention.qkv_bias.assign(q_rows + 2 * kv_rows, 0.0f);
  } else {
    layer->gdn.in_proj_qkvz = NewMatrix(f, TensorRole::kGdnInProjQkvz,
                                        2 * c.linear_key_dim() + 2 * c.linear_value_dim(), H);
    layer->gdn.in_proj_ba =
        NewMatrix(f, TensorRole::kGdnInProjBa, 2 * c.linear_num_value_heads, H);
  }
  if (moe) {
    layer->experts.experts.resize(c.num_experts);
    for (int64_t e = 0; e < c.num_experts; ++e) {
      if (!shard.holds_expert(e)) continue;
      layer->experts.experts[e].gate_up =
          NewMatrix(f, TensorRole::kExpertGate, 2 * c.moe_intermediate_size, H);
      layer->experts.experts[e].down =
          NewMatrix(f, TensorRole::kExpertDown, H, c.moe_intermediate_size);
    }
    if (c.shared_expert_intermediate_size > 0) {
      layer->experts.shared.gate_up =
          NewMatrix(f, TensorRole::kSharedExpertGate, 2 * c.shared_expert_intermediate_size, H);
    }
  } else {
    layer->mlp.gate_up = NewMatrix(f, TensorRole::kMlpGate, 2 * c.intermediate_size, H);
  }
}

DType ChooseMatrixDType(const std::vector<ResolvedTensor>& tensors) {
  for (const ResolvedTensor& t : tensors) {
    if (t.spec.kind == TensorKind::kLinear && t.stored->dtype == DType::kBF16) return DType::kBF16;
  }
  return DType::kF32;
}

}  // namespace

DType MatrixDType(DType requested, DType base, TensorRole role, int64_t cols) {
  if (!IsPackedDType(requested)) return requested;
  switch (role) {
    case TensorRole::kEmbedding:  // rows looked up, not multiplied
    case TensorRole::kRouter:     // small, and its argmax picks the experts
      return base;
    case TensorRole::kLmHead:  // 8 bits under 4 too (llama.cpp keeps the output layer wider)
      return QuantizesActivations(requested) && kernels::CanPack(DType::kQ8A8, cols)
                 ? DType::kQ8A8
                 : DType::kQ8;
    default:
      return kernels::CanPack(requested, cols) ? requested : base;
  }
}

double BytesPerWeight(DType dtype, int64_t cols) {
  switch (dtype) {
    case DType::kQ8:
    case DType::kQ8A8: return 1.0 + static_cast<double>(sizeof(float)) / static_cast<double>(cols);
    case DType::kQ4:
    case DType::kQ4A8: return 0.5 + static_cast<double>(sizeof(float)) / kQ4Group;
    default: return static_cast<double>(DTypeSize(dtype));
  }
}

Result<ModelWeights> LoadWeights(const io::ModelConfig& c, const ShardLayout& shard,
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
  if (w.matrix_dtype != DType::kBF16 && w.matrix_dtype != DType::kF32 &&
      !IsPackedDType(w.matrix_dtype)) {
    return InvalidArgument("weight dtype {} is not supported (bf16, f32, int8 or int4)",
                           DTypeName(w.matrix_dtype));
  }
  // Packed formats keep what they cannot hold (routers, embeddings, int4's odd widths) in the
  // checkpoint's own precision.
  w.base_dtype = IsPackedDType(w.matrix_dtype) ? ChooseMatrixDType(tensors) : w.matrix_dtype;
  const MatrixFormat format{w.matrix_dtype, w.base_dtype};
  w.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    AllocateLayer(shard, format, c.layer_types[i], c.IsMoeLayer(i), &w.layers[i]);
  }
  w.mtp.layers.resize(c.num_mtp_layers);
  for (DecoderLayerWeights& layer : w.mtp.layers) {
    AllocateLayer(shard, format, io::LayerType::kFullAttention, c.num_experts > 0, &layer);
  }

  // Global sizes, and this rank's slices of them (shard.h).
  const io::ModelConfig& local = shard.local;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_stride = c.attn_output_gate ? 2 * hd : hd;
  const int64_t q_rows = local.num_attention_heads * q_stride;  // local rows of the qkv matrix
  const int64_t kv_rows = local.num_key_value_heads * hd;
  const std::vector<int64_t> q_src = Rows({{shard.q_heads.begin * q_stride, q_rows}});
  const std::vector<int64_t> kv_src = Rows({{shard.kv_heads.begin * hd, kv_rows}});
  const Range o_cols{shard.q_heads.begin * hd, shard.q_heads.count * hd};
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t key_dim = c.linear_key_dim(), value_dim = c.linear_value_dim();
  const int64_t nv = c.linear_num_value_heads, nv_local = local.linear_num_value_heads;
  const Range gdn_k{shard.gdn_key_heads.begin * dk, shard.gdn_key_heads.count * dk};
  const Range gdn_v{shard.gdn_value_heads.begin * dv, shard.gdn_value_heads.count * dv};
  // Rows of the split layout [q | k | v | z] and [b | a] this rank keeps; the conv channels are
  // the [q | k | v] part.
  const std::vector<int64_t> qkv_local = Rows({gdn_k, {key_dim + gdn_k.begin, gdn_k.count},
                                               {2 * key_dim + gdn_v.begin, gdn_v.count}});
  std::vector<int64_t> qkvz_local = qkv_local;
  for (int64_t i : Rows({gdn_v}, 2 * key_dim + value_dim)) qkvz_local.push_back(i);
  const std::vector<int64_t> ba_local =
      Rows({shard.gdn_value_heads, {nv + shard.gdn_value_heads.begin, nv_local}});
  // Qwen3-Next's interleaved rows: the source row of each split-layout row.
  std::vector<int64_t> qkvz_src = qkvz_local, ba_src = ba_local;
  if (c.architecture == io::Architecture::kQwen3Next) {
    const std::vector<int64_t> qkvz_rows = qwen3_next::QkvzSourceRows(c);
    const std::vector<int64_t> ba_rows = qwen3_next::BaSourceRows(c);
    for (int64_t& r : qkvz_src) r = qkvz_rows[r];
    for (int64_t& r : ba_src) r = ba_rows[r];
  }
  const int64_t I = c.moe_intermediate_size;
  // Rows of an expert's [gate | up] (2 I rows) this rank keeps: its slice of each half.
  auto gate_up_rows = [](Range slice, int64_t width, int64_t offset) {
    return Rows({slice, {width + slice.begin, slice.count}}, offset);
  };
  const bool rank0 = shard.spec.rank == 0;

  // A model that takes more than a second to load reports its progress, about once a second
  // (rank 0 only): the checkpoint's bytes read so far.
  size_t total_bytes = 0, done_bytes = 0;
  for (const ResolvedTensor& rt : tensors) total_bytes += rt.stored->bytes.size();
  const Stopwatch load_watch;
  double next_report_s = 1.0;
  for (const ResolvedTensor& rt : tensors) {
    const CheckpointTensor& spec = rt.spec;
    const SafetensorsTensor& src = *rt.stored;
    if (rank0 && load_watch.ElapsedSeconds() >= next_report_s) {
      LogInfo("loading weights: {:.0f} % ({:.2f} of {:.2f} GB, {:.0f} s)",
              100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_bytes),
              static_cast<double>(done_bytes) * 1e-9, static_cast<double>(total_bytes) * 1e-9,
              load_watch.ElapsedSeconds());
      next_report_s = load_watch.ElapsedSeconds() + 1.0;
    }
    done_bytes += src.bytes.size();
    DecoderLayerWeights* layer = nullptr;
    if (spec.layer >= 0) layer = spec.mtp ? &w.mtp.layers[spec.layer] : &w.layers[spec.layer];
    const int64_t cols = spec.shape.back();
    // Rows `rows` (all columns, or `col_range`) as a new matrix.
    auto matrix = [&](const std::vector<int64_t>& rows, Range col_range) {
      OwnedTensor m =
          NewMatrix(format, spec.role, static_cast<int64_t>(rows.size()), col_range.count);
      CopyBlock(src, cols, rows, col_range, m.view(), 0);
      return m;
    };
    auto whole = [&]() { return matrix(Rows({{0, spec.shape[0]}}), Range{0, cols}); };
    // Source rows `rows` (all columns) into dst from dst_row.
    auto into_rows = [&](const OwnedTensor& dst, const std::vector<int64_t>& rows,
                         int64_t dst_row) {
      CopyBlock(src, cols, rows, Range{0, cols}, dst.view(), dst_row);
    };
    auto bias = [&](const std::vector<int64_t>& at, std::vector<float>& dst, int64_t offset) {
      const std::vector<float> b = Gather(ToF32(src), at);
      std::copy(b.begin(), b.end(), dst.begin() + offset);
    };
    switch (spec.role) {
      case TensorRole::kEmbedding: w.embedding = matrix(Rows({shard.vocab}), {0, H}); break;
      case TensorRole::kFinalNorm: w.final_norm = NormWeight(spec, src); break;
      case TensorRole::kLmHead: w.lm_head = matrix(Rows({shard.vocab}), {0, H}); break;
      case TensorRole::kInputNorm: layer->input_norm = NormWeight(spec, src); break;
      case TensorRole::kPostAttentionNorm:
        layer->post_attention_norm = NormWeight(spec, src);
        break;

      case TensorRole::kQProj: into_rows(layer->attention.qkv, q_src, 0); break;
      case TensorRole::kKProj: into_rows(layer->attention.qkv, kv_src, q_rows); break;
      case TensorRole::kVProj: into_rows(layer->attention.qkv, kv_src, q_rows + kv_rows); break;
      case TensorRole::kOProj: layer->attention.o_proj = matrix(Rows({{0, H}}), o_cols); break;
      case TensorRole::kQBias: bias(q_src, layer->attention.qkv_bias, 0); break;
      case TensorRole::kKBias: bias(kv_src, layer->attention.qkv_bias, q_rows); break;
      case TensorRole::kVBias: bias(kv_src, layer->attention.qkv_bias, q_rows + kv_rows); break;
      case TensorRole::kOBias:  // added once: by rank 0, before the all-reduce
        if (rank0) layer->attention.o_bias = ToF32(src);
        break;
      case TensorRole::kQNorm: layer->attention.q_norm = NormWeight(spec, src); break;
      case TensorRole::kKNorm: layer->attention.k_norm = NormWeight(spec, src); break;

      case TensorRole::kGdnInProjQkvz: into_rows(layer->gdn.in_proj_qkvz, qkvz_src, 0); break;
      case TensorRole::kGdnInProjBa: into_rows(layer->gdn.in_proj_ba, ba_src, 0); break;
      case TensorRole::kGdnInProjQkv: into_rows(layer->gdn.in_proj_qkvz, qkv_local, 0); break;
      case TensorRole::kGdnInProjZ:
        into_rows(layer->gdn.in_proj_qkvz, Rows({gdn_v}), static_cast<int64_t>(qkv_local.size()));
        break;
      case TensorRole::kGdnInProjB:
        into_rows(layer->gdn.in_proj_ba, Rows({shard.gdn_value_heads}), 0);
        break;
      case TensorRole::kGdnInProjA:
        into_rows(layer->gdn.in_proj_ba, Rows({shard.gdn_value_heads}), nv_local);
        break;
      case TensorRole::kGdnConv: {
        // [conv_dim, 1, Kc] -> [Kc][local conv_dim], so the per-token conv runs across channels.
        const std::vector<float> conv = ToF32(src);
        const int64_t C = static_cast<int64_t>(qkv_local.size()), K = spec.shape[2];
        layer->gdn.conv.resize(C * K);
        for (int64_t ch = 0; ch < C; ++ch) {
          for (int64_t j = 0; j < K; ++j) layer->gdn.conv[j * C + ch] = conv[qkv_local[ch] * K + j];
        }
        break;
      }
      case TensorRole::kGdnDtBias:
        layer->gdn.dt_bias = Gather(ToF32(src), Rows({shard.gdn_value_heads}));
        break;
      case TensorRole::kGdnALog: {
        layer->gdn.neg_exp_a = Gather(ToF32(src), Rows({shard.gdn_value_heads}));
        for (float& a : layer->gdn.neg_exp_a) a = -std::exp(a);
        break;
      }
      case TensorRole::kGdnNorm: layer->gdn.norm = NormWeight(spec, src); break;
      case TensorRole::kGdnOutProj: layer->gdn.out_proj = matrix(Rows({{0, H}}), gdn_v); break;

      case TensorRole::kRouter: layer->experts.router = whole(); break;
      case TensorRole::kExpertGate:
        if (shard.holds_expert(spec.expert)) {
          into_rows(layer->experts.experts[spec.expert].gate_up, Rows({shard.moe}), 0);
        }
        break;
      case TensorRole::kExpertUp:
        if (shard.holds_expert(spec.expert)) {
          into_rows(layer->experts.experts[spec.expert].gate_up, Rows({shard.moe}),
                    shard.moe.count);
        }
        break;
      case TensorRole::kExpertDown:
        if (shard.holds_expert(spec.expert)) {
          CopyBlock(src, cols, Rows({{0, H}}), shard.moe,
                    layer->experts.experts[spec.expert].down.view(), 0);
        }
        break;
      case TensorRole::kExpertsGateUp:  // [E, 2I, H]: rows [0, I) gate, [I, 2I) up
        for (int64_t e = shard.experts.begin; e < shard.experts.end(); ++e) {
          into_rows(layer->experts.experts[e].gate_up, gate_up_rows(shard.moe, I, e * 2 * I), 0);
        }
        break;
      case TensorRole::kExpertsDown:  // [E, H, I]
        for (int64_t e = shard.experts.begin; e < shard.experts.end(); ++e) {
          CopyBlock(src, cols, Rows({{0, H}}, e * H), shard.moe,
                    layer->experts.experts[e].down.view(), 0);
        }
        break;
      case TensorRole::kSharedExpertGate:
        into_rows(layer->experts.shared.gate_up, Rows({shard.shared}), 0);
        break;
      case TensorRole::kSharedExpertUp:
        into_rows(layer->experts.shared.gate_up, Rows({shard.shared}), shard.shared.count);
        break;
      case TensorRole::kSharedExpertDown:
        layer->experts.shared.down = matrix(Rows({{0, H}}), shard.shared);
        break;
      case TensorRole::kSharedExpertGateScalar: layer->experts.shared_gate = ToF32(src); break;

      case TensorRole::kMlpGate: into_rows(layer->mlp.gate_up, Rows({shard.mlp}), 0); break;
      case TensorRole::kMlpUp:
        into_rows(layer->mlp.gate_up, Rows({shard.mlp}), shard.mlp.count);
        break;
      case TensorRole::kMlpDown: layer->mlp.down = matrix(Rows({{0, H}}), shard.mlp); break;

      case TensorRole::kMtpFc: w.mtp.fc = whole(); break;
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
