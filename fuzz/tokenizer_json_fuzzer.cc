// Loads arbitrary bytes as tokenizer.json: a Status or a tokenizer that can encode and decode.
#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tok = moeserve::tokenizer::Tokenizer::FromJson(json);
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 12 <|im_start|>héllo\n\n  x");
  if (ids.ok()) (void)(*tok)->Decode(*ids);
  return 0;
}
