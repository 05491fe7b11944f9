#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

// The 68 non-printable bytes take U+0100 onwards, so the alphabet ends below this code point.
constexpr char32_t kAlphabetEnd = 0x100 + 68;

// Bytes GPT-2 considers printable (they stand for themselves): '!'..'~', '¡'..'¬', '®'..'ÿ'.
// Space, controls, DEL, 0x80..0xA0 and the soft hyphen 0xAD are not, because BPE vocabularies
// must not hold invisible or whitespace characters.
constexpr bool IsPrintable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, kAlphabetEnd> cp_to_byte{};  // -1: not in the alphabet
};

constexpr Tables BuildTables() {
  Tables t;
  for (auto& b : t.cp_to_byte) b = -1;
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = IsPrintable(b) ? static_cast<char32_t>(b) : next++;
    t.byte_to_cp[b] = cp;
    t.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return t;
}

// Built at compile time, so lookups need no initialization guard.
constexpr Tables kTables = BuildTables();
static_assert(kTables.byte_to_cp[0xFF] == 0xFF && kTables.byte_to_cp[0xAD] == kAlphabetEnd - 1);

// Decodes the code point starting at text[*pos] and advances *pos past it. Strict (RFC 3629):
// overlong forms, surrogates, code points above U+10FFFF, stray continuation bytes and truncated
// sequences are rejected, so that every accepted string has exactly one byte representation.
std::optional<char32_t> DecodeUtf8(std::string_view text, size_t* pos) {
  const size_t i = *pos;
  const auto lead = static_cast<uint8_t>(text[i]);
  if (lead < 0x80) {
    *pos = i + 1;
    return lead;
  }
  int extra;
  char32_t cp;
  char32_t min;
  if (lead >= 0xC2 && lead <= 0xDF) {  // 0xC0 and 0xC1 could only start overlong forms
    extra = 1;
    cp = lead & 0x1F;
    min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    extra = 2;
    cp = lead & 0x0F;
    min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {  // 0xF5.. would start code points > U+10FFFF
    extra = 3;
    cp = lead & 0x07;
    min = 0x10000;
  } else {
    return std::nullopt;
  }
  if (text.size() - i <= static_cast<size_t>(extra)) return std::nullopt;
  for (int k = 1; k <= extra; ++k) {
    const auto c = static_cast<uint8_t>(text[i + k]);
    if ((c & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
  *pos = i + 1 + extra;
  return cp;
}

}  // namespace

char32_t ByteToCodePoint(uint8_t b) { return kTables.byte_to_cp[b]; }

std::optional<uint8_t> CodePointToByte(char32_t cp) {
  if (cp >= kAlphabetEnd || kTables.cp_to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(kTables.cp_to_byte[cp]);
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);  // every code point of the alphabet takes 1 or 2 UTF-8 bytes
  for (const char c : bytes) AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> ByteLevelToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const std::optional<char32_t> cp = DecodeUtf8(text, &pos);
    if (!cp) return std::nullopt;
    const std::optional<uint8_t> b = CodePointToByte(*cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace moeserve::tokenizer
