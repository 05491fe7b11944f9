// Engine: the in-process LLM engine -- requests in, tokens out, one step at a time. It wires the
// Scheduler (what runs), the KvCacheManager (which cache it holds), the ModelRunner (the
// forward and sampling) and, with speculative decoding, the DraftProposer --spec names (the
// next step's drafts) over a loaded CausalLm. Callers (generate, bench latency, the
// server's engine thread) add requests, call Step() until nothing is unfinished, and read each
// request's tokens as they arrive.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "engine/kv_cache_manager.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/spec_decode/draft_proposer.h"
#include "engine/spec_decode/spec_config.h"
#include "model/causal_lm.h"
#include "model/model_group.h"

namespace moeserve::engine {

inline constexpr double kDefaultStateCacheGiB = 2.0;
inline constexpr int64_t kDefaultStateCheckpointInterval = 512;

// vLLM's engine arguments that size and shape the engine (docs/cli.md). Zero means "derive".
struct EngineConfig {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;       // 0: the model's max_position_embeddings
  double kv_cache_memory_gib = 0;  // 0: enough for max_num_seqs full-length requests, <= 4 GiB
  int64_t block_size = 16;
  bool enable_prefix_caching = true;
  // Hybrid models' prefix caching: the GDN state checkpoints' memory (GiB, per rank; 0: one
  // checkpoint per 256 KV positions, at least 16, in at most kDefaultStateCacheGiB and an
  // eighth of the memory available at start) and the prompt interval between checkpoints (a
  // multiple of 64; 0: only at prompt and output ends).
  double state_cache_memory_gib = 0;
  int64_t state_checkpoint_interval = kDefaultStateCheckpointInterval;
  int64_t long_prefill_token_threshold = 0;
  SpecConfig spec = {};  // --spec, --spec-disable-batch-size, --spec-min-acceptance
  // Case study #8 / #9 (--no-greedy-argmax off): a step whose rows are all plain greedy, and
  // the MTP head's drafts, take argmaxes from the forward (vocab-parallel ranks exchange
  // (max, index) pairs) instead of full logits rows scanned by the sampler. Same tokens.
  bool greedy_argmax = true;
};

// What a configuration resolved to, for logs and tests.
struct EngineLayout {
  int64_t max_model_len = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t num_state_slots = 0;       // GDN state slots: one per running request, then the drafts'
  int64_t num_spec_state_slots = 0;  // of those, the drafts' (K per request that may draft at once)
  int64_t kv_bytes = 0;
  int64_t state_bytes = 0;
  int64_t prefill_alignment = 1;
  bool prefix_caching = false;
  int64_t state_slot_bytes = 0;  // one GDN state slot (a running request's, or a checkpoint)
  // Hybrid models' prefix caching: GDN state checkpoints (0 when off), where they may sit
  // (multiples of the alignment) and the prompt interval.
  int64_t num_checkpoints = 0;
  int64_t checkpoint_alignment = 0;
  int64_t checkpoint_interval = 0;
  SpecConfig spec = {};
};

// What `config` resolves to on a rank whose config (its shard's sizes) is `local_config`: the KV
// blocks, GDN state slots and checkpoints the engine will allocate. A value the model rejects is
// an InvalidArgument naming it. available_memory_bytes (MemAvailable once the weights are
// loaded; 0: unknown) bounds the default number of GDN state checkpoints. Engine::Create and the
// memory plan (memory_plan.h) both size the caches with it.
Result<EngineLayout> ResolveLayout(const io::ModelConfig& local_config, const EngineConfig& config,
                                   int64_t available_memory_bytes);

// vLLM's parallel sampling: n > 1 becomes n requests with n = 1, choice i seeded seed + i when a
// seed is set (vllm/v1/engine/parallel_sampling.py).
std::vector<SamplingParams> FanOut(const SamplingParams& params);

class Engine {
 public:
  // Validates the config against the model (a bad value is an InvalidArgument naming it) and
  // allocates the cache (every rank its shard: --kv-cache-memory is per rank, as vLLM's per
  // device).
  static Result<std::unique_ptr<Engine>> Create(model::ModelGroup& group,
                                                const EngineConfig& config);
  // One rank over a loaded model.
  static Result<std::unique_ptr<Engine>> Create(model::CausalLm& model, const EngineConfig& config);

  const EngineLayout& layout() const { return layout_; }
  const model::CausalLm& model() const { return group_.model(); }

  // Queues a request; returns its id. Rejects (naming the problem) an empty prompt, token ids
  // outside the vocabulary, a prompt longer than max_model_len, and invalid sampling parameters
  // (SamplingParams::Validate; n must be 1 here -- FanOut makes a request per choice). The EOS
  // ids are the model config's. Bad words must be resolved (ResolveBadWords) by the caller.
  // PrepareParams, PrepareRequest and AddPrepared, all on the caller's thread. grammar: the
  // params' structured_outputs compiled (null when they ask for none).
  Result<int64_t> AddRequest(std::vector<int32_t> prompt, SamplingParams params,
                             std::shared_ptr<const structured::CompiledGrammar> grammar = nullptr);

  // AddRequest in parts, for a caller (the server) that makes requests on other threads than the
  // one that steps the engine: what depends only on the request is made by the const, thread-safe
  // Prepare* (they read only the model's config and the layout), and AddPrepared, on the
  // engine's thread, only queues it.
  //
  // Validates and normalizes an API request's sampling parameters (any n) and builds the
  // sampler's tables, once for all of its choices. O(k log k) in the lengths of its lists.
  // grammar: params.structured_outputs compiled by the caller, who holds the tokenizer (null
  // when they ask for none).
  Result<std::shared_ptr<const PreparedParams>> PrepareParams(
      SamplingParams params,
      std::shared_ptr<const structured::CompiledGrammar> grammar = nullptr) const;
  // Choice `choice` (0 <= choice < n) of a prepared request over `prompt`: the prompt checked
  // against the vocabulary, the stop conditions set, the choice's sampler built (its generator
  // seeded seed + choice, or `unseeded_seed` when the request has no seed; [vocab] arrays for
  // the penalties and top-p in use) and its logprobs reserved. O(prompt + vocabulary).
  Result<std::unique_ptr<Request>> PrepareRequest(std::vector<int32_t> prompt,
                                                  std::shared_ptr<const PreparedParams> params,
                                                  int64_t choice, uint64_t unseeded_seed) const;
  // Queues a prepared request; returns its id. Rejects a prompt longer than max_model_len and a
  // request the KV cache cannot hold. Constant time but for reserving its block list.
  Result<int64_t> AddPrepared(std::unique_ptr<Request> request);

  // Aborts a request in any state, freeing its cache. False if unknown or already finished.
  // reason kStop ends it as finished by a stop string (the frontend's detokenizer found one).
  bool Abort(int64_t id, FinishReason reason = FinishReason::kAbort) {
    return scheduler_.Abort(id, reason);
  }

  // One engine step: schedule, forward, sample, update. Returns the requests that received a
  // token this step (finished ones included), valid until the next Step.
  const std::vector<Request*>& Step();

  // A request by id (finished ones stay until Release).
  const Request* Find(int64_t id) const { return scheduler_.Find(id); }
  void Release(int64_t id) { scheduler_.Release(id); }

  bool HasUnfinished() const { return scheduler_.HasUnfinished(); }
  int64_t num_running() const { return scheduler_.num_running(); }
  int64_t num_waiting() const { return scheduler_.num_waiting(); }
  double kv_cache_usage() const { return cache_manager_.usage(); }
  // Speculative decoding counts over every request so far.
  const SpecDecodeStats& spec_stats() const { return scheduler_.spec_stats(); }
  const KvCacheManager& cache_manager() const { return cache_manager_; }
  const ModelRunner& runner() const { return *runner_; }
  // The last step's scheduler output (for tests and traces); only after a Step.
  const SchedulerOutput& last_schedule() const {
    CHECK(last_schedule_ != nullptr) << "no step yet";
    return *last_schedule_;
  }

  Engine(model::ModelGroup& group, const EngineLayout& layout, const SchedulerConfig& scheduler,
         const KvCacheConfig& cache, const RunnerConfig& runner);

 private:
  // Every id of `prompt` lies in the vocabulary.
  Status CheckPromptIds(std::span<const int32_t> prompt) const;

  std::unique_ptr<model::ModelGroup> owned_group_;  // Create(CausalLm&)'s
  model::ModelGroup& group_;
  EngineLayout layout_;
  KvCacheManager cache_manager_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<DraftProposer> proposer_;  // null without speculative decoding
  std::vector<int32_t> eos_token_ids_;       // the model config's
  int64_t next_id_ = 0;
  std::mt19937_64 seeds_;  // AddRequest's generators of requests without a seed
  const SchedulerOutput* last_schedule_ = nullptr;
};

}  // namespace moeserve::engine
