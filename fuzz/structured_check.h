// What the structured-output fuzz targets check on a compiled grammar: driven by fuzz bytes, a
// matcher over a small vocabulary (every single byte, and multi-byte tokens that cross JSON and
// UTF-8 boundaries) keeps the mask's promise — AcceptToken succeeds exactly for the tokens the
// mask allows — through accepts and rollbacks.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/matcher.h"
#include "structured/structured.h"
#include "structured/vocabulary.h"

namespace moeserve::fuzz {

// 256 single bytes, some longer tokens, EOS last.
inline std::shared_ptr<const structured::Vocabulary> SmallStructuredVocabulary() {
  static std::shared_ptr<const structured::Vocabulary> v = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"\":", "\",", "\"}", "{\"", "\": \"", "true", "null", "12", "-0.", "é",
                          "\xe6\x97\xa5\xe6", "\x9c\xac", "a\"", "],", "xyz", "  ", "\\u00"}) {
      tokens.push_back(t);
    }
    tokens.push_back("");
    const int32_t eos = static_cast<int32_t>(tokens.size() - 1);
    return structured::Vocabulary::Create(std::move(tokens), {eos}).value();
  }();
  return v;
}

// Walks the grammar with the bytes of `drive`: each byte picks an allowed token (or, when
// odd-numbered and a multiple of 7, rolls back), and probes one token against the mask.
inline void CheckMatcher(const std::shared_ptr<const structured::CompiledGrammar>& g,
                         std::string_view drive) {
  const structured::Vocabulary& v = g->vocabulary();
  structured::Matcher m(g);
  std::vector<uint32_t> mask(v.mask_words());
  std::vector<int32_t> allowed;
  for (size_t i = 0; i + 1 < drive.size() && i < 256; i += 2) {
    const uint8_t a = static_cast<uint8_t>(drive[i]), b = static_cast<uint8_t>(drive[i + 1]);
    m.FillNextTokenBitmask(mask);
    // The probe: any token, accepted exactly when allowed.
    const int32_t probe = (a * 256 + b) % v.size();
    const bool bit = mask[probe >> 5] >> (probe & 31) & 1;
    if (m.AcceptToken(probe) != bit) std::abort();
    if (bit && !m.Rollback(1)) std::abort();
    if (a % 7 == 1 && m.num_tokens() > 0) {
      if (!m.Rollback(1 + b % m.num_tokens())) std::abort();
      continue;
    }
    allowed.clear();
    for (int32_t id = 0; id < v.size(); ++id) {
      if (mask[id >> 5] >> (id & 31) & 1) allowed.push_back(id);
    }
    if (allowed.empty()) return;
    if (!m.AcceptToken(allowed[b % allowed.size()])) std::abort();
    if (m.IsFinished()) return;
  }
}

}  // namespace moeserve::fuzz
