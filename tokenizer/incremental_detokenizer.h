// Streaming detokenization for generated tokens: ids go in one at a time, text comes out as soon
// as it is final. Final means
//   - complete UTF-8: a character split across tokens waits for its last byte;
//   - not possibly the start of a stop string: text that could still grow into one is held back
//     until it cannot (or until Flush).
// The concatenation of everything returned equals Tokenizer::Decode of all ids fed (with the same
// skip_special_tokens), however the ids are split into calls — up to the stop string, when one
// completes: the text before it is returned (with the stop string if include_stop_str_in_output)
// and the stream is over. When several stop strings complete within one token's text, the one that
// ends first wins (then the longest), as the serving spec says.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

struct DetokenizerOptions {
  bool skip_special_tokens = false;
  // Empty strings are ignored (the server rejects them, as vLLM does). Shared, not copied: the
  // server's choices of one request all point at the request's list.
  std::shared_ptr<const std::vector<std::string>> stop = nullptr;
  bool include_stop_str_in_output = false;
  // As vLLM: no stop string may end in the text of the first min_tokens ids (one may start
  // there and end later).
  int64_t min_tokens = 0;
};

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options);

  // Feeds ids; returns the text they complete (often empty). Once stopped() ids are ignored.
  // `ends_generation`: the id is the stop token (EOS, stop_token_ids) that ended generation; as
  // in vLLM, its text is left out unless include_stop_str_in_output.
  std::string Add(int32_t id, bool ends_generation = false);
  std::string Add(std::span<const int32_t> ids);

  // Ends the stream (later ids are ignored) and returns everything still held back — text that
  // could have started a stop string, and a trailing incomplete character as U+FFFD (as a full
  // decode writes it).
  std::string Flush();

  // True once a stop string completed.
  bool stopped() const { return stop_index_ >= 0; }
  // Which options.stop string completed (-1: none).
  int stop_index() const { return stop_index_; }

 private:
  // Checks stop strings in pending_ (text before searched_up_to was checked already) and moves
  // what is final to *out; with final = true nothing is held back any more.
  void Release(std::string* out, size_t searched_up_to, bool final);
  const std::vector<std::string>& stop_strings() const;

  const Tokenizer& tokenizer_;
  DetokenizerOptions options_;
  std::string bytes_;    // token bytes not yet decoded: an incomplete UTF-8 sequence at most
  std::string pending_;  // decoded text not yet returned: held for a possible stop string
  int stop_index_ = -1;
  bool flushed_ = false;
  int64_t num_ids_ = 0;  // ids fed
};

}  // namespace moeserve::tokenizer
