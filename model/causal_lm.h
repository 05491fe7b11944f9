// CausalLm: a loaded decoder-only model — Qwen3-Next, Qwen3.5-MoE, Qwen3-MoE, Qwen3, Llama —
// and its forward pass over a flat batch of many sequences' new tokens, plus the MTP draft head.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "model/cache.h"
#include "model/layer_context.h"
#include "model/shard.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace moeserve::model {

struct LoadOptions {
  std::optional<DType> weight_dtype;  // bf16 | f32; default: as the checkpoint (see weights.h)
  size_t threads = 0;                 // the load's and the forward's; 0: all cores (per rank)
  ShardSpec shard = {};               // this rank of a --tp / --ep group
  // The group's communicator for this rank (must outlive the model); null for a single rank.
  parallel::Communicator* comm = nullptr;
  ForwardOptions forward = {};  // the --no-... switches
  std::optional<DType> lm_head_dtype = {};  // default: as MatrixDType decides for weight_dtype
  // Activations of matmuls against a GGUF file's GGML blocks (--ggml-activations).
  kernels::GgmlActivations ggml_activations = kernels::GgmlActivations::kInt8;
};

// Where a hybrid model's token stream may be cut (docs/design.md principle 2). Its GDN layers run a
// prefill in chunks that start at absolute multiples of GdnChunkAlignment() positions, so a
// prefill the engine splits into several forward calls must split it at such multiples (else how
// the scheduler cut a prompt would change the request's arithmetic), and a GDN state checkpoint
// -- where a later prefill resumes -- may only sit at one.
int64_t GdnChunkAlignment();
// The multiple of positions at which a prefill chunk of this model that stops short of the
// request's tokens must end: GdnChunkAlignment() for a hybrid model, 1 for one without GDN
// layers.
int64_t PrefillAlignment(const io::ModelConfig& config);

// What the rows of a forward's logits are wanted for.
enum class LogitsMode {
  kFull,    // logits() [rows, vocab]
  kArgmax,  // argmax() [rows] only: vocab-parallel ranks exchange (max, index) pairs
};

class CausalLm {
 public:
  static Result<std::unique_ptr<CausalLm>> Load(const std::string& dir, const LoadOptions& options);
  // comm: as LoadOptions::comm.
  CausalLm(io::ModelConfig config, ShardLayout shard, ModelWeights weights, size_t threads,
           parallel::Communicator* comm, ForwardOptions forward = {});

  // The model's (global) config; shard().local holds this rank's sizes, which its ModelCache
  // is made with.
  const io::ModelConfig& config() const { return config_; }
  const ShardLayout& shard() const { return shard_; }
  parallel::Communicator& comm() { return *comm_; }
  const ModelWeights& weights() const { return weights_; }
  ThreadPool& pool() { return pool_; }
  bool has_mtp() const { return !weights_.mtp.layers.empty(); }
  void set_activation_tap(ActivationTap tap) { tap_ = std::move(tap); }
  // The --no-... switches of the forward from the next call on (results are equal either way).
  const ForwardOptions& forward_options() const { return forward_; }
  void set_forward_options(const ForwardOptions& forward) { forward_ = forward; }
  // How matmuls against GGML block-format weights take their activations, from the next call on.
  kernels::GgmlActivations ggml_activations() const { return ggml_activations_; }
  void set_ggml_activations(kernels::GgmlActivations a) { ggml_activations_ = a; }
  // Bytes this rank's collective waits have warmed so far (case study #12).
  uint64_t warmed_bytes() const { return warmer_.warmed_bytes(); }

  // Plans every buffer of a forward call for batches of up to max_tokens tokens and
  // max_logits_rows logits rows, so that such calls allocate nothing.
  void Reserve(int64_t max_tokens, int64_t max_logits_rows);
  // The bytes Reserve(max_tokens, max_logits_rows) allocates on a fresh model of `config` (the
  // global config) as rank shard.spec.rank, its layers' Scratch included: the memory plan's
  // figure (engine/memory_plan.h).
  static int64_t ReserveBytes(const io::ModelConfig& config, const ShardLayout& shard,
                              int64_t max_tokens, int64_t max_logits_rows);
  // The bytes of the buffers Reserve plans, as they are now.
  int64_t reserved_bytes() const;

  // Runs the batch's tokens through the decoder, reading and extending `cache`. Afterwards
  // hidden() holds the final-normed hidden states [T, H] (what lm_head and the MTP head read) and
  // logits() the logits [num_logits, vocab] of rows logits_rows[0 .. num_logits) only (the rows
  // that are sampled), or with LogitsMode::kArgmax only argmax() [num_logits] (the first index
  // of each row's maximum, as a scan of the whole row would give). A token's results are
  // bit-identical whatever else is in the batch. Every rank of a group calls it with the same
  // batch; all of them get the same results.
  void ForwardBatch(const TokenBatch& batch, ModelCache& cache, const int32_t* logits_rows,
                    int64_t num_logits, LogitsMode mode = LogitsMode::kFull);
  const float* hidden() const { return hidden_.data(); }
  const float* logits() const { return logits_.data(); }
  const int32_t* argmax() const { return argmax_.data(); }

  // One sequence's new tokens through ForwardBatch, reading and extending `cache`.
  // hidden (if non-null) receives the final-normed hidden states [T, H] (what lm_head and the
  // MTP head read); logits receives [rows, vocab] for the last token only, or for every token
  // when all_logits.
  void Forward(const SequenceInput& seq, ModelCache& cache, bool all_logits,
               std::vector<float>* hidden, std::vector<float>* logits);

  // The MTP head (docs/spec/model.md §3.h) for T rows: row t pairs hidden[t] (a final-normed hidden
  // state at position first_pos + t, from Forward or from the previous MTP step) with
  // next_tokens[t], runs at position first_pos + t with the MTP layer's own KV cache (through
  // block_table), and yields draft logits [T, vocab] for the token after next_tokens[t]; mtp_hidden
  // (if non-null) receives the head's normed outputs [T, H], the hidden input of the next chained
  // step.
  void MtpForward(const float* hidden, const int32_t* next_tokens, int64_t T, int64_t first_pos,
                  const int32_t* block_table, ModelCache& cache, std::vector<float>* mtp_hidden,
                  std::vector<float>* logits);

  // The MTP head over a flat batch of many sequences (what speculative decoding drafts with):
  // row t pairs hidden[t] [H] with batch.tokens[t] at batch.positions[t], through each
  // sequence's block table. Afterwards mtp_hidden() holds the head's normed outputs [T, H] and
  // mtp_logits() the draft logits of rows logits_rows[0 .. num_logits); hidden() and logits()
  // keep what the last ForwardBatch left there.
  void MtpForwardBatch(const TokenBatch& batch, const float* hidden, ModelCache& cache,
                       const int32_t* logits_rows, int64_t num_logits,
                       LogitsMode mode = LogitsMode::kFull);
  const float* mtp_hidden() const { return mtp_out_.data(); }
  const float* mtp_logits() const { return mtp_logits_.data(); }
  const int32_t* mtp_argmax() const { return mtp_argmax_.data(); }

 private:
  LayerContext Context(int64_t layer);
  // out [T, H]: the embeddings of tokens (vocab-parallel: each rank its rows, then summed).
  void EmbedRows(const int32_t* tokens, int64_t T, float* out);
  // Rows rows[i] of x [*, H] times lm_head: out [num_rows, V] (kFull) or argmax [num_rows].
  void Logits(const float* x, const int32_t* rows, int64_t num_rows, LogitsMode mode,
              std::vector<float>& out, std::vector<int32_t>& argmax);

  io::ModelConfig config_;
  ShardLayout shard_;
  ModelWeights weights_;
  ThreadPool pool_;
  parallel::SingleRankCommunicator single_rank_;
  parallel::Communicator* comm_;
  ForwardOptions forward_;
  kernels::GgmlActivations ggml_activations_ = kernels::GgmlActivations::kInt8;
  Scratch scratch_;
  WeightWarmer warmer_;  // case study #12 (ForwardOptions::warm_next_weights)
  ActivationTap tap_;
  std::vector<float> x_, hidden_, mtp_in_, mtp_out_, logits_in_, logits_, mtp_logits_;
  std::vector<float> local_logits_, gathered_;  // vocab-parallel: [rows, Vp], [ranks, rows, Vp]
  std::vector<int32_t> argmax_, mtp_argmax_;
};

}  // namespace moeserve::model
