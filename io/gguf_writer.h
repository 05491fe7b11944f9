// Writing GGUF files (the layout io/gguf.h reads): what tests and make-model use to turn a model
// into the single file llama.cpp users hold. Metadata values are scalars, strings or arrays of
// them (no nested arrays); tensors are given as their bytes in the file's layout. The file is
// written under a temporary name and renamed into place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf.h"

namespace moeserve::io {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  // Metadata in the order set (a key set twice keeps its first place and its last value).
  void Set(const std::string& key, GgufValue value);
  void SetString(const std::string& key, const std::string& value);
  void SetU32(const std::string& key, uint32_t value);
  void SetF32(const std::string& key, float value);
  void SetBool(const std::string& key, bool value);
  void SetArray(const std::string& key, GgufType element_type, nlohmann::json values);

  // A tensor of ggml type `type` with dimensions `ne` (ne[0] innermost, the reverse of a
  // row-major shape) and exactly the bytes GgmlType(type) gives for them.
  void AddTensor(const std::string& name, std::vector<int64_t> ne, uint32_t type,
                 std::string bytes);

  // Drops the tensor of that name, if any (tests build malformed files from well-formed ones).
  void RemoveTensor(const std::string& name);

  // Fails on a value whose JSON does not fit its type, a tensor whose bytes do not match its
  // shape and type, or an I/O error, naming which.
  Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    std::string bytes;
  };
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace moeserve::io
