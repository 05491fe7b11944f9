// Feeds arbitrary bytes to the GGUF reader as a file: it must return a Status or a valid
// file whose every tensor lies inside the mapping — never crash or read out of bounds.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "io/gguf.h"

namespace {

// The reader maps files, so each input goes through one scratch file, removed at exit.
struct ScratchFile {
  std::string path = "/tmp/moeserve_gguf_fuzz_" + std::to_string(getpid());
  ~ScratchFile() { unlink(path.c_str()); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchFile scratch;
  const std::string& path = scratch.path;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto file = moeserve::io::GgufFile::Open(path);
  if (file.ok()) {
    uint64_t sum = 0;
    for (const auto& t : (*file)->tensors()) {
      for (std::byte b : t.bytes) sum += static_cast<uint8_t>(b);  // touches every byte
    }
    if (sum == 1) std::fprintf(stderr, " ");
  }
  return 0;
}
