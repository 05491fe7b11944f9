// For fuzz targets of readers that map files: each input goes through one scratch file per
// process, removed at exit.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace moeserve::fuzz {

// Writes data[0, size) to this process's scratch file named after `name`; returns its path, or
// "" when it cannot be written.
inline std::string WriteScratchFile(const char* name, const uint8_t* data, size_t size) {
  struct ScratchFile {
    std::string path;
    ~ScratchFile() { unlink(path.c_str()); }
  };
  static const ScratchFile scratch{std::string("/tmp/moeserve_") + name + "_" +
                                   std::to_string(getpid())};
  std::FILE* f = std::fopen(scratch.path.c_str(), "wb");
  if (f == nullptr) return "";
  const bool written = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && written ? scratch.path : "";
}

// Sums every byte of every tensor (so that a sanitizer sees each read) and keeps the sum alive.
template <typename Tensors>
void TouchEveryByte(const Tensors& tensors) {
  uint64_t sum = 0;
  for (const auto& t : tensors) {
    for (std::byte b : t.bytes) sum += static_cast<uint8_t>(b);
  }
  if (sum == 1) std::fprintf(stderr, " ");
}

}  // namespace moeserve::fuzz
