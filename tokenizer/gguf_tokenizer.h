// The tokenizer and chat template of a GGUF file (llama.cpp's single-file format), from its
// metadata:
//
//   tokenizer.ggml.model        "gpt2" (byte-level BPE; any other model is refused)
//   tokenizer.ggml.pre          the pre-tokenizer: "qwen2" (Qwen2, Qwen3, Qwen3-Next), "qwen35"
//                               (Qwen3.5), "llama-bpe" (Llama 3; also its older names "llama3",
//                               "llama-v3"); any other is refused
//   tokenizer.ggml.tokens       every token, in id order: the vocabulary, the added tokens, and
//                               "[PAD<id>]" entries up to the model's vocabulary size
//   tokenizer.ggml.token_type   per token: 1 normal (a BPE vocabulary token), 3 control (an added
//                               token marked special), 4 user-defined (an added token, not
//                               special), 5 unused (a padding entry: no token has that id)
//   tokenizer.ggml.merges       "left right", in rank order
//   tokenizer.ggml.{bos,eos,padding,unknown,seperator,mask,eot,eom}_token_id (sic: seperator)
//   tokenizer.ggml.add_bos_token, add_eos_token
//   tokenizer.chat_template     the Jinja template (the "default" one)
//
// This is what llama.cpp's converter (convert_hf_to_gguf.py, _set_vocab_gpt2) writes from a
// Hugging Face folder. The module turns it back into the tokenizer.json and tokenizer_config.json
// text that folder would hold and builds the Tokenizer and ChatTemplate from those, with the same
// code as a folder's: the components a pre-tokenizer name stands for are those of the family's
// tokenizer.json (Qwen: NFC normalizer, Split on the family's regex, ByteLevel; Llama 3: no
// normalizer, Split on its regex, ByteLevel, ignore_merges), so both paths encode and decode
// alike.
//
// What a GGUF file does not record, and what is taken instead:
//   - Which added tokens Hugging Face marks special: the converter also marks as control those
//     that look special ("<|...|>", ...) although they are not (Qwen3's <|fim_prefix|>,
//     <|repo_name|>, ...); here every control token is special, as llama.cpp treats them, so
//     skip_special_tokens drops those too.
//   - The added tokens' lstrip, rstrip, single_word and normalized flags: all false (llama.cpp
//     matches every added token verbatim, and the converter writes them pre-normalized).
//   - Whether tokenizer_config.json named a bos_token: the converter writes config.json's
//     bos_token_id when it did not (Qwen's <|endoftext|>), so bos_token is named (for the
//     tokenizer and the template's variable) only when add_bos_token is true; the id is in
//     GgufTokenizer::bos_token_id either way.
//   - additional_special_tokens: none.
//
// Every array and string is bounded (below) and every key's type, length and id is checked: bad
// metadata is an error naming the key, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

// Bounds on the metadata (far above real vocabularies: Qwen3 has 151,936 tokens and 151,387
// merges, its longest token is 256 bytes, its template 4 KB).
inline constexpr size_t kMaxGgufTokens = size_t{1} << 22;
inline constexpr size_t kMaxGgufMerges = size_t{1} << 22;
inline constexpr size_t kMaxGgufTokenBytes = 2048;
inline constexpr size_t kMaxGgufChatTemplateBytes = size_t{1} << 20;

using GgufMetadata = std::map<std::string, io::GgufValue, std::less<>>;

// The tokenizer.json and tokenizer_config.json text equivalent to a file's tokenizer metadata.
struct GgufTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // with "chat_template" when the file has one
  // The ids as the model's config.json gives them (what io::ModelConfig holds): eos_token_ids
  // is tokenizer.ggml.eos_token_id, then eot_token_id and eom_token_id when set (llama.cpp stops
  // on all three); bos_token_id is tokenizer.ggml.bos_token_id, -1 when absent.
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
};

// Errors name the key (and index) at fault.
Result<GgufTokenizerFiles> GgufTokenizerFilesFromMetadata(const GgufMetadata& metadata);

// What a caller needs of a GGUF file's tokenizer: what Tokenizer::LoadFromDir, cli's
// LoadChatTemplate and config.json's bos_token_id / eos_token_id give for a model folder.
struct GgufTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  // tokenizer.chat_template with the file's special tokens as its variables. nullopt when the
  // file has no template, or when it does not parse: then chat_template_status says why (the
  // tokenizer still loads, so a server can run without chat, as it does for a folder).
  std::optional<ChatTemplate> chat_template;
  Status chat_template_status;
  std::vector<int64_t> eos_token_ids;  // see GgufTokenizerFiles
  int64_t bos_token_id = -1;
  GgufTokenizerFiles files;

  // `source` (--chat-template FILE's text) with the file's special tokens as its variables.
  Result<ChatTemplate> WithChatTemplate(std::string source) const;
};

// Errors name the file and the key.
Result<GgufTokenizer> LoadGgufTokenizer(const io::GgufFile& file,
                                        const TokenizerOptions& options = {});

// llama.cpp's converter's does_token_look_special: added tokens it types CONTROL although
// tokenizer.json does not mark them special (<|...|>, <pad>, ...).
bool LooksSpecialToConverter(const std::string& token);

// Adds to `w` the tokenizer metadata llama.cpp's converter writes for a Hugging Face folder
// (_set_vocab_gpt2: get_vocab_base, then SpecialVocab), from tokenizer.json (`tok`),
// tokenizer_config.json (`config`), config.json's vocab_size and bos_token_id, and the
// pre-tokenizer's name: every id up to vocab_size with its token type, the unused ones as
// [PAD<id>], merges "a b", the special ids, add_bos_token and the chat template.
void AddGgufTokenizer(io::GgufWriter* w, const nlohmann::json& tok, const nlohmann::json& config,
                      int vocab_size, int config_bos_id, const std::string& pre);

}  // namespace moeserve::tokenizer
