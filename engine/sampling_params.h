// SamplingParams: vLLM's per-request sampling parameters (docs/spec/serving.md §3.1) -- names,
// defaults and validation ranges as vLLM's `SamplingParams` -- and the token-id forms of the
// text-valued ones that the frontend resolves with the tokenizer before the engine sees them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "structured/structured.h"

namespace moeserve::tokenizer {
class Tokenizer;
}

namespace moeserve::engine {

// Below this temperature a request is greedy (vLLM's _SAMPLING_EPS).
inline constexpr double kSamplingEps = 1e-5;

struct SamplingParams {
  int64_t n = 1;                    // 1 <= n <= 16384; 1 when greedy
  double temperature = 1.0;         // [0, 2]; < 1e-5 = greedy; (0, 0.01) raised to 0.01
  double top_p = 1.0;               // (0, 1]
  int64_t top_k = 0;                // 0 or -1: off; else >= 1
  double min_p = 0.0;               // [0, 1]
  std::optional<int64_t> seed;      // per-request generator; -1 means none
  double presence_penalty = 0.0;    // [-2, 2], output tokens
  double frequency_penalty = 0.0;   // [-2, 2], output tokens
  double repetition_penalty = 1.0;  // > 0, prompt and output tokens
  int64_t max_tokens = 16;          // >= 1
  int64_t min_tokens = 0;           // [0, max_tokens]
  std::vector<std::string> stop;    // stop strings (checked by the frontend's detokenizer)
  bool include_stop_str_in_output = false;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::optional<int64_t> logprobs;         // top-N logprobs per output token; -1 = whole vocab
  std::optional<int64_t> prompt_logprobs;  // the same per prompt token
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias), bias clamped to [-100, 100]
  std::optional<std::vector<int32_t>> allowed_token_ids;  // non-empty whitelist
  std::vector<std::string> bad_words;
  bool skip_special_tokens = true;
  // Structured output (vLLM's structured_outputs; also read from response_format and the older
  // guided_* keys): the output must be a sentence of this grammar. Compiled by the frontend,
  // which holds the tokenizer (PreparedParams::grammar).
  std::optional<structured::GrammarSpec> structured_outputs;
  // The grammar applies only after this token (a reasoning model's </think>: the thinking is
  // free, the answer constrained); -1: from the first token. Set by the server, not a JSON key.
  int32_t structured_outputs_after_token = -1;
  // Once the grammar is complete (nothing but the end can follow), it sleeps until that token
  // comes again: tool calls among free text (tool_choice auto with strict tools).
  bool structured_outputs_rearm = false;

  // Filled by ResolveBadWords: each bad word's token sequences (with and without a leading
  // space); a sequence's last token is banned when the output ends with the rest of it.
  std::vector<std::vector<int32_t>> bad_words_token_ids;

  bool greedy() const { return temperature < kSamplingEps; }

  // vLLM's checks; the error names the parameter ("temperature must be in [0, 2], got 3").
  // Token ids (stop_token_ids, logit_bias, allowed_token_ids) must lie in [0, vocab_size).
  Status Validate(int64_t vocab_size) const;
  // vLLM's normalization after validation: seed -1 -> none; greedy -> top_p 1, top_k 0, min_p 0;
  // top_k -1 -> 0; temperature in (0, 0.01) -> 0.01; logit_bias clamped; stop_token_ids
  // de-duplicated.
  void Normalize();
};

// Tokenizes p.bad_words into p.bad_words_token_ids (each word plain and with a leading space,
// as vLLM's update_from_tokenizer).
Status ResolveBadWords(SamplingParams& p, const tokenizer::Tokenizer& tokenizer);

}  // namespace moeserve::engine
