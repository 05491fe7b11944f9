// Writes Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) for a byte-level
// BPE vocabulary, in the layout Qwen2/Qwen3 use: NFC normalizer, Split(Qwen regex, Isolated) +
// ByteLevel(use_regex=false) pre-tokenizer, ByteLevel decoder, BPE model without unk token, and
// the special tokens as added tokens after the BPE vocabulary.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/bpe_trainer.h"

namespace moeserve::tokenizer {

struct SpecialToken {
  std::string content;  // "<|im_end|>"
  int id;
};

// The text of tokenizer.json.
std::string MakeTokenizerJson(const BpeVocab& vocab, const std::vector<SpecialToken>& specials);

// The ChatML template Qwen models use (without tools or thinking).
extern const char kChatMlTemplate[];

// The text of tokenizer_config.json: tokenizer_class Qwen2Tokenizer, eos "<|im_end|>",
// pad "<|endoftext|>", no bos, added_tokens_decoder for the specials, chat_template.
std::string MakeTokenizerConfigJson(const std::vector<SpecialToken>& specials,
                                    const std::string& chat_template, int model_max_length);

}  // namespace moeserve::tokenizer
