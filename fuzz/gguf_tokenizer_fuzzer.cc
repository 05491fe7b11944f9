// Feeds arbitrary bytes as a GGUF file to the tokenizer of its metadata
// (tokenizer/gguf_tokenizer.h): a Status, or a tokenizer that encodes and decodes a fixed text
// and a chat template (when the file has one that parses) that renders a fixed conversation
// (to text or a Status) — never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/scratch_file.h"
#include "io/gguf.h"
#include "tokenizer/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = moeserve::fuzz::WriteScratchFile("gguf_tokenizer_fuzz", data, size);
  if (path.empty()) return 0;
  auto file = moeserve::io::GgufFile::Open(path);
  if (!file.ok()) return 0;
  auto loaded = moeserve::tokenizer::LoadGgufTokenizer(**file);
  if (!loaded.ok()) return 0;
  auto ids = loaded->tokenizer->Encode("Hello, world! 12345 <|im_start|>héllo\n\n  x 日本", true);
  if (ids.ok()) (void)loaded->tokenizer->Decode(*ids, true);
  if (loaded->chat_template.has_value()) {
    (void)loaded->chat_template->Render(
        {.messages_json = R"([{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}])",
         .add_generation_prompt = true});
  }
  return 0;
}
