// Feeds arbitrary bytes to the GGUF reader as a file: it must return a Status or a valid
// file whose every tensor lies inside the mapping — never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/scratch_file.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = moeserve::fuzz::WriteScratchFile("gguf_fuzz", data, size);
  if (path.empty()) return 0;
  auto file = moeserve::io::GgufFile::Open(path);
  if (file.ok()) moeserve::fuzz::TouchEveryByte((*file)->tensors());
  return 0;
}
