// Writing safetensors files and sharded checkpoints. Files are written under a temporary name and
// renamed into place, so that a crash or a full disk never leaves a truncated file under the real
// name (which the reader would reject, or worse, an old index would point into).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";
// Shard names carry 5 digits, as Hugging Face's do.
constexpr size_t kMaxShards = 99999;

// Validates the specs (the reader would reject what this refuses) and returns each tensor's byte
// count. `where` names the file or folder being written, for messages.
Result<std::vector<uint64_t>> SpecSizes(const std::string& where,
                                        const std::vector<SafetensorsTensorSpec>& specs) {
  std::vector<uint64_t> sizes;
  sizes.reserve(specs.size());
  std::set<std::string_view> names;
  uint64_t total = 0;
  for (const SafetensorsTensorSpec& spec : specs) {
    if (spec.name.empty()) return InvalidArgument("{}: a tensor has an empty name", where);
    if (spec.name == "__metadata__") {
      return InvalidArgument("{}: \"__metadata__\" is reserved, not a tensor name", where);
    }
    if (!names.insert(spec.name).second) {
      return InvalidArgument("{}: duplicate tensor name \"{}\"", where, spec.name);
    }
    if (spec.shape.size() > kMaxTensorRank) {
      return InvalidArgument("{}: tensor \"{}\": rank {} exceeds the supported {}", where,
                             spec.name, spec.shape.size(), kMaxTensorRank);
    }
    int64_t numel = 0;
    uint64_t bytes = 0;
    if (!CheckedNumel(spec.shape, &numel) ||
        __builtin_mul_overflow(static_cast<uint64_t>(numel), DTypeSize(spec.dtype), &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return InvalidArgument("{}: tensor \"{}\": invalid shape (negative or overflowing)", where,
                             spec.name);
    }
    sizes.push_back(bytes);
  }
  return sizes;
}

// A JSON string literal, or an error when `s` is not valid UTF-8 (the reader would reject it).
Result<std::string> JsonString(const std::string& where, const std::string& s) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    return InvalidArgument("{}: \"{}\" is not valid UTF-8", where,
                           json(s).dump(-1, ' ', false, json::error_handler_t::replace));
  }
}

// The header JSON with tensors in the given order and contiguous offsets, padded with spaces to a
// multiple of 8 bytes so that the data area starts 8-aligned.
Result<std::string> BuildHeader(const std::string& path,
                                const std::vector<SafetensorsTensorSpec>& specs,
                                const std::vector<uint64_t>& sizes,
                                const std::map<std::string, std::string>& metadata) {
  // Built by hand rather than as a json object: nlohmann's object sorts keys (losing the order)
  // and its ordered variant inserts in quadratic time.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      ASSIGN_OR_RETURN(const std::string key_json, JsonString(path, key));
      ASSIGN_OR_RETURN(const std::string value_json, JsonString(path, value));
      header += key_json + ":" + value_json;
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (header.size() > 1) header += ',';
    ASSIGN_OR_RETURN(const std::string name_json, JsonString(path, specs[i].name));
    header += fmt::format(R"({}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", name_json,
                          SafetensorsDTypeName(specs[i].dtype), fmt::join(specs[i].shape, ","),
                          offset, offset + sizes[i]);
    offset += sizes[i];
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// Creates `path` + ".tmp", lets `body` write it, flushes it to disk and renames it to `path`.
// On any failure the temporary file is removed and `path` is untouched.
Status WriteFileAtomically(const std::string& path,
                           const std::function<Status(std::FILE*, const std::string&)>& body) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError("{}: cannot open for writing: {}", tmp, ErrnoMessage(errno));
  Status status;
  try {
    status = body(f, tmp);
  } catch (...) {
    // The fill callback is the caller's code; its exception is its own, but not our litter.
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (status.ok() && std::fflush(f) != 0) {
    status = IoError("{}: write failed: {}", tmp, ErrnoMessage(errno));
  }
  // Without fsync a power loss after the rename could leave the real name with missing data.
  if (status.ok() && ::fsync(::fileno(f)) != 0) {
    status = IoError("{}: fsync failed: {}", tmp, ErrnoMessage(errno));
  }
  if (std::fclose(f) != 0 && status.ok()) {
    status = IoError("{}: close failed: {}", tmp, ErrnoMessage(errno));
  }
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = IoError("cannot rename {} to {}: {}", tmp, path, ErrnoMessage(errno));
  }
  if (!status.ok()) std::remove(tmp.c_str());
  return status;
}

Status WriteAll(std::FILE* f, const std::string& tmp, const void* data, size_t size) {
  if (size != 0 && std::fwrite(data, 1, size, f) != size) {
    return IoError("{}: write failed: {}", tmp, ErrnoMessage(errno));
  }
  return OkStatus();
}

// WriteSafetensors with the sizes already validated.
Status WriteFile(const std::string& path, const std::vector<SafetensorsTensorSpec>& specs,
                 const std::vector<uint64_t>& sizes, const SafetensorsFill& fill,
                 const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(const std::string header, BuildHeader(path, specs, sizes, metadata));
  return WriteFileAtomically(path, [&](std::FILE* f, const std::string& tmp) -> Status {
    unsigned char length[8];
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
    RETURN_IF_ERROR(WriteAll(f, tmp, length, sizeof(length)));
    RETURN_IF_ERROR(WriteAll(f, tmp, header.data(), header.size()));
    // One tensor's worth of memory at a time: checkpoints are larger than RAM.
    std::vector<std::byte> buffer;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (sizes[i] > std::numeric_limits<size_t>::max()) {
        return InvalidArgument("{}: tensor \"{}\" is too large for memory", path, specs[i].name);
      }
      buffer.resize(static_cast<size_t>(sizes[i]));
      fill(i, std::span<std::byte>(buffer));
      RETURN_IF_ERROR(WriteAll(f, tmp, buffer.data(), buffer.size()));
    }
    return OkStatus();
  });
}

}  // namespace

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorSpec>& tensors,
                        const SafetensorsFill& fill,
                        const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes, SpecSizes(path, tensors));
  return WriteFile(path, tensors, sizes, fill, metadata);
}

Status WriteSafetensorsCheckpoint(const std::string& dir,
                                  const std::vector<SafetensorsTensorSpec>& tensors,
                                  const SafetensorsFill& fill, uint64_t max_shard_bytes) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes, SpecSizes(dir, tensors));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("{}: cannot create directory: {}", dir, ec.message());
  const std::string index_path = (fs::path(dir) / kIndexName).string();

  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;  // SpecSizes checked that the sum fits

  if (total <= max_shard_bytes) {
    RETURN_IF_ERROR(WriteFile((fs::path(dir) / kSingleName).string(), tensors, sizes, fill, {}));
    // The reader prefers an index over model.safetensors: a stale one from an earlier sharded
    // write would hide the file just written.
    fs::remove(index_path, ec);
    if (ec) return IoError("{}: cannot remove stale index: {}", index_path, ec.message());
    return OkStatus();
  }

  // Greedy packing in the given order: a shard closes when the next tensor would overflow it. A
  // tensor larger than max_shard_bytes gets a shard of its own.
  std::vector<std::vector<size_t>> shards;
  uint64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() ||
        (!shards.back().empty() && (used > max_shard_bytes || sizes[i] > max_shard_bytes - used))) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(i);
    used += sizes[i];
  }
  if (shards.size() > kMaxShards) {
    return InvalidArgument("{}: {} shards exceed the 5-digit shard naming; raise max_shard_bytes",
                           dir, shards.size());
  }

  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file_name =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<SafetensorsTensorSpec> specs;
    std::vector<uint64_t> shard_sizes;
    for (size_t i : shards[s]) {
      specs.push_back(tensors[i]);
      shard_sizes.push_back(sizes[i]);
      weight_map[tensors[i].name] = file_name;
    }
    const std::vector<size_t>& members = shards[s];
    RETURN_IF_ERROR(
        WriteFile((fs::path(dir) / file_name).string(), specs, shard_sizes,
                  [&](size_t local, std::span<std::byte> out) { fill(members[local], out); }, {}));
  }

  // Written last: until it exists, a crash leaves no index pointing at missing shards.
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const json::exception& e) {
    // Unreachable in practice: names were checked as UTF-8 when the shard headers were built.
    return InvalidArgument("{}: cannot serialize index: {}", index_path, e.what());
  }
  return WriteFileAtomically(index_path, [&](std::FILE* f, const std::string& tmp) {
    return WriteAll(f, tmp, text.data(), text.size());
  });
}

}  // namespace moeserve::io
