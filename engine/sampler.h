// Token selection with vLLM's semantics (docs/spec/serving.md §3.2). Per request, a RequestSampler
// is built once when the request joins the batch -- its masks, penalty counts, generator, grammar
// matcher -- and updated as its tokens are accepted; no per-step rebuild. Per row, in vLLM's order:
//   structured output's grammar mask -> raw logprobs (if asked) -> allowed_token_ids mask -> bad
//   words -> min_tokens (stop ids to -inf while fewer than min_tokens outputs) -> logit_bias ->
//   repetition, frequency, presence penalties -> greedy: argmax | random: temperature -> min_p ->
//   top-k -> top-p -> draw.
// A greedy request with none of those processors active takes argmax of the raw logits directly
// (the greedy fast path: no copy, no softmax).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "structured/matcher.h"

namespace moeserve::engine {

// argmax over logits [vocab]; ties go to the lowest id (as torch.argmax on CPU).
int32_t GreedyToken(const float* logits, int64_t vocab);

struct TokenLogprob {
  int32_t token;
  float logprob;
  int64_t rank;  // sampled token: tokens with logprob >= its own (vLLM); top-N: position 1 .. n
};

// One sampled position: the token, and when logprobs were asked, the token's own logprob and
// rank plus the top-N tokens (descending logprob, ties by lower id).
struct SampledToken {
  int32_t token = -1;
  TokenLogprob sampled{};
  std::vector<TokenLogprob> top;
};

// log_softmax of logits [vocab] into out [vocab], in double-accumulated f32.
void LogSoftmax(const float* logits, int64_t vocab, float* out);

// The top-n entries of logprobs [vocab] (n = -1: all), and `token`'s own entry, into *result.
void GatherLogprobs(const float* logprobs, int64_t vocab, int64_t n, int32_t token,
                    SampledToken* result);

// The token tables of a request's logits processors, which never change while it runs: built once
// per API request -- O(k log k) in the lengths of its lists -- and shared, read-only, by the
// samplers of its choices.
struct SamplerTables {
  // p must be validated. eos_token_ids: the model's, masked by min_tokens (even with ignore_eos,
  // as vLLM).
  SamplerTables(const SamplingParams& p, std::span<const int32_t> eos_token_ids, int64_t vocab);

  std::vector<int32_t> allowed_ids;  // allowed_token_ids, sorted and unique; empty: unrestricted
  // Bad words: single-token ones are always banned (sorted, unique); longer ones ban their last
  // token when the outputs end with the rest.
  std::vector<int32_t> banned_ids;
  std::vector<std::vector<int32_t>> bad_sequences;
  // EOS and stop_token_ids, masked while fewer than min_tokens outputs (empty: nothing to mask).
  std::vector<int32_t> min_tokens_stop_ids;
  // One bias per token -- the last given (a dict in vLLM) -- clamped to [-100, 100], zero ones
  // dropped, by token id.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// A request's sampling made ready once for all of its choices (an API request's n of them): its
// parameters, validated and normalized, and their tables. Immutable: the choices' engine
// requests and the server's answer share one, from any thread.
struct PreparedParams {
  SamplingParams params;
  SamplerTables tables;
  // params.structured_outputs compiled for the tokenizer (null: unconstrained).
  std::shared_ptr<const structured::CompiledGrammar> grammar;
};

// Validates p against the vocabulary (SamplingParams::Validate; bad words must be resolved by
// the caller), normalizes it and builds its tables. eos_token_ids: the model's. grammar:
// p.structured_outputs compiled by the caller (it must be given exactly when p asks for one).
Result<std::shared_ptr<const PreparedParams>> PrepareParams(
    SamplingParams p, std::span<const int32_t> eos_token_ids, int64_t vocab,
    std::shared_ptr<const structured::CompiledGrammar> grammar = nullptr);

// The generator seed of choice `choice` of a request: seed + choice when the request has one
// (vLLM's parallel sampling, as FanOut), else `unseeded`.
uint64_t ChoiceSeed(const SamplingParams& p, int64_t choice, uint64_t unseeded);

class RequestSampler {
 public:
  // One choice of a prepared request: shares `prepared` with the request's other choices and
  // holds what this one changes -- penalty counts (a [vocab] array per active penalty), top-p's
  // scratch, the generator, seeded `seed` (ChoiceSeed). O(vocab + prompt) when a penalty or
  // top-p is on.
  RequestSampler(std::shared_ptr<const PreparedParams> prepared, std::span<const int32_t> prompt,
                 int64_t vocab, uint64_t seed);
  // A request alone (tests): p must be validated; its tables are built here. unseeded_seed seeds
  // the generator when p.seed is unset.
  RequestSampler(const SamplingParams& p, std::span<const int32_t> prompt,
                 std::span<const int32_t> eos_token_ids, int64_t vocab, uint64_t unseeded_seed);

  // True when the row can take argmax of the raw logits: greedy, no processor active, no
  // logprobs.
  bool plain_greedy() const { return plain_greedy_; }

  // Samples the next token from the raw logits [vocab] (left untouched) given the outputs so
  // far; scratch holds 2 * vocab floats. Fills *result (logprobs only if asked).
  void Sample(const float* logits, std::span<const int32_t> outputs, float* scratch,
              SampledToken* result);

  // Speculative verification of one draft token at one verify row (docs/spec/serving.md §4). Drafts
  // are one-hot (q(d) = 1: MTP's argmax, n-gram), so the rejection rule is: accept d with
  // probability p(d) -- p the final distribution Sample draws from -- else emit a token drawn
  // from p without d (normalize(max(p - q, 0))). This draws the row's token exactly as Sample
  // does, with the same one uniform from the request's generator, and accepts iff it is the
  // draft: P(accept) = p(d), and a rejected row's token is p conditioned on not d -- the rule
  // itself, as a coupling. So the tokens a request emits, and its generator's state, are those
  // of decoding without drafts: seeded output does not depend on speculation, the batch or its
  // pauses. Greedy rows: the argmax, accepted iff it is the draft. Returns whether the draft was
  // accepted; result->token is the row's token either way. Does not Accept.
  bool Verify(const float* logits, std::span<const int32_t> outputs, int32_t draft, float* scratch,
              SampledToken* result) {
    Sample(logits, outputs, scratch, result);
    return result->token == draft;
  }

  // Records an accepted output token (penalty counts, the grammar's state).
  void Accept(int32_t token);

  // The grammar's matcher (null when unconstrained).
  const structured::Matcher* matcher() const { return matcher_ ? &*matcher_ : nullptr; }

 private:
  friend class RequestSamplerTestPeer;  // sampler_test.cc reads the final distribution

  // Steps before the greedy/random split, on a copy of the raw logits: allowed_token_ids, bad
  // words, min_tokens, logit_bias, penalties. logits [vocab] -> work [vocab].
  void ApplyProcessors(const float* logits, std::span<const int32_t> outputs, float* work) const;
  // The random path up to the draw: temperature, min_p, top-k, top-p over work [vocab] (changed
  // in place). weights [vocab] gets the final distribution unnormalized (exp(logit - max), 0 for
  // masked tokens); returns its sum, accumulated in id order in double.
  double FinalWeights(float* work, float* weights);
  // Inverse-CDF draw from weights [vocab] (sum `total`), one 53-bit uniform from generator_.
  int32_t Draw(const float* weights, double total);
  const SamplerTables& tables() const { return prepared_->tables; }
  // Structured output: logits [vocab] with every token the grammar refuses at -inf, into
  // grammar_logits_ (the grammar ended or gave up: EOS alone).
  const float* GrammarMasked(const float* logits);
  // The grammar can end and nothing else can follow.
  bool GrammarComplete();
  bool GrammarAllows(int32_t token) const {
    return (grammar_mask_[token >> 5] >> (token & 31)) & 1u;
  }

  std::shared_ptr<const PreparedParams> prepared_;  // the request's, shared by its choices

  int64_t vocab_;
  bool greedy_;
  bool plain_greedy_;
  float temperature_;
  double top_p_;   // 1: off
  int64_t top_k_;  // 0: off (also when >= vocab)
  double min_p_;   // 0: off
  std::optional<int64_t> logprobs_;
  int64_t min_tokens_;  // 0 when the tables have nothing to mask

  // Penalties. The dense per-token state exists only when its penalty is active; the lists name
  // the tokens it is non-zero for, so that a step touches only those (reserved at construction
  // for max_tokens outputs, so Accept does not allocate either).
  float repetition_penalty_;                  // 1: off
  float frequency_penalty_;                   // 0: off
  float presence_penalty_;                    // 0: off
  std::vector<uint8_t> in_prompt_or_output_;  // [vocab] if repetition_penalty_ != 1
  std::vector<int32_t> prompt_or_output_ids_;
  std::vector<int32_t> output_counts_;  // [vocab] if frequency or presence is active
  std::vector<int32_t> output_ids_;     // distinct output tokens

  // Top-p's mass per logit bin and the token ids of the bin it cuts in (when top-p is on).
  std::vector<double> bin_mass_;
  std::vector<int32_t> order_;  // [vocab]
  std::mt19937_64 generator_;

  // Structured output: the request's place in its grammar, the step's mask of allowed tokens
  // (one bit per id) and the masked logits [vocab].
  std::optional<structured::Matcher> matcher_;
  bool grammar_active_ = true;  // false until params.structured_outputs_after_token is accepted
  std::vector<uint32_t> grammar_mask_;
  std::vector<float> grammar_logits_;
};

}  // namespace moeserve::engine
