// The byte-level alphabet of GPT-2 style BPE (Hugging Face ByteLevel pre-tokenizer/decoder):
// each of the 256 byte values is mapped to one printable Unicode code point, so that any byte
// string becomes a string of visible characters. Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ')
// map to themselves; the other 68 map to U+0100, U+0101, ... in byte order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

// The code point byte b maps to.
char32_t ByteToCodePoint(uint8_t b);
// The inverse; nullopt for code points outside the alphabet.
std::optional<uint8_t> CodePointToByte(char32_t cp);
// Maps every byte of `bytes` to its code point, UTF-8 encoded.
std::string BytesToByteLevel(std::string_view bytes);
// The inverse; nullopt if `text` is not valid UTF-8 or holds a code point outside the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view text);

}  // namespace moeserve::tokenizer
