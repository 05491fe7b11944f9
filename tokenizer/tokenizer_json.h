// The parts of a byte-level BPE tokenizer.json that moeserve writes in two places: make-model's
// trained tokenizer (tokenizer_files.cc) and a GGUF file's metadata written out
// (gguf_tokenizer.cc). ordered_json keeps keys in insertion order, so the files read like the
// ones Hugging Face writes.
#pragma once

#include <nlohmann/json.hpp>

namespace moeserve::tokenizer {

// The ByteLevel step after the pre-tokenizer's Split (which already split the text: no regex of
// its own), also the decoder and, without added BOS/EOS, the post-processor.
inline nlohmann::ordered_json ByteLevelStepJson() {
  nlohmann::ordered_json j;
  j["type"] = "ByteLevel";
  j["add_prefix_space"] = false;
  j["trim_offsets"] = false;
  j["use_regex"] = false;
  return j;
}

// The BPE model's settings before its "vocab" and "merges" (which the caller adds).
inline nlohmann::ordered_json BpeModelJson(bool ignore_merges) {
  nlohmann::ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = ignore_merges;
  return model;
}

}  // namespace moeserve::tokenizer
