// Safetensors checkpoints: reading over mmap (single file or sharded with
// model.safetensors.index.json) and writing.
//
// File format: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data area; offsets are relative to the data area.
// Every header is validated completely before any tensor is handed out: a malformed file is a
// Status naming the file and the tensor, never a crash or a read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace moeserve::io {

// One tensor of a checkpoint. `bytes` points into the mapped file and lives as long as the
// SafetensorsFile / SafetensorsCheckpoint that returned it.
struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // numel * DTypeSize(dtype) bytes
  std::string file;                  // path of the file that holds it

  int64_t numel() const;
  // A read-only view; only for compute dtypes (bf16, f16, f32, i8, i32).
  Tensor view() const;
};

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Tensors another reader found in a file it mapped (a GGUF file's, under the names and shapes
  // a model reads them by: model/gguf_checkpoint.h). `owner` keeps `mapping` -- the whole mapped
  // file, which every tensor's bytes lie in -- alive; names must be unique.
  static std::unique_ptr<SafetensorsFile> FromMapping(std::string path,
                                                      std::shared_ptr<const void> owner,
                                                      std::span<const std::byte> mapping,
                                                      std::vector<SafetensorsTensor> tensors);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In header order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;  // nullptr if absent
  // String values of "__metadata__" (other values are ignored).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // FromMapping's owner of the mapping (tensors used in place share it); null for Open's files.
  const std::shared_ptr<const void>& owner() const { return owner_; }
  // The whole file as mapped (read-only; the mapping starts on a page boundary).
  std::span<const std::byte> mapping() const {
    return owner_ ? borrowed_mapping_
                  : std::span<const std::byte>{static_cast<const std::byte*>(map_), map_size_};
  }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;  // what this file mapped itself (Open), unmapped with it
  size_t map_size_ = 0;
  std::shared_ptr<const void> owner_;  // FromMapping: the mapping's owner
  std::span<const std::byte> borrowed_mapping_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model folder's weights: model.safetensors.index.json with its shards if present, else
// model.safetensors.
class SafetensorsCheckpoint {
 public:
  static Result<SafetensorsCheckpoint> Open(const std::string& dir);
  // A checkpoint of the one file (SafetensorsFile::FromMapping's).
  static SafetensorsCheckpoint FromFile(std::unique_ptr<SafetensorsFile> file);

  const SafetensorsTensor* Find(std::string_view name) const;  // nullptr if absent
  // Every tensor of every shard, shard by shard in header order.
  std::vector<const SafetensorsTensor*> tensors() const;
  size_t num_files() const { return files_.size(); }
  // The shard files, in shard order.
  std::vector<const SafetensorsFile*> files() const;
  uint64_t total_bytes() const;  // data bytes of all tensors

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name_;
};

// ---- Writing ----

struct SafetensorsTensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Produces the bytes of tensor `index` (of the spec list) into `out` (exactly its size).
using SafetensorsFill = std::function<void(size_t index, std::span<std::byte> out)>;

// Writes one file holding `tensors` in the given order; fill is called once per tensor, in order,
// so that large checkpoints stream through a buffer of one tensor. The header is padded with
// spaces to a multiple of 8 bytes, as Hugging Face's writer does.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorSpec>& tensors,
                        const SafetensorsFill& fill,
                        const std::map<std::string, std::string>& metadata = {});

// Writes a model folder's weights: `dir`/model.safetensors when everything fits in
// max_shard_bytes, else shards model-00001-of-0000N.safetensors (each at most max_shard_bytes,
// or one tensor when a tensor alone is larger) plus model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {name: file}}). fill indexes `tensors`.
Status WriteSafetensorsCheckpoint(const std::string& dir,
                                  const std::vector<SafetensorsTensorSpec>& tensors,
                                  const SafetensorsFill& fill, uint64_t max_shard_bytes);

}  // namespace moeserve::io
