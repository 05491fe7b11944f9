// A whole file mapped read-only: the safetensors and GGUF readers hand out tensors that point
// into it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve::io {

struct FileMapping {
  void* data = nullptr;
  uint64_t size = 0;
};

// Maps the regular file at `path` whole (release with munmap(data, size)). A missing file is
// NotFound; a file shorter than min_size bytes (at least 1: mmap refuses 0) is InvalidArgument
// "PATH: file is N bytes, shorter than <too_short>".
Result<FileMapping> MapReadOnly(const std::string& path, uint64_t min_size,
                                std::string_view too_short);

// strerror's text for errno value err (thread-safe).
std::string ErrnoMessage(int err);

}  // namespace moeserve::io
