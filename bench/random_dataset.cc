#include "bench/random_dataset.h"

#include <cmath>
#include <optional>
#include <random>
#include <string_view>
#include <unordered_set>

namespace moeserve::bench {
namespace {

// A uniform integer in [low, high].
int64_t UniformInt(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

}  // namespace

Result<LengthRange> InputLengthRange(const RandomDatasetOptions& o, int64_t num_special_tokens) {
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return InvalidArgument("--random-range-ratio must be in [0, 1) (got {})", o.range_ratio);
  }
  if (o.prefix_len < 0) {
    return InvalidArgument("--random-prefix-len must be >= 0 (got {})", o.prefix_len);
  }
  // Room for the ids the tokenizer adds itself (a BOS), as vLLM leaves it.
  const double real = static_cast<double>(std::max<int64_t>(0, o.input_len - num_special_tokens));
  const LengthRange r{static_cast<int64_t>(std::floor(real * (1 - o.range_ratio))),
                      static_cast<int64_t>(std::ceil(real * (1 + o.range_ratio)))};
  if (o.prefix_len + r.low < 1) {
    return InvalidArgument(
        "--random-input-len {} is too small: with {} special tokens and --random-range-ratio {} "
        "a prompt could have no tokens",
        o.input_len, num_special_tokens, o.range_ratio);
  }
  return r;
}

Result<LengthRange> OutputLengthRange(const RandomDatasetOptions& o) {
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return InvalidArgument("--random-range-ratio must be in [0, 1) (got {})", o.range_ratio);
  }
  if (o.output_len < 1) {
    return InvalidArgument("--random-output-len must be >= 1 (got {})", o.output_len);
  }
  const double len = static_cast<double>(o.output_len);
  return LengthRange{
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - o.range_ratio)))),
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(len * (1 + o.range_ratio))))};
}

std::vector<int32_t> AllowedTokenIds(const tokenizer::Tokenizer& tok) {
  std::unordered_set<int32_t> added;
  for (const tokenizer::AddedToken& t : tok.added_tokens()) added.insert(t.id);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < tok.id_limit(); ++id) {
    const std::optional<std::string_view> bytes = tok.TokenBytes(id);
    if (!bytes || tok.IsSpecial(id) || added.count(id)) continue;
    // Whole UTF-8 characters only: a partial one decodes to U+FFFD, whose 3 bytes re-encode to
    // more ids, and cutting those back makes another partial character -- with a small
    // vocabulary the length then never settles.
    const int32_t one[] = {id};
    if (tok.Decode(one) != *bytes) continue;
    ids.push_back(id);
  }
  return ids;
}

Result<RandomDataset> SampleRandomDataset(const tokenizer::Tokenizer& tok, int64_t num_requests,
                                          const RandomDatasetOptions& o) {
  ASSIGN_OR_RETURN(const std::vector<int32_t> no_text, tok.Encode("", true));
  const int64_t num_special = static_cast<int64_t>(no_text.size());
  ASSIGN_OR_RETURN(const LengthRange in_range, InputLengthRange(o, num_special));
  ASSIGN_OR_RETURN(const LengthRange out_range, OutputLengthRange(o));
  const std::vector<int32_t> allowed = AllowedTokenIds(tok);
  if (allowed.empty()) return InvalidArgument("the tokenizer has no ordinary tokens");
  const int64_t num_allowed = static_cast<int64_t>(allowed.size());

  // The draws in vLLM's order: all input lengths, all output lengths, all offsets, the prefix,
  // then the top-ups of the prompts that re-encode short.
  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> input_lens(num_requests), output_lens(num_requests), offsets(num_requests);
  for (int64_t& len : input_lens) len = UniformInt(rng, in_range.low, in_range.high);
  for (int64_t& len : output_lens) len = UniformInt(rng, out_range.low, out_range.high);
  for (int64_t& off : offsets) off = UniformInt(rng, 0, static_cast<int64_t>(tok.vocab_size()) - 1);
  std::vector<int32_t> prefix(o.prefix_len);
  for (int32_t& id : prefix) id = allowed[UniformInt(rng, 0, num_allowed - 1)];

  RandomDataset out;
  out.requests.reserve(num_requests);
  for (int64_t i = 0; i < num_requests; ++i) {
    std::vector<int32_t> ids = prefix;
    for (int64_t k = 0; k < input_lens[i]; ++k) {
      ids.push_back(allowed[(offsets[i] + i + k) % num_allowed]);
    }
    // N ids need not decode to a text of N ids ("calls"+"here" -> "call"+"sh"+"ere"): cut or top
    // up and try again. vLLM tops up with any id below vocab_size; we draw from `allowed` so that
    // no special token can enter a prompt.
    const size_t target = static_cast<size_t>(o.prefix_len + input_lens[i]);
    std::string prompt;
    for (int round = 0;; ++round) {
      prompt = tok.Decode(ids);
      ASSIGN_OR_RETURN(ids, tok.Encode(prompt));
      if (ids.size() == target) break;
      if (round == o.max_retries) {
        out.token_mismatch += static_cast<int64_t>(ids.size()) - static_cast<int64_t>(target);
        break;
      }
      if (ids.size() > target) {
        ids.resize(target);
      } else {
        while (ids.size() < target) ids.push_back(allowed[UniformInt(rng, 0, num_allowed - 1)]);
      }
    }
    out.requests.push_back({std::move(prompt), static_cast<int64_t>(ids.size()), output_lens[i]});
  }
  return out;
}

}  // namespace moeserve::bench
