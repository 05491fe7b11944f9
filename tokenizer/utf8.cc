#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstring>

namespace moeserve::tokenizer {
namespace {

// Length of the sequence lead byte b starts (0: b cannot start one).
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// The range the second byte of a sequence led by b must fall in: narrower than 80..BF after E0
// (no overlongs), ED (no surrogates), F0 (no overlongs) and F4 (nothing past U+10FFFF).
void SecondByteRange(uint8_t b, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b == 0xE0) *lo = 0xA0;
  if (b == 0xED) *hi = 0x9F;
  if (b == 0xF0) *lo = 0x90;
  if (b == 0xF4) *hi = 0x8F;
}

enum class SequenceKind { kValid, kInvalid, kTruncated };

// Classifies the sequence at s[i]: valid (*len = its length), invalid (*len = the length of the
// maximal subpart to replace by one U+FFFD), or truncated by the end of s (*len = what is there).
SequenceKind Classify(std::string_view s, size_t i, size_t* len) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  const int n = SequenceLength(b);
  if (n == 1) {
    *len = 1;
    return SequenceKind::kValid;
  }
  if (n == 0) {
    *len = 1;
    return SequenceKind::kInvalid;
  }
  uint8_t lo, hi;
  SecondByteRange(b, &lo, &hi);
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *len = k;
      return SequenceKind::kTruncated;
    }
    const uint8_t c = static_cast<uint8_t>(s[i + k]);
    if (c < lo || c > hi) {
      *len = k;
      return SequenceKind::kInvalid;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *len = n;
  return SequenceKind::kValid;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs dominate typical text; skip them eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t word;
      std::memcpy(&word, s.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t len;
    if (Classify(s, i, &len) != SequenceKind::kValid) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *i;
  const uint8_t b = p[0];
  if (b < 0x80) {
    *i += 1;
    return b;
  }
  if (b < 0xE0) {
    *i += 2;
    return (char32_t{b & 0x1Fu} << 6) | (p[1] & 0x3Fu);
  }
  if (b < 0xF0) {
    *i += 3;
    return (char32_t{b & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
  }
  *i += 4;
  return (char32_t{b & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
}

char32_t PreviousCodePoint(std::string_view s, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  *start = i;
  return NextCodePoint(s, &i);
}

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes, appended in one go
  while (i < bytes.size()) {
    size_t len;
    const SequenceKind kind = Classify(bytes, i, &len);
    if (kind == SequenceKind::kValid) {
      i += len;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    if (kind == SequenceKind::kTruncated && !final) return i;
    out->append(kReplacementChar);
    i += len;
    run = i;
  }
  out->append(bytes.data() + run, i - run);
  return i;
}

bool IsUnicodeWhiteSpace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
      (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189)) {
    return true;  // Other_Alphabetic symbols
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace moeserve::tokenizer
