// GGUF files (llama.cpp's single-file format), versions 2 and 3, read over mmap.
//
// Layout, little-endian: magic "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata as (string key, u32 type, value); the tensor infos as (string name, u32 n_dims, u64
// ne[n_dims] -- ne[0] the innermost, fastest-varying dimension --, u32 ggml type, u64 offset);
// then, at the next multiple of general.alignment (default 32), the data area, each tensor at its
// offset from the data area's start. A string is a u64 length and that many bytes (no NUL). A
// value is one of GgufType; an array is a u32 element type, a u64 count and the elements.
//
// Every count, length and offset is checked against the bytes left in the file before it is
// used (so no allocation is larger than the file), arrays nest at most kMaxGgufArrayDepth deep,
// and every tensor must lie, aligned, inside the data area: a malformed file is a Status naming
// the file and the field, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace moeserve::io {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// Arrays of arrays are legal GGUF; deeper nesting than this is refused.
inline constexpr int kMaxGgufArrayDepth = 2;

// A metadata value: its type (and, for an array, its elements'), the value as JSON (numbers,
// booleans, strings; arrays as JSON arrays). Strings are kept as bytes (they need not be UTF-8):
// json's std::string holds them as they are.
struct GgufValue {
  GgufType type;
  GgufType element_type = GgufType::kUint8;  // arrays only
  nlohmann::json value;
};

// ggml's tensor types: block size (elements) and bytes per block; 0 bytes for a type this
// reader does not know (the file is refused, naming it).
struct GgmlTypeTraits {
  const char* name;
  int64_t block_size;
  int64_t block_bytes;
};
GgmlTypeTraits GgmlType(uint32_t type);

// The ggml types moeserve reads as weights: F32, F16, BF16 and the block formats of
// core/dtype.h (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); nullopt for the others.
std::optional<DType> DTypeOfGgmlType(uint32_t type);
// The inverse: the ggml type number of one of those dtypes.
uint32_t GgmlTypeOfDType(DType dtype);

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] innermost, as in the file (reverse of a row-major shape)
  uint32_t type;            // ggml type (GgmlType(type) for its name and block sizes)
  uint64_t offset;          // from the data area's start
  std::span<const std::byte> bytes;  // inside the mapping

  int64_t numel() const;
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* FindValue(std::string_view key) const;  // nullptr if absent
  // In file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* Find(std::string_view name) const;  // nullptr if absent
  // The whole file as mapped (read-only; the mapping starts on a page boundary).
  std::span<const std::byte> mapping() const {
    return {static_cast<const std::byte*>(map_), map_size_};
  }

 private:
  GgufFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace moeserve::io
