// UTF-8 encoding of one code point, shared by the tokenizer and the Jinja interpreter (each has
// its own decoding helpers, with the error handling its format asks for).
#pragma once

#include <string>

namespace moeserve {

// Appends the UTF-8 encoding of `cp` (at most U+10FFFF; surrogates are encoded as they are).
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace moeserve
