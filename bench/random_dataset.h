// vLLM's RandomDataset (vllm/benchmarks/datasets.py; docs/spec/serving.md §6): synthetic prompts of
// controlled token lengths for `bench serve`.
//
//   input_len  ~ U[floor(L_in (1-r)), ceil(L_in (1+r))]   (L_in less the ids the tokenizer adds)
//   output_len ~ U[max(1, floor(L_out (1-r))), max(1, ceil(L_out (1+r)))]
//   offset     ~ U[0, vocab)
//   ids        = prefix + allowed[(offset + i + arange(input_len)) % |allowed|]   (request i)
//   prompt     = decode(ids), re-encoded and cut or topped up (with random allowed ids) until it
//                re-encodes to prefix_len + input_len ids, at most 10 rounds
//
// `allowed` is the tokenizer's base vocabulary: every id that has a token except the added tokens
// (special or not), in id order -- what vLLM's `arange(tokenizer.vocab_size)` minus the special
// ids gives for Hugging Face tokenizers, whose vocab_size leaves out added tokens -- less, unlike
// vLLM, the tokens that are not whole UTF-8 characters (byte-level pieces of a character): they
// decode to U+FFFD, and with a small vocabulary the decode/re-encode loop never converges.
//
// The random numbers come from std::mt19937_64 seeded with --seed: numpy's default_rng (PCG64
// with its own bounded-integer algorithm) cannot be matched, so the same seed does not give
// vLLM's prompts -- only the same construction and distributions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::bench {

struct SampleRequest {
  std::string prompt;
  int64_t prompt_len = 0;           // ids the prompt encodes to (without added special tokens)
  int64_t expected_output_len = 0;  // max_tokens of the request
};

struct RandomDatasetOptions {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0;  // in [0, 1)
  int64_t prefix_len = 0;  // a random prefix shared by every prompt
  uint64_t seed = 0;
  int max_retries = 10;  // decode/re-encode rounds
};

// An inclusive range of lengths.
struct LengthRange {
  int64_t low = 0, high = 0;
};

// The ranges input and output lengths are drawn from; InvalidArgument naming the flag when the
// options cannot give a prompt of at least one id.
Result<LengthRange> InputLengthRange(const RandomDatasetOptions& o, int64_t num_special_tokens);
Result<LengthRange> OutputLengthRange(const RandomDatasetOptions& o);

// The ids prompts are made of (see above), ascending.
std::vector<int32_t> AllowedTokenIds(const tokenizer::Tokenizer& tok);

struct RandomDataset {
  std::vector<SampleRequest> requests;
  // Sum over prompts of (ids the prompt encodes to) - (ids asked for): non-zero only when 10
  // rounds did not converge (vLLM warns about it too).
  int64_t token_mismatch = 0;
};

Result<RandomDataset> SampleRandomDataset(const tokenizer::Tokenizer& tok, int64_t num_requests,
                                          const RandomDatasetOptions& o);

}  // namespace moeserve::bench
