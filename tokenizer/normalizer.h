// The Unicode normalizers of tokenizer.json (NFC, NFD, NFKC, NFKD, and Sequences of them), through
// utf8proc. Normalizing is skipped when a quick check proves the text already normalized, which it
// almost always is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::tokenizer {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// "NFC", "NFD", ... (the type names of tokenizer.json).
const char* NormalizationFormName(NormalizationForm form);

class Normalizer {
 public:
  Normalizer() = default;  // the identity (tokenizer.json "normalizer": null)
  // The forms applied one after the other.
  explicit Normalizer(std::vector<NormalizationForm> steps) : steps_(std::move(steps)) {}

  bool is_identity() const { return steps_.empty(); }

  // Normalizes valid UTF-8 `text`. Returns `text` itself when it is already normalized, else a view
  // of *scratch, which then holds the normalized text.
  Result<std::string_view> Normalize(std::string_view text, std::string* scratch) const;

 private:
  std::vector<NormalizationForm> steps_;
};

// True when `text` (valid UTF-8) is certainly unchanged by `form`; false means "maybe changed".
// Exposed for tests.
bool IsQuickNormalized(std::string_view text, NormalizationForm form);

}  // namespace moeserve::tokenizer
