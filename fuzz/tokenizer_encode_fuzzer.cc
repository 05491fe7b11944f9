// Encodes arbitrary bytes with the real Qwen3 tokenizer: invalid UTF-8 is an error, valid text
// encodes, and decoding the ids gives back the NFC form of the text (Qwen3 normalizes with NFC;
// checked by re-encoding the decoded text to the same ids). Never a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

using moeserve::tokenizer::Tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer* tok = [] {
    auto loaded = Tokenizer::LoadFromDir(MOESERVE_TESTDATA_DIR + "/qwen3-tokenizer");
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      std::abort();
    }
    return loaded->release();
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(text);
  if (!ids.ok()) return 0;
  const std::string decoded = tok->Decode(*ids);
  auto again = tok->Encode(decoded);
  if (!again.ok() || *again != *ids) {
    std::fprintf(stderr, "decode(encode(x)) does not re-encode to the same ids\n");
    std::abort();
  }
  return 0;
}
