#include "engine/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_set>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::engine {
namespace {

// vLLM's limits: VLLM_MAX_N_SEQUENCES, _MAX_TEMP, VLLM_MAX_NUM_BAD_WORDS (token sequences after
// tokenization, both spellings of every word counted).
constexpr int64_t kMaxNSequences = 16384;
constexpr double kMinTemperature = 0.01;
constexpr size_t kMaxNumBadWords = 128;
constexpr float kMaxLogitBias = 100.0f;

// The first id of `ids` outside [0, vocab_size), if any.
template <typename Ids>
const int32_t* FindOutOfVocab(const Ids& ids, int64_t vocab_size) {
  for (const int32_t& id : ids) {
    if (id < 0 || id >= vocab_size) return &id;
  }
  return nullptr;
}

// Python's str.lstrip() for the ASCII whitespace it strips (" \t\n\v\f\r" and \x1c-\x1f).
// Non-ASCII whitespace (U+00A0, U+2000...) is kept: bad words starting with it are rare and
// keeping it only costs a sequence that cannot match.
std::string_view LstripAscii(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (!(c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f))) break;
    ++i;
  }
  return s.substr(i);
}

// Removes repeated elements, keeping the first occurrence and the order (dict.fromkeys).
template <typename T, typename Key>
void DedupKeepFirst(std::vector<T>& v, Key key) {
  std::unordered_set<std::decay_t<decltype(key(v[0]))>> seen;
  size_t out = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!seen.insert(key(v[i])).second) continue;
    if (out != i) v[out] = std::move(v[i]);  // a self-move would empty a string
    ++out;
  }
  v.resize(out);
}

}  // namespace

Status SamplingParams::Validate(int64_t vocab_size) const {
  CHECK_GT(vocab_size, 0);
  // vLLM's _verify_args order; negated comparisons so that NaN fails every range check.
  if (n < 1) return InvalidArgument("n must be at least 1, got {}.", n);
  if (n > kMaxNSequences)
    return InvalidArgument("n must be at most {}, got {}.", kMaxNSequences, n);
  if (!(presence_penalty >= -2.0 && presence_penalty <= 2.0)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got {}.", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0 && frequency_penalty <= 2.0)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got {}.", frequency_penalty);
  }
  if (!std::isfinite(repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be a finite number, got {}.",
                           repetition_penalty);
  }
  if (repetition_penalty <= 0.0) {
    return InvalidArgument("repetition_penalty must be greater than zero, got {}.",
                           repetition_penalty);
  }
  if (!std::isfinite(temperature)) {
    return InvalidArgument("temperature must be a finite number, got {}.", temperature);
  }
  if (temperature < 0.0) {
    return InvalidArgument("temperature must be non-negative, got {}.", temperature);
  }
  if (temperature > 2.0)
    return InvalidArgument("temperature must be in [0, 2], got {}.", temperature);
  if (!(top_p > 0.0 && top_p <= 1.0))
    return InvalidArgument("top_p must be in (0, 1], got {}.", top_p);
  if (top_k < -1)
    return InvalidArgument("top_k must be 0 (disable), or at least 1, got {}.", top_k);
  if (!(min_p >= 0.0 && min_p <= 1.0))
    return InvalidArgument("min_p must be in [0, 1], got {}.", min_p);
  if (max_tokens < 1) return InvalidArgument("max_tokens must be at least 1, got {}.", max_tokens);
  if (min_tokens < 0) {
    return InvalidArgument("min_tokens must be greater than or equal to 0, got {}.", min_tokens);
  }
  if (min_tokens > max_tokens) {
    return InvalidArgument("min_tokens must be less than or equal to max_tokens={}, got {}.",
                           max_tokens, min_tokens);
  }
  if (logprobs.has_value() && *logprobs < -1) {
    return InvalidArgument("logprobs must be non-negative or -1, got {}.", *logprobs);
  }
  if (prompt_logprobs.has_value() && *prompt_logprobs < -1) {
    return InvalidArgument("prompt_logprobs must be non-negative or -1, got {}.", *prompt_logprobs);
  }
  for (const std::string& s : stop) {
    if (s.empty()) return InvalidArgument("stop cannot contain an empty string.");
  }
  for (const std::string& w : bad_words) {
    if (w.empty()) return InvalidArgument("bad_words cannot contain an empty string.");
  }
  // vLLM raises a temperature in (0, 0.01) to 0.01 before deciding greediness, so only a zero
  // temperature is greedy once normalized.
  if (temperature == 0.0 && n > 1) {
    return InvalidArgument("n must be 1 when using greedy sampling, got {}.", n);
  }
  if (const int32_t* bad = FindOutOfVocab(stop_token_ids, vocab_size)) {
    return InvalidArgument("stop_token_ids contains out-of-vocab token id {}; vocabulary size: {}",
                           *bad, vocab_size);
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return InvalidArgument("logit_bias contains out-of-vocab token id {}; vocabulary size: {}",
                             token, vocab_size);
    }
    if (std::isnan(bias)) return InvalidArgument("logit_bias of token {} is not a number", token);
  }
  if (allowed_token_ids.has_value()) {
    if (allowed_token_ids->empty()) return InvalidArgument("allowed_token_ids must not be empty");
    if (const int32_t* bad = FindOutOfVocab(*allowed_token_ids, vocab_size)) {
      return InvalidArgument(
          "allowed_token_ids contains out-of-vocab token id {}; vocabulary size: {}", *bad,
          vocab_size);
    }
  }
  if (structured_outputs_after_token < -1 || structured_outputs_after_token >= vocab_size) {
    return InvalidArgument("structured_outputs_after_token {} is outside the vocabulary of {}",
                           structured_outputs_after_token, vocab_size);
  }
  if (structured_outputs_rearm && structured_outputs_after_token < 0) {
    return InvalidArgument("structured_outputs_rearm needs structured_outputs_after_token");
  }
  for (const std::vector<int32_t>& seq : bad_words_token_ids) {
    if (const int32_t* bad = FindOutOfVocab(seq, vocab_size)) {
      return InvalidArgument("bad_words tokenize to token id {}, outside the vocabulary of {}",
                             *bad, vocab_size);
    }
  }
  return OkStatus();
}

void SamplingParams::Normalize() {
  // vLLM's __post_init__ order: the temperature floor first, so (0, 0.01) samples, not greedy.
  if (temperature > 0.0 && temperature < kMinTemperature) temperature = kMinTemperature;
  if (seed == -1) seed.reset();
  if (top_k == -1) top_k = 0;
  if (greedy()) {
    top_p = 1.0;
    top_k = 0;
    min_p = 0.0;
  }
  // logit_bias is a dict in vLLM: one bias per token, the last one given wins.
  {
    std::vector<std::pair<int32_t, float>> reversed(logit_bias.rbegin(), logit_bias.rend());
    DedupKeepFirst(reversed, [](const std::pair<int32_t, float>& e) { return e.first; });
    logit_bias.assign(reversed.rbegin(), reversed.rend());
  }
  for (auto& [token, bias] : logit_bias) bias = std::clamp(bias, -kMaxLogitBias, kMaxLogitBias);
  DedupKeepFirst(stop_token_ids, [](int32_t id) { return id; });
  DedupKeepFirst(bad_words, [](const std::string& w) { return w; });
}

Status ResolveBadWords(SamplingParams& p, const tokenizer::Tokenizer& tokenizer) {
  // vLLM's update_from_tokenizer: each word, left-stripped, is encoded plain (banned at the
  // start of the text) and after a space (in the middle). The spaced form is kept only when it
  // starts with a different token than the plain one and has as many tokens -- where the space
  // merges into the first token. Identical sequences (from different words) are kept once.
  p.bad_words_token_ids.clear();
  std::vector<std::string> words = p.bad_words;
  DedupKeepFirst(words, [](const std::string& w) { return w; });
  for (const std::string& word : words) {
    const std::string_view stripped = LstripAscii(word);
    std::vector<int32_t> plain;
    for (const bool spaced : {false, true}) {
      std::string text = spaced ? " " : "";
      text.append(stripped);
      Result<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_special_tokens=*/false);
      if (!ids.ok()) return ids.status().WithContext(fmt::format("bad_words entry '{}'", word));
      if (ids->empty()) {
        if (!spaced) {
          return InvalidArgument("bad_words entries must tokenize to at least one token, got '{}'",
                                 word);
        }
        continue;
      }
      if (spaced && ((*ids)[0] == plain[0] || ids->size() != plain.size())) continue;
      if (!spaced) plain = *ids;
      if (std::find(p.bad_words_token_ids.begin(), p.bad_words_token_ids.end(), *ids) !=
          p.bad_words_token_ids.end()) {
        continue;
      }
      p.bad_words_token_ids.push_back(std::move(ids).value());
      if (p.bad_words_token_ids.size() > kMaxNumBadWords) {
        return InvalidArgument("bad_words: too many after tokenization ({}); the max number is {}",
                               p.bad_words_token_ids.size(), kMaxNumBadWords);
      }
    }
  }
  const int32_t limit = tokenizer.id_limit();
  for (const std::vector<int32_t>& seq : p.bad_words_token_ids) {
    if (const int32_t* bad = FindOutOfVocab(seq, limit)) {
      return Internal("bad_words: the tokenizer produced token id {} outside [0, {})", *bad, limit);
    }
  }
  return OkStatus();
}

}  // namespace moeserve::engine
