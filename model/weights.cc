#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "io/safetensors_pages.h"
#include "kernels/ggml_blocks.h"
#include "kernels/quantize.h"
#include "model/arch/qwen3_next.h"
#include "model/checkpoint_layout.h"

namespace moeserve::model {
namespace {

using io::SafetensorsTensor;

bool IsFloatDType(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

// How the matrices of a load are stored: `base` (bf16 or f32), or for --weight-dtype int8 /
// int4 that packed format where MatrixDType allows it; or each as its checkpoint stores it
// (`stored`: a GGUF file's default), in place where `owner` (the mapping's owner) is set.
struct MatrixFormat {
  DType requested = DType::kBF16;
  DType base = DType::kBF16;
  std::optional<DType> lm_head;
  bool stored = false;
  std::shared_ptr<const void> owner;
  DType For(TensorRole role, int64_t cols) const {
    return MatrixDType(requested, base, role, cols, lm_head);
  }
};

// The dtype a stored-format load keeps a matrix stored as `dtype` in: itself when the kernels
// read it (GGML blocks, bf16, f32), f32 for f16.
DType StoredMatrixDType(DType dtype) { return dtype == DType::kF16 ? DType::kF32 : dtype; }

// A matrix that several checkpoint tensors are copied into, allocated whole; empty for a
// stored-format load, whose tensors become its blocks as they are placed.
WeightMatrix NewMatrix(const MatrixFormat& format, TensorRole role, int64_t rows, int64_t cols) {
  if (format.stored) return WeightMatrix();
  return WeightMatrix(OwnedTensor(format.For(role, cols), {rows, cols}));
}

// Row indices of a source tensor: the concatenation of ranges, each shifted by `offset`.
std::vector<int64_t> Rows(std::initializer_list<Range> ranges, int64_t offset = 0) {
  std::vector<int64_t> rows;
  for (const Range& r : ranges) {
    for (int64_t i = r.begin; i < r.end(); ++i) rows.push_back(offset + i);
  }
  return rows;
}

// One matrix copy of the load, planned as its tensor is walked and run later in blocks of rows
// over the pool: columns `cols` of the source rows `rows` of `src` (viewed as [R, src_cols])
// into consecutive rows of the matrix `dst` from dst_row, converted to dst's dtype.
struct RowCopy {
  const SafetensorsTensor* src;
  int64_t src_cols;
  std::vector<int64_t> rows;
  Range cols;
  Tensor dst;
  int64_t dst_row;
};

RowCopy PlanCopy(const SafetensorsTensor& src, int64_t src_cols, std::vector<int64_t> rows,
                 Range cols, const Tensor& dst, int64_t dst_row) {
  CHECK_EQ(dst.dim(1), cols.count);
  CHECK_LE(cols.end(), src_cols);
  CHECK_LE(dst_row + static_cast<int64_t>(rows.size()), dst.dim(0));
  const size_t row_bytes = StoredRowBytes(src.dtype, src_cols);
  CHECK_EQ(cols.begin % GgmlBlockWeights(src.dtype), 0);  // CheckBlockSplits refused it before
  for (int64_t r : rows) CHECK_LE(static_cast<size_t>(r + 1) * row_bytes, src.bytes.size());
  return RowCopy{&src, src_cols, std::move(rows), cols, dst, dst_row};
}

// Rows [begin, end) of copy c, each converted through the f32 row `row` (cols.count floats) when
// the dtypes differ; packed rows are quantized by kernels::QuantizeRows, a run of consecutive
// source rows per call.
void CopyRows(const RowCopy& c, size_t begin, size_t end, float* row) {
  const DType from_dtype = c.src->dtype, to_dtype = c.dst.dtype();
  const int64_t n = c.cols.count;
  const size_t row_bytes = StoredRowBytes(from_dtype, c.src_cols);
  const size_t col_offset = StoredRowBytes(from_dtype, c.cols.begin);
  auto source = [&](size_t i) {
    return c.src->bytes.data() + static_cast<size_t>(c.rows[i]) * row_bytes + col_offset;
  };
  if (IsPackedDType(to_dtype)) {
    for (size_t i = begin; i < end;) {
      size_t run_end = i + 1;  // rows [i, run_end) are consecutive in the source
      while (run_end < end && c.rows[run_end] == c.rows[run_end - 1] + 1) ++run_end;
      kernels::QuantizeRows(from_dtype, source(i), row_bytes,
                            static_cast<int64_t>(run_end - i), c.dst,
                            c.dst_row + static_cast<int64_t>(i));
      i = run_end;
    }
    return;
  }
  const size_t dst_row_bytes = StoredRowBytes(to_dtype, n);
  for (size_t i = begin; i < end; ++i) {
    const std::byte* from = source(i);
    const int64_t dst_row = c.dst_row + static_cast<int64_t>(i);
    std::byte* to = static_cast<std::byte*>(c.dst.data()) + dst_row * dst_row_bytes;
    if (from_dtype == to_dtype) {  // as stored: whole blocks of a GGML format
      std::memcpy(to, from, dst_row_bytes);
    } else if (IsGgmlBlockDType(from_dtype)) {
      kernels::DequantizeGgmlRow(from_dtype, from, row, n);
      ConvertFromF32(row, to_dtype, to, n);
    } else {
      ConvertToF32(from_dtype, from, row, n);
      ConvertFromF32(row, to_dtype, to, n);
    }
  }
}

// Runs planned copies over the pool's threads (inline without a pool) in blocks of rows of about
// kBlockBytes of source each, which the threads take in turn; each thread converts through its
// own f32 row.
class CopyRunner {
 public:
  explicit CopyRunner(ThreadPool* pool)
      : pool_(pool), rows_(pool != nullptr ? pool->num_threads() : 1) {}

  void Run(const std::vector<RowCopy>& copies) {
    blocks_.clear();
    for (size_t c = 0; c < copies.size(); ++c) {
      const RowCopy& copy = copies[c];
      const size_t cols = static_cast<size_t>(copy.cols.count);
      const size_t per_block =
          std::max<size_t>(1, kBlockBytes / StoredRowBytes(copy.src->dtype, copy.cols.count));
      for (size_t r = 0; r < copy.rows.size(); r += per_block) {
        blocks_.push_back({c, r, std::min(r + per_block, copy.rows.size())});
      }
      for (std::vector<float>& row : rows_) {
        if (row.size() < cols) row.resize(cols);
      }
    }
    auto run = [&](size_t b, size_t thread) {
      const Block& block = blocks_[b];
      CopyRows(copies[block.copy], block.begin, block.end, rows_[thread].data());
    };
    if (pool_ != nullptr) {
      pool_->ParallelFor(blocks_.size(), run);
    } else {
      for (size_t b = 0; b < blocks_.size(); ++b) run(b, 0);
    }
  }

 private:
  // Small enough that a batch splits evenly over the threads, large enough that taking a block
  // costs nothing beside it.
  static constexpr size_t kBlockBytes = size_t{256} << 10;
  struct Block {
    size_t copy, begin, end;  // rows [begin, end) of copies[copy]
  };
  ThreadPool* const pool_;
  std::vector<std::vector<float>> rows_;  // per thread
  std::vector<Block> blocks_;
};

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
    }
    if (c.shared_expert_intermediate_size > 0) {
      layer->experts.shared.gate_up =
          NewMatrix(f, TensorRole::kSharedExpertGate, 2 * c.shared_expert_intermediate_size, H);
    }
  } else {
    layer->mlp.gate_up = NewMatrix(f, TensorRole::kMlpGate, 2 * c.intermediate_size, H);
  }
}

// The float dtype of a load's matrices when --weight-dtype is not given: bf16 when the
// checkpoint's matrices are bf16, else f32 (f32, f16, and GGML's block formats, whose values
// bf16 would round: a router in bf16 can pick other experts).
DType ChooseMatrixDType(const std::vector<ResolvedTensor>& tensors) {
  for (const ResolvedTensor& t : tensors) {
    if (t.spec.kind == TensorKind::kLinear && t.stored->dtype == DType::kBF16) return DType::kBF16;
  }
  return DType::kF32;
}

// The loader's phases, in order (LoadWeights).

// Every tensor is bf16, f16 or f32; matrices may also be in GGML's block formats (GGUF files).
Status CheckStoredDTypes(const std::vector<ResolvedTensor>& tensors) {
  for (const ResolvedTensor& t : tensors) {
    const DType d = t.stored->dtype;
    const bool matrix =
        t.spec.kind == TensorKind::kLinear || t.spec.kind == TensorKind::kEmbedding;
    if (IsFloatDType(d) || (matrix && IsGgmlBlockDType(d))) continue;
    return Unimplemented("tensor '{}' in {} has dtype {}; moeserve loads bf16, f16 and f32{}",
                         t.spec.name, t.stored->file, DTypeName(d),
                         matrix ? " and GGML's block formats" : "");
  }
  return OkStatus();
}

// What a load can hold its matrices as (`what`: "weight" or "lm_head", for the message).
Status CheckMatrixDType(DType d, std::string_view what) {
  if (d == DType::kBF16 || d == DType::kF32 || IsPackedDType(d)) return OkStatus();
  return InvalidArgument("{} dtype {} is not supported (bf16, f32, int8, int4, w8a8 or w4a8)",
                         what, DTypeName(d));
}

// The requested matrix dtype (nullopt: as the checkpoint's matrices) and the base dtype; a
// checkpoint in another reader's mapping (`owner`: a GGUF file) is used as stored by default.
Result<MatrixFormat> ChooseMatrixFormat(const std::vector<ResolvedTensor>& tensors,
                                        std::optional<DType> matrix_dtype,
                                        std::shared_ptr<const void> owner) {
  const DType requested = matrix_dtype.value_or(ChooseMatrixDType(tensors));
  RETURN_IF_ERROR(CheckMatrixDType(requested, "weight"));
  // Packed formats keep what they cannot hold (routers, embeddings, int4's odd widths) in the
  // checkpoint's own precision.
  MatrixFormat format;
  format.requested = requested;
  format.base = IsPackedDType(requested) ? ChooseMatrixDType(tensors) : requested;
  if (!matrix_dtype && owner != nullptr) {
    format.stored = true;
    format.owner = std::move(owner);
  }
  return format;
}

// The owner of the one mapping a checkpoint's tensors lie in when another reader mapped it (a
// GGUF file: model/gguf_checkpoint.h); null for safetensors files, which map themselves.
std::shared_ptr<const void> MappingOwner(const io::SafetensorsCheckpoint& checkpoint) {
  const std::vector<const io::SafetensorsFile*> files = checkpoint.files();
  return files.size() == 1 ? files[0]->owner() : nullptr;
}

void AllocateLayers(const io::ModelConfig& c, const ShardLayout& shard, const MatrixFormat& format,
                    ModelWeights& w) {
  w.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    AllocateLayer(shard, format, c.layer_types[i], c.IsMoeLayer(i), &w.layers[i]);
  }
  w.mtp.layers.resize(c.num_mtp_layers);
  for (DecoderLayerWeights& layer : w.mtp.layers) {
    AllocateLayer(shard, format, io::LayerType::kFullAttention, c.num_experts > 0, &layer);
  }
}

// This rank's slices of the checkpoint's attention and GDN tensors (shard.h): the source rows it
// keeps and where they go in its concatenated matrices.
struct RankSlices {
  int64_t q_rows = 0, kv_rows = 0;  // local rows of the qkv matrix: its q part, its k (or v) part
  std::vector<int64_t> q_src, k_src, v_src;  // their source rows
  Range o_cols;                        // o_proj's columns
  // The [q | k | v] rows of GDN's split layout [q | k | v | z] this rank keeps (its conv
  // channels), and the source row of each [q | k | v | z] / [b | a] row it keeps.
  std::vector<int64_t> qkv_local;
  std::vector<int64_t> qkvz_src, ba_src;
  Range gdn_v;           // value channels: z rows, out_proj's columns
  int64_t nv_local = 0;  // value heads
};

RankSlices SliceTensors(const io::ModelConfig& c, const ShardLayout& shard) {
  const io::ModelConfig& local = shard.local;
  RankSlices s;
  const int64_t hd = c.head_dim;
  const int64_t q_stride = c.attn_output_gate ? 2 * hd : hd;
  s.q_rows = local.num_attention_heads * q_stride;
  s.kv_rows = local.num_key_value_heads * hd;
  s.q_src = Rows({{shard.q_heads.begin * q_stride, s.q_rows}});
  s.v_src = Rows({{shard.kv_heads.begin * hd, s.kv_rows}});
  s.k_src = s.v_src;
  if (c.gguf.rope_rows_interleaved) {  // Hugging Face's row r of a head is stored at row
    const int64_t half = hd / 2;       // 2 (r % half) + r / half of it
    for (std::vector<int64_t>* rows : {&s.q_src, &s.k_src}) {
      for (int64_t& r : *rows) r = r / hd * hd + 2 * (r % hd % half) + r % hd / half;
    }
  }
  s.o_cols = {shard.q_heads.begin * hd, shard.q_heads.count * hd};

  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t key_dim = c.linear_key_dim(), value_dim = c.linear_value_dim();
  const int64_t nv = c.linear_num_value_heads;
  s.nv_local = local.linear_num_value_heads;
  const Range gdn_k{shard.gdn_key_heads.begin * dk, shard.gdn_key_heads.count * dk};
  s.gdn_v = {shard.gdn_value_heads.begin * dv, shard.gdn_value_heads.count * dv};
  s.qkv_local = Rows({gdn_k, {key_dim + gdn_k.begin, gdn_k.count},
                      {2 * key_dim + s.gdn_v.begin, s.gdn_v.count}});
  std::vector<int64_t> qkvz_local = s.qkv_local;
  for (int64_t i : Rows({s.gdn_v}, 2 * key_dim + value_dim)) qkvz_local.push_back(i);
  const std::vector<int64_t> ba_local =
      Rows({shard.gdn_value_heads, {nv + shard.gdn_value_heads.begin, s.nv_local}});
  // Qwen3-Next's interleaved rows: the source row of each split-layout row.
  s.qkvz_src = qkvz_local;
  s.ba_src = ba_local;
  if (c.architecture == io::Architecture::kQwen3Next) {
    const std::vector<int64_t> qkvz_rows = qwen3_next::QkvzSourceRows(c);
    const std::vector<int64_t> ba_rows = qwen3_next::BaSourceRows(c);
    for (int64_t& r : s.qkvz_src) r = qkvz_rows[r];
    for (int64_t& r : s.ba_src) r = ba_rows[r];
  }
  return s;
}

// A rank keeps whole blocks of a block-format matrix: a split of its columns (--tp) that would cut
// a block is refused, naming the tensor. Rows are never split inside: a row is whole blocks.
Status CheckBlockSplits(const std::vector<ResolvedTensor>& tensors, const ShardLayout& shard,
                        const RankSlices& s) {
  for (const ResolvedTensor& t : tensors) {
    const int64_t block = GgmlBlockWeights(t.stored->dtype);
    if (block == 1) continue;
    Range cols;
    switch (t.spec.role) {
      case TensorRole::kOProj: cols = s.o_cols; break;
      case TensorRole::kGdnOutProj: cols = s.gdn_v; break;
      case TensorRole::kExpertDown:
      case TensorRole::kExpertsDown: cols = shard.moe; break;
      case TensorRole::kSharedExpertDown: cols = shard.shared; break;
      case TensorRole::kMlpDown: cols = shard.mlp; break;
      default: continue;  // whole rows only
    }
    if (cols.begin % block != 0 || cols.count % block != 0) {
      return InvalidArgument(
          "tensor '{}' is {} (blocks of {} weights along a row); rank {} of {} would hold its "
          "columns [{}, {}), which splits a block: choose fewer ranks",
          t.spec.name, DTypeName(t.stored->dtype), block, shard.spec.rank, shard.spec.size,
          cols.begin, cols.end());
    }
  }
  return OkStatus();
}

// A load that takes more than a second reports, about once a second and when it ends (rank 0
// only), the checkpoint's bytes read so far and how fast.
class LoadProgress {
 public:
  LoadProgress(uint64_t total_bytes, bool report, size_t threads)
      : report_(report), threads_(threads), total_bytes_(total_bytes) {
    watch_.Reset();
  }

  // After a batch of `bytes` of the checkpoint was read.
  void Add(uint64_t bytes) {
    done_bytes_ += bytes;
    const double s = watch_.ElapsedSeconds();
    if (!report_ || s < next_report_s_ || done_bytes_ == total_bytes_) return;
    LogInfo("loading weights: {:.0f} % ({:.2f} of {:.2f} GB, {:.0f} s, {:.2f} GB/s)",
            100.0 * static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_),
            static_cast<double>(done_bytes_) * 1e-9, static_cast<double>(total_bytes_) * 1e-9, s,
            static_cast<double>(done_bytes_) * 1e-9 / s);
    next_report_s_ = s + kReportEverySeconds;
  }

  void Finish() const {
    const double s = watch_.ElapsedSeconds();
    if (!report_ || s < kReportEverySeconds) return;
    LogInfo("loaded weights: {:.2f} GB of checkpoint in {:.1f} s ({:.2f} GB/s, {} threads)",
            static_cast<double>(total_bytes_) * 1e-9, s,
            static_cast<double>(total_bytes_) * 1e-9 / s, threads_);
  }

 private:
  static constexpr double kReportEverySeconds = 1.0;
  const bool report_;
  const size_t threads_;
  const uint64_t total_bytes_;
  uint64_t done_bytes_ = 0;
  Stopwatch watch_;
  double next_report_s_ = kReportEverySeconds;
};

// One checkpoint tensor and the copies the weights take of it (in the load's matrix format):
// vectors are made at once, matrices allocated at once and their copies added to `plan`.
class TensorSource {
 public:
  TensorSource(const ResolvedTensor& rt, const MatrixFormat& format, std::vector<RowCopy>& plan)
      : spec_(rt.spec),
        src_(*rt.stored),
        format_(format),
        cols_(rt.spec.shape.back()),
        plan_(plan) {}

  const CheckpointTensor& spec() const { return spec_; }

  // Rows `rows` (all columns, or `col_range`) as a matrix of their own: in a stored-format load
  // the file's own bytes when they are whole consecutive rows, else a copy as stored.
  OwnedTensor Matrix(std::vector<int64_t> rows, Range col_range) const {
    const int64_t n = static_cast<int64_t>(rows.size());
    if (InPlace(rows, col_range)) {
      const int64_t shape[] = {n, cols_};
      const size_t row_bytes = StoredRowBytes(src_.dtype, cols_);
      CHECK_LE((static_cast<size_t>(rows[0]) + n) * row_bytes, src_.bytes.size());
      // The mapping is read-only: the kernels only read weights.
      void* first = const_cast<std::byte*>(src_.bytes.data() + rows[0] * row_bytes);
      return OwnedTensor::Borrowed(Tensor(first, src_.dtype, shape), format_.owner);
    }
    const DType dtype = Converted() ? format_.For(spec_.role, col_range.count)
                                    : StoredMatrixDType(src_.dtype);
    OwnedTensor m(dtype, {n, col_range.count});
    plan_.push_back(PlanCopy(src_, cols_, std::move(rows), col_range, m.view(), 0));
    return m;
  }
  OwnedTensor Whole() const { return Matrix(Rows({{0, spec_.shape[0]}}), Range{0, cols_}); }
  // Source rows `rows` (all columns) into dst from dst_row: copied into its one allocation, or in
  // a stored-format load, a block of its own.
  void IntoRows(WeightMatrix& dst, std::vector<int64_t> rows, int64_t dst_row) const {
    if (!Converted()) {
      dst.AddBlock(dst_row, Matrix(std::move(rows), Range{0, cols_}));
      return;
    }
    plan_.push_back(
        PlanCopy(src_, cols_, std::move(rows), Range{0, cols_}, dst.whole(), dst_row));
  }
  // The entries `at` into dst from offset.
  void Bias(const std::vector<int64_t>& at, std::vector<float>& dst, int64_t offset) const {
    const std::vector<float> b = Gather(ToF32(src_), at);
    std::copy(b.begin(), b.end(), dst.begin() + offset);
  }
  std::vector<float> F32() const { return ToF32(src_); }
  std::vector<float> Norm() const { return NormWeight(spec_, src_); }

 private:
  // Whether this tensor's matrix is converted to the load's format: always, but in a
  // stored-format load, only lm_head under --lm-head-dtype.
  bool Converted() const {
    return !format_.stored || (spec_.role == TensorRole::kLmHead && format_.lm_head);
  }
  // A stored-format load with the mapping's owner uses whole consecutive rows in place.
  bool InPlace(const std::vector<int64_t>& rows, Range col_range) const {
    if (Converted() || format_.owner == nullptr || rows.empty()) return false;
    if (StoredMatrixDType(src_.dtype) != src_.dtype || col_range.begin != 0 ||
        col_range.count != cols_) {
      return false;
    }
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i] != rows[0] + static_cast<int64_t>(i)) return false;
    }
    return true;
  }

  const CheckpointTensor& spec_;
  const SafetensorsTensor& src_;
  const MatrixFormat& format_;
  const int64_t cols_;
  std::vector<RowCopy>& plan_;
};

// The conv weight [conv_dim, 1, Kc] -> [Kc][local conv_dim] over this rank's channels, so the
// per-token conv runs across channels.
std::vector<float> TransposedConv(const TensorSource& t, const std::vector<int64_t>& channels) {
  const std::vector<float> conv = t.F32();
  const int64_t C = static_cast<int64_t>(channels.size()), K = t.spec().shape[2];
  std::vector<float> out(C * K);
  for (int64_t ch = 0; ch < C; ++ch) {
    for (int64_t j = 0; j < K; ++j) out[j * C + ch] = conv[channels[ch] * K + j];
  }
  return out;
}

// Copies tensor t into its place in w: one case per role of the walk (checkpoint_layout.h), so
// the compiler checks every role has one.
void PlaceTensor(const TensorSource& t, const io::ModelConfig& c, const ShardLayout& shard,
                 const RankSlices& s, ModelWeights& w) {
  const CheckpointTensor& spec = t.spec();
  DecoderLayerWeights* layer = nullptr;
  if (spec.layer >= 0) layer = spec.mtp ? &w.mtp.layers[spec.layer] : &w.layers[spec.layer];
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const bool rank0 = shard.spec.rank == 0;
  // Rows of an expert's [gate | up] (2 I rows) this rank keeps: its slice of each half.
  auto gate_up_rows = [](Range slice, int64_t width, int64_t offset) {
    return Rows({slice, {width + slice.begin, slice.count}}, offset);
  };
  switch (spec.role) {
    case TensorRole::kEmbedding: w.embedding = t.Matrix(Rows({shard.vocab}), {0, H}); break;
    case TensorRole::kFinalNorm: w.final_norm = t.Norm(); break;
    case TensorRole::kLmHead: w.lm_head = t.Matrix(Rows({shard.vocab}), {0, H}); break;
    case TensorRole::kInputNorm: layer->input_norm = t.Norm(); break;
    case TensorRole::kPostAttentionNorm: layer->post_attention_norm = t.Norm(); break;

    case TensorRole::kQProj: t.IntoRows(layer->attention.qkv, s.q_src, 0); break;
    case TensorRole::kKProj: t.IntoRows(layer->attention.qkv, s.k_src, s.q_rows); break;
    case TensorRole::kVProj:
      t.IntoRows(layer->attention.qkv, s.v_src, s.q_rows + s.kv_rows);
      break;
    case TensorRole::kOProj: layer->attention.o_proj = t.Matrix(Rows({{0, H}}), s.o_cols); break;
    case TensorRole::kQBias: t.Bias(s.q_src, layer->attention.qkv_bias, 0); break;
    case TensorRole::kKBias: t.Bias(s.k_src, layer->attention.qkv_bias, s.q_rows); break;
    case TensorRole::kVBias:
      t.Bias(s.v_src, layer->attention.qkv_bias, s.q_rows + s.kv_rows);
      break;
    case TensorRole::kOBias:  // added once: by rank 0, before the all-reduce
      if (rank0) layer->attention.o_bias = t.F32();
      break;
    case TensorRole::kQNorm: layer->attention.q_norm = t.Norm(); break;
    case TensorRole::kKNorm: layer->attention.k_norm = t.Norm(); break;

    case TensorRole::kGdnInProjQkvz: t.IntoRows(layer->gdn.in_proj_qkvz, s.qkvz_src, 0); break;
    case TensorRole::kGdnInProjBa: t.IntoRows(layer->gdn.in_proj_ba, s.ba_src, 0); break;
    case TensorRole::kGdnInProjQkv: t.IntoRows(layer->gdn.in_proj_qkvz, s.qkv_local, 0); break;
    case TensorRole::kGdnInProjZ:
      t.IntoRows(layer->gdn.in_proj_qkvz, Rows({s.gdn_v}),
                 static_cast<int64_t>(s.qkv_local.size()));
      break;
    case TensorRole::kGdnInProjB:
      t.IntoRows(layer->gdn.in_proj_ba, Rows({shard.gdn_value_heads}), 0);
      break;
    case TensorRole::kGdnInProjA:
      t.IntoRows(layer->gdn.in_proj_ba, Rows({shard.gdn_value_heads}), s.nv_local);
      break;
    case TensorRole::kGdnConv: layer->gdn.conv = TransposedConv(t, s.qkv_local); break;
    case TensorRole::kGdnDtBias:
      layer->gdn.dt_bias = Gather(t.F32(), Rows({shard.gdn_value_heads}));
      break;
    case TensorRole::kGdnALog:
      layer->gdn.neg_exp_a = Gather(t.F32(), Rows({shard.gdn_value_heads}));
      if (!c.gguf.gdn_a_negated) {
        for (float& a : layer->gdn.neg_exp_a) a = -std::exp(a);
      }
      break;
    case TensorRole::kGdnNorm: layer->gdn.norm = t.Norm(); break;
    case TensorRole::kGdnOutProj: layer->gdn.out_proj = t.Matrix(Rows({{0, H}}), s.gdn_v); break;

    case TensorRole::kRouter: layer->experts.router = t.Whole(); break;
    case TensorRole::kExpertGate:
      if (shard.holds_expert(spec.expert)) {
        t.IntoRows(layer->experts.experts[spec.expert].gate_up, Rows({shard.moe}), 0);
      }
      break;
    case TensorRole::kExpertUp:
      if (shard.holds_expert(spec.expert)) {
        t.IntoRows(layer->experts.experts[spec.expert].gate_up, Rows({shard.moe}),
                   shard.moe.count);
      }
      break;
    case TensorRole::kExpertDown:
      if (shard.holds_expert(spec.expert)) {
        layer->experts.experts[spec.expert].down = t.Matrix(Rows({{0, H}}), shard.moe);
      }
      break;
    case TensorRole::kExpertsGateUp:  // [E, 2I, H]: rows [0, I) gate, [I, 2I) up
      for (int64_t e = shard.experts.begin; e < shard.experts.end(); ++e) {
        t.IntoRows(layer->experts.experts[e].gate_up, gate_up_rows(shard.moe, I, e * 2 * I), 0);
      }
      break;
    case TensorRole::kExpertsDown:  // [E, H, I]
      for (int64_t e = shard.experts.begin; e < shard.experts.end(); ++e) {
        layer->experts.experts[e].down = t.Matrix(Rows({{0, H}}, e * H), shard.moe);
      }
      break;
    case TensorRole::kSharedExpertGate:
      t.IntoRows(layer->experts.shared.gate_up, Rows({shard.shared}), 0);
      break;
    case TensorRole::kSharedExpertUp:
      t.IntoRows(layer->experts.shared.gate_up, Rows({shard.shared}), shard.shared.count);
      break;
    case TensorRole::kSharedExpertDown:
      layer->experts.shared.down = t.Matrix(Rows({{0, H}}), shard.shared);
      break;
    case TensorRole::kSharedExpertGateScalar: layer->experts.shared_gate = t.F32(); break;

    case TensorRole::kMlpGate: t.IntoRows(layer->mlp.gate_up, Rows({shard.mlp}), 0); break;
    case TensorRole::kMlpUp:
      t.IntoRows(layer->mlp.gate_up, Rows({shard.mlp}), shard.mlp.count);
      break;
    case TensorRole::kMlpDown: layer->mlp.down = t.Matrix(Rows({{0, H}}), shard.mlp); break;

    case TensorRole::kMtpFc: w.mtp.fc = t.Whole(); break;
    case TensorRole::kMtpPreFcNormEmbedding: w.mtp.pre_fc_norm_embedding = t.Norm(); break;
    case TensorRole::kMtpPreFcNormHidden: w.mtp.pre_fc_norm_hidden = t.Norm(); break;
    case TensorRole::kMtpNorm: w.mtp.norm = t.Norm(); break;
  }
}

// The walk over the checkpoint's tensors in order: place(rt, plan) makes t's vectors and plans
// its matrix copies; the copies run over the pool in batches of about kBatchBytes of checkpoint,
// after which the batch's pages are let go. The kernel is asked to read kReadAheadBytes ahead.
template <typename Place>
void StreamTensors(const std::vector<ResolvedTensor>& tensors,
                   const io::SafetensorsCheckpoint& checkpoint, ThreadPool* pool, bool report,
                   const Place& place) {
  constexpr uint64_t kBatchBytes = uint64_t{32} << 20;
  constexpr uint64_t kReadAheadBytes = uint64_t{256} << 20;
  std::vector<const SafetensorsTensor*> reads;
  uint64_t total_bytes = 0;
  for (const ResolvedTensor& rt : tensors) {
    reads.push_back(rt.stored);
    total_bytes += rt.stored->bytes.size();
  }
  io::SafetensorsPageAdvisor pages(checkpoint, reads);
  LoadProgress progress(total_bytes, report, pool != nullptr ? pool->num_threads() : 1);
  CopyRunner runner(pool);
  std::vector<RowCopy> plan;
  size_t batch_begin = 0, ahead = 0;  // the batch's first tensor; the first not asked for yet
  uint64_t batch_bytes = 0, ahead_bytes = 0;  // bytes from batch_begin to i, and to ahead
  for (size_t i = 0; i < tensors.size(); ++i) {
    while (ahead < tensors.size() && (ahead <= i || ahead_bytes < kReadAheadBytes)) {
      pages.WillNeed(*reads[ahead]);
      ahead_bytes += reads[ahead++]->bytes.size();
    }
    place(tensors[i], plan);
    batch_bytes += reads[i]->bytes.size();
    if (batch_bytes < kBatchBytes && i + 1 < tensors.size()) continue;
    runner.Run(plan);
    plan.clear();
    for (size_t j = batch_begin; j <= i; ++j) pages.Done(*reads[j]);
    progress.Add(batch_bytes);
    ahead_bytes -= batch_bytes;
    batch_begin = i + 1;
    batch_bytes = 0;
  }
  progress.Finish();
}

}  // namespace

DType MatrixDType(DType requested, DType base, TensorRole role, int64_t cols,
                  std::optional<DType> lm_head) {
  if (role == TensorRole::kLmHead && lm_head) {
    return !IsPackedDType(*lm_head) || kernels::CanPack(*lm_head, cols) ? *lm_head : base;
  }
  if (!IsPackedDType(requested)) return requested;
  switch (role) {
    case TensorRole::kEmbedding:  // rows looked up, not multiplied
    case TensorRole::kRouter:     // small, and its argmax picks the experts
      return base;
    case TensorRole::kLmHead:  // 8 bits under 4 too (llama.cpp keeps the output layer wider)
      return requested == DType::kQ4A8 && kernels::CanPack(DType::kQ8A8, cols) ? DType::kQ8A8
                                                                               : DType::kQ8;
    default:
      return kernels::CanPack(requested, cols) ? requested : base;
  }
}

std::string WeightFormatName(const ModelWeights& weights) {
  return weights.stored_formats ? "as stored" : std::string(DTypeName(weights.matrix_dtype));
}

double BytesPerWeight(DType dtype, int64_t cols) {
  switch (dtype) {
    case DType::kQ8:
    case DType::kQ8A8: return 1.0 + static_cast<double>(sizeof(float)) / static_cast<double>(cols);
    case DType::kQ4:
    case DType::kQ4A8: return 0.5 + static_cast<double>(sizeof(uint16_t)) / kQ4Group;
    default: return static_cast<double>(DTypeSize(dtype));
  }
}

namespace {

// LoadWeights, or with `copy` false its layout only: every matrix allocated (a copy's pages never
// touched) or a view, every vector read, no matrix copied.
Result<ModelWeights> Load(const io::ModelConfig& c, const ShardLayout& shard,
                          const io::SafetensorsCheckpoint& checkpoint,
                          std::optional<DType> matrix_dtype, ThreadPool* pool,
                          std::optional<DType> lm_head_dtype, bool copy) {
  ASSIGN_OR_RETURN(std::vector<ResolvedTensor> tensors, ResolveCheckpoint(c, checkpoint));
  RETURN_IF_ERROR(CheckStoredDTypes(tensors));
  ASSIGN_OR_RETURN(MatrixFormat format,
                   ChooseMatrixFormat(tensors, matrix_dtype, MappingOwner(checkpoint)));
  if (lm_head_dtype) {
    RETURN_IF_ERROR(CheckMatrixDType(*lm_head_dtype, "lm_head"));
    format.lm_head = lm_head_dtype;
  }
  ModelWeights w;
  w.matrix_dtype = format.requested;
  w.base_dtype = format.base;
  w.stored_formats = format.stored;
  const RankSlices slices = SliceTensors(c, shard);
  RETURN_IF_ERROR(CheckBlockSplits(tensors, shard, slices));
  AllocateLayers(c, shard, format, w);
  if (!copy) {
    std::vector<RowCopy> plan;
    for (const ResolvedTensor& rt : tensors) {
      PlaceTensor(TensorSource(rt, format, plan), c, shard, slices, w);
      plan.clear();
    }
    return w;
  }
  StreamTensors(tensors, checkpoint, pool, shard.spec.rank == 0,
                [&](const ResolvedTensor& rt, std::vector<RowCopy>& plan) {
                  PlaceTensor(TensorSource(rt, format, plan), c, shard, slices, w);
                });
  return w;
}

}  // namespace

Result<ModelWeights> LoadWeights(const io::ModelConfig& c, const ShardLayout& shard,
                                 const io::SafetensorsCheckpoint& checkpoint,
                                 std::optional<DType> matrix_dtype, ThreadPool* pool,
                                 std::optional<DType> lm_head_dtype) {
  return Load(c, shard, checkpoint, matrix_dtype, pool, lm_head_dtype, /*copy=*/true);
}

Result<ModelWeights> LayOutWeights(const io::ModelConfig& c, const ShardLayout& shard,
                                   const io::SafetensorsCheckpoint& checkpoint,
                                   std::optional<DType> matrix_dtype,
                                   std::optional<DType> lm_head_dtype) {
  return Load(c, shard, checkpoint, matrix_dtype, nullptr, lm_head_dtype, /*copy=*/false);
}

}  // namespace moeserve::model
