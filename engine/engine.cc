#include "engine/engine.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/memory_info.h"
#include "core/trace.h"
#include "engine/spec_decode/mtp_proposer.h"
#include "engine/spec_decode/ngram_proposer.h"

namespace moeserve::engine {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Default KV cache cap, as vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE).
constexpr double kDefaultKvCacheGiB = 4.0;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one GDN state slot over every GDN layer: conv window and S, f32.
int64_t StateBytesPerSlot(const io::ModelConfig& c) {
  int64_t gdn_layers = 0;
  for (io::LayerType type : c.layer_types) gdn_layers += type == io::LayerType::kLinearAttention;
  const int64_t floats = (c.linear_conv_kernel_dim - 1) * c.linear_conv_dim() +
                         c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  return gdn_layers * floats * static_cast<int64_t>(sizeof(float));
}

// Bytes one KV block takes over every full-attention layer (MTP layers included): K and V, f32.
int64_t KvBytesPerBlock(const io::ModelConfig& c, int64_t block_size) {
  int64_t attention_layers = c.num_mtp_layers;
  for (io::LayerType type : c.layer_types) {
    attention_layers += type == io::LayerType::kFullAttention ? 1 : 0;
  }
  return 2 * block_size * c.num_key_value_heads * c.head_dim * static_cast<int64_t>(sizeof(float)) *
         std::max<int64_t>(attention_layers, 1);
}

}  // namespace

Result<EngineLayout> ResolveLayout(const io::ModelConfig& c, const EngineConfig& e,
                                   int64_t available_memory_bytes) {
  if (e.max_num_seqs < 1) {
    return InvalidArgument("--max-num-seqs must be >= 1 (got {})", e.max_num_seqs);
  }
  if (e.max_num_batched_tokens < 1) {
    return InvalidArgument("--max-num-batched-tokens must be >= 1 (got {})",
                           e.max_num_batched_tokens);
  }
  if (e.block_size < 1 || e.block_size > 256) {
    return InvalidArgument("--block-size must be in [1, 256] (got {})", e.block_size);
  }
  if (e.kv_cache_memory_gib < 0) {
    return InvalidArgument("--kv-cache-memory must be > 0 GiB (got {})", e.kv_cache_memory_gib);
  }
  if (e.long_prefill_token_threshold < 0) {
    return InvalidArgument("--long-prefill-token-threshold must be >= 0 (got {})",
                           e.long_prefill_token_threshold);
  }
  EngineLayout l;
  l.block_size = e.block_size;
  l.max_model_len = e.max_model_len > 0 ? e.max_model_len : c.max_position_embeddings;
  if (e.max_model_len < 0 || l.max_model_len > c.max_position_embeddings) {
    return InvalidArgument(
        "--max-model-len {} is outside [1, {}] (the model's max_position_embeddings)",
        e.max_model_len, c.max_position_embeddings);
  }
  // Hybrid models: prefill chunks end at multiples of the GDN chunk (batch invariance), so the
  // token budget must hold at least one such chunk; their recurrent state cannot be rebuilt from
  // KV blocks, so no prefix caching (docs/engine.md).
  l.prefill_alignment = model::PrefillAlignment(c);
  if (e.max_num_batched_tokens < l.prefill_alignment) {
    return InvalidArgument(
        "--max-num-batched-tokens {} is below {}, the prefill chunk alignment of this hybrid "
        "model",
        e.max_num_batched_tokens, l.prefill_alignment);
  }
  if (e.long_prefill_token_threshold > 0 && e.long_prefill_token_threshold < l.prefill_alignment) {
    return InvalidArgument(
        "--long-prefill-token-threshold {} is below {}, the prefill chunk alignment of this "
        "hybrid model",
        e.long_prefill_token_threshold, l.prefill_alignment);
  }
  l.prefix_caching = e.enable_prefix_caching;
  l.spec = ResolveSpec(e.spec, c.num_mtp_layers > 0);
  if (l.spec.enabled()) {
    if (l.spec.num_speculative_tokens < 1 ||
        l.spec.num_speculative_tokens > kMaxSpeculativeTokens) {
      return InvalidArgument("--spec: K must be in [1, {}] (got {})", kMaxSpeculativeTokens,
                             l.spec.num_speculative_tokens);
    }
    if (l.spec.disable_batch_size < 0) {
      return InvalidArgument("--spec-disable-batch-size must be >= 0 (got {})",
                             l.spec.disable_batch_size);
    }
    if (!(l.spec.min_acceptance >= 0 && l.spec.min_acceptance <= 1)) {
      return InvalidArgument("--spec-min-acceptance must be in [0, 1] (got {})",
                             l.spec.min_acceptance);
    }
  }
  // A verify run keeps the GDN state after each draft in a slot of its own: K for each request
  // that may draft at once (drafting pauses above --spec-disable-batch-size requests).
  const int64_t drafting = l.spec.disable_batch_size > 0
                               ? std::min(e.max_num_seqs, l.spec.disable_batch_size)
                               : e.max_num_seqs;
  l.num_spec_state_slots =
      c.is_hybrid() && l.spec.enabled() ? drafting * l.spec.num_speculative_tokens : 0;
  l.num_state_slots = c.is_hybrid() ? e.max_num_seqs + l.num_spec_state_slots : 0;

  const int64_t per_block = KvBytesPerBlock(c, e.block_size);
  const int64_t blocks_per_request = CeilDiv(l.max_model_len, e.block_size);
  if (e.kv_cache_memory_gib > 0) {
    l.num_blocks = static_cast<int64_t>(e.kv_cache_memory_gib * kGiB / per_block);
  } else {
    l.num_blocks = std::min(e.max_num_seqs * blocks_per_request,
                            static_cast<int64_t>(kDefaultKvCacheGiB * kGiB / per_block));
  }
  if (l.num_blocks < blocks_per_request) {
    return InvalidArgument(
        "the KV cache ({} blocks, {:.3f} GiB) cannot hold one request of --max-model-len {} "
        "({:.3f} GiB); raise --kv-cache-memory or lower --max-model-len",
        l.num_blocks, l.num_blocks * per_block / kGiB, l.max_model_len,
        blocks_per_request * per_block / kGiB);
  }
  l.kv_bytes = l.num_blocks * per_block;

  // Hybrid prefix caching: checkpoints of the GDN state at multiples of lcm(64, block_size).
  if (e.state_cache_memory_gib < 0) {
    return InvalidArgument("--state-cache-memory must be >= 0 GiB (got {})",
                           e.state_cache_memory_gib);
  }
  if (e.state_checkpoint_interval < 0 ||
      e.state_checkpoint_interval % model::GdnChunkAlignment() != 0) {
    return InvalidArgument("--state-checkpoint-interval must be a multiple of {} (got {})",
                           model::GdnChunkAlignment(), e.state_checkpoint_interval);
  }
  l.state_slot_bytes = c.is_hybrid() ? StateBytesPerSlot(c) : 0;
  if (c.is_hybrid() && l.prefix_caching) {
    l.checkpoint_alignment = std::lcm(model::GdnChunkAlignment(), l.block_size);
    l.checkpoint_interval = e.state_checkpoint_interval == 0
                                ? 0
                                : std::lcm(e.state_checkpoint_interval, l.checkpoint_alignment);
    const int64_t positions = l.num_blocks * l.block_size;
    if (e.state_cache_memory_gib > 0) {
      l.num_checkpoints =
          static_cast<int64_t>(e.state_cache_memory_gib * kGiB / l.state_slot_bytes);
    } else {
      // Default: one checkpoint per 256 positions the KV pool holds (a request takes a few: its
      // prompt's end, a shared prefix's junction, each interval, its output's end), at least
      // 16, in at most 2 GiB and an eighth of the memory available.
      const double budget =
          std::min(kDefaultStateCacheGiB * kGiB, static_cast<double>(available_memory_bytes) / 8);
      l.num_checkpoints = std::min(static_cast<int64_t>(budget / l.state_slot_bytes),
                                   std::max<int64_t>(positions / 256, 16));
    }
    // More checkpoints than aligned positions in the KV pool could never be attached.
    l.num_checkpoints = std::min(l.num_checkpoints, positions / l.checkpoint_alignment);
  }
  return l;
}

Result<std::unique_ptr<Engine>> Engine::Create(model::CausalLm& model, const EngineConfig& config) {
  auto group = std::make_unique<model::ModelGroup>(model);
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Create(*group, config));
  engine->owned_group_ = std::move(group);
  return engine;
}

Result<std::unique_ptr<Engine>> Engine::Create(model::ModelGroup& group,
                                               const EngineConfig& given) {
  const model::CausalLm& model = group.model();
  EngineConfig config = given;
  config.spec = ResolveSpec(given.spec, model.has_mtp());
  if (config.spec.method == SpecMethod::kMtp && !model.has_mtp()) {
    return InvalidArgument("--spec {}: the model has no MTP layer (no mtp.* weights); use ngram:K",
                           SpecName(config.spec));
  }
  // The cache is sized by a rank's shard (its KV heads).
  ASSIGN_OR_RETURN(EngineLayout layout,
                   ResolveLayout(model.shard().local, config, AvailableMemoryBytes()));
  const int64_t blocks_per_request = CeilDiv(layout.max_model_len, layout.block_size);
  const SpecConfig& spec = layout.spec;
  const int64_t K = spec.enabled() ? spec.num_speculative_tokens : 0;
  const SchedulerConfig scheduler{
      .max_num_seqs = config.max_num_seqs,
      .max_num_batched_tokens = config.max_num_batched_tokens,
      .max_model_len = layout.max_model_len,
      .prefill_alignment = layout.prefill_alignment,
      .long_prefill_token_threshold = config.long_prefill_token_threshold,
      .num_speculative_tokens = K,
      .spec_lookahead = spec.enabled() ? spec.lookahead() : 0};
  const KvCacheConfig cache{
      .num_blocks = layout.num_blocks,
      .block_size = layout.block_size,
      .num_state_slots = layout.num_state_slots,
      .spec_state_slots_per_request = layout.num_state_slots > 0 ? K : 0,
      .num_spec_state_slots = layout.num_spec_state_slots,
      .max_blocks_per_request = blocks_per_request,
      .enable_prefix_caching = layout.prefix_caching,
      .num_checkpoints = layout.num_checkpoints,
      .checkpoint_alignment = std::max<int64_t>(layout.checkpoint_alignment, 1),
      .checkpoint_interval = layout.checkpoint_interval,
      .checkpoint_keys_next_token = spec.method == SpecMethod::kMtp,
      .max_num_seqs = config.max_num_seqs};
  const RunnerConfig runner{
      .cache =
          model::CacheSizes{layout.num_blocks, layout.block_size,
                            std::max<int64_t>(layout.num_state_slots + layout.num_checkpoints, 1)},
      .max_num_seqs = config.max_num_seqs,
      .max_num_batched_tokens = config.max_num_batched_tokens,
      .max_blocks_per_request = blocks_per_request,
      .max_model_len = layout.max_model_len,
      .spec = spec,
      .greedy_argmax = config.greedy_argmax};
  return std::make_unique<Engine>(group, layout, scheduler, cache, runner);
}

Engine::Engine(model::ModelGroup& group, const EngineLayout& layout,
               const SchedulerConfig& scheduler, const KvCacheConfig& cache,
               const RunnerConfig& runner)
    : group_(group),
      layout_(layout),
      cache_manager_(cache),
      scheduler_(scheduler, cache_manager_),
      runner_(std::make_unique<ModelRunner>(group, runner)),
      seeds_(std::random_device{}()) {
  layout_.state_bytes = runner_->cache().state_bytes();
  const ProposerLimits limits{.max_num_seqs = runner.max_num_seqs,
                              .max_num_batched_tokens = runner.max_num_batched_tokens,
                              .max_model_len = runner.max_model_len,
                              .drafts_need_state_slots = layout.num_state_slots > 0};
  switch (runner.spec.method) {
    case SpecMethod::kNone:
    case SpecMethod::kAuto:  // resolved by Create
      break;
    case SpecMethod::kNgram:
      proposer_ = std::make_unique<NgramProposer>(runner.spec, limits);
      break;
    case SpecMethod::kMtp:
      proposer_ = std::make_unique<MtpProposer>(runner.spec, limits,
                                                group_.model().config().hidden_size, *runner_);
      break;
  }
  for (int64_t id : group_.model().config().eos_token_ids) {
    eos_token_ids_.push_back(static_cast<int32_t>(id));
  }
}

std::vector<SamplingParams> FanOut(const SamplingParams& params) {
  std::vector<SamplingParams> choices(std::max<int64_t>(params.n, 1), params);
  for (size_t i = 0; i < choices.size(); ++i) {
    choices[i].n = 1;
    if (params.seed.has_value() && *params.seed != -1) choices[i].seed = *params.seed + i;
  }
  return choices;
}

Result<int64_t> Engine::AddRequest(std::vector<int32_t> prompt, SamplingParams params,
                                   std::shared_ptr<const structured::CompiledGrammar> grammar) {
  // The checks in their old order, so that a request with several faults is refused for the same
  // one; PrepareParams validates again (cheap next to the rest).
  RETURN_IF_ERROR(CheckPromptIds(prompt));
  RETURN_IF_ERROR(params.Validate(model().config().vocab_size));
  if (params.n != 1) {
    return InvalidArgument("n must be 1 for one engine request (got {}); FanOut splits it",
                           params.n);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const PreparedParams> prepared,
                   PrepareParams(std::move(params), std::move(grammar)));
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request,
                   PrepareRequest(std::move(prompt), std::move(prepared), 0, seeds_()));
  return AddPrepared(std::move(request));
}

Status Engine::CheckPromptIds(std::span<const int32_t> prompt) const {
  const int64_t vocab = model().config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return InvalidArgument("prompt token {} (at {}) is outside the vocabulary [0, {})", prompt[i],
                             i, vocab);
    }
  }
  return OkStatus();
}

Result<std::shared_ptr<const PreparedParams>> Engine::PrepareParams(
    SamplingParams params, std::shared_ptr<const structured::CompiledGrammar> grammar) const {
  return engine::PrepareParams(std::move(params), eos_token_ids_, model().config().vocab_size,
                               std::move(grammar));
}

Result<std::unique_ptr<Request>> Engine::PrepareRequest(
    std::vector<int32_t> prompt, std::shared_ptr<const PreparedParams> params, int64_t choice,
    uint64_t unseeded_seed) const {
  CHECK(params != nullptr);
  RETURN_IF_ERROR(CheckPromptIds(prompt));
  const int64_t vocab = model().config().vocab_size;
  const SamplingParams& p = params->params;
  if (choice < 0 || choice >= std::max<int64_t>(p.n, 1)) {
    return InvalidArgument("choice {} of a request with n = {}", choice, p.n);
  }
  auto request = std::make_unique<Request>();
  request->stop.eos_token_ids = eos_token_ids_;
  request->stop.max_tokens = p.max_tokens;
  request->stop.min_tokens = p.min_tokens;
  request->stop.ignore_eos = p.ignore_eos;
  request->stop.stop_token_ids = p.stop_token_ids;
  request->skip_prefix_cache = p.prompt_logprobs.has_value();
  request->sampler =
      std::make_unique<RequestSampler>(params, prompt, vocab, ChoiceSeed(p, choice, unseeded_seed));
  // No more outputs than the context holds, however large max_tokens.
  if (p.logprobs.has_value()) {
    request->output_logprobs.reserve(std::min(p.max_tokens, layout_.max_model_len));
  }
  request->prepared = std::move(params);
  request->prompt_token_ids = std::move(prompt);
  return request;
}

Result<int64_t> Engine::AddPrepared(std::unique_ptr<Request> request) {
  CHECK(request != nullptr && request->prepared != nullptr) << "not made by PrepareRequest";
  request->id = next_id_;
  RETURN_IF_ERROR(scheduler_.AddRequest(std::move(request)));
  return next_id_++;
}

const std::vector<Request*>& Engine::Step() {
  if (trace::enabled()) {
    thread_local bool named = false;  // the thread that steps the engine is rank 0's caller
    if (!named) trace::NameThisThread(0, "rank 0 engine");
    named = true;
  }
  trace::Scope step_scope("step", "requests", static_cast<int64_t>(num_running()));
  const int64_t begin = MonotonicNanos();
  const SchedulerOutput* out = nullptr;
  {
    trace::Scope scope("schedule");
    out = &scheduler_.Schedule();
  }
  last_schedule_ = out;
  StepOutput& step = runner_->Execute(*out);
  if (!out->scheduled.empty()) {
    trace::Scope scope("propose");
    if (proposer_ != nullptr) proposer_->Propose(*out, step);
  }
  trace::Scope scope("update");
  const std::vector<Request*>& updated = scheduler_.Update(*out, step);
  // Hybrid prefix caching: the GDN state checkpoints this step reached, copied on every rank
  // before the next step can write the requests' slots.
  for (const StateCopy& copy : cache_manager_.pending_copies()) group_.CopySlot(copy.from, copy.to);
  cache_manager_.ClearPendingCopies();
  if (proposer_ != nullptr) proposer_->RecordStep(*out, MonotonicNanos() - begin);
  return updated;
}

}  // namespace moeserve::engine
