// The parts of a loaded Tokenizer, shared by tokenizer.cc (encode, decode) and
// tokenizer_loader.cc (tokenizer.json and tokenizer_config.json). Private to tokenizer/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  Normalizer normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;

  // In file order (tokenizer.json's, then tokenizer_config.json's additions).
  std::vector<AddedToken> added;
  std::vector<std::string> added_text;   // per added token: its text as IdToToken gives it
  AddedTokenMatcher raw_matcher;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher;  // the others, by their normalized content

  // The post-processor's single-sequence template: ids put around the text's ids when encoding
  // with add_special_tokens.
  std::vector<int32_t> template_prefix;
  std::vector<int32_t> template_suffix;

  // Per id: what it decodes to and whether it is special. decode_offsets has id_limit + 1 entries;
  // the bytes of id i are decode_bytes[decode_offsets[i], decode_offsets[i + 1]).
  std::string decode_bytes;
  std::vector<uint32_t> decode_offsets;
  std::vector<uint8_t> id_flags;  // kIdPresent | kIdSpecial
  static constexpr uint8_t kIdPresent = 1;
  static constexpr uint8_t kIdSpecial = 2;
  std::vector<int32_t> added_index;  // id -> index into `added`, -1 when not an added token
  std::unordered_map<std::string, int32_t> added_ids;  // content -> id
  size_t vocab_size = 0;
  size_t max_bytes_per_token = 0;  // Tokenizer::max_bytes_per_token, set by its constructor

  std::optional<NamedToken> bos;
  std::optional<NamedToken> eos;
  std::optional<NamedToken> pad;
  std::optional<NamedToken> unk;
  std::vector<std::string> additional_special_tokens;
};

}  // namespace moeserve::tokenizer
