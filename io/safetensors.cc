#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "core/json.h"
#include "io/mapped_file.h"
#include "core/check.h"

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Hugging Face's reader refuses headers above 100 MB. A larger claim is corrupt or hostile, and
// parsing it would cost memory in proportion to the claim.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
// An index lists one short line per tensor; even DeepSeek-sized models stay far below this.
constexpr uint64_t kMaxIndexBytes = uint64_t{100} << 20;
constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

// "BF16, F16, ..." for the message of an unknown dtype.
std::string KnownDTypeList() {
  std::string list;
  for (int i = 0; i <= static_cast<int>(DType::kF8E5M2); ++i) {
    if (!list.empty()) list += ", ";
    list += SafetensorsDTypeName(static_cast<DType>(i));
  }
  return list;
}

// A short rendering of an offending JSON value for messages: enough to recognize it, bounded so
// that a hostile header cannot blow up the message.
std::string Brief(const json& value) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 40;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// Reads a JSON integer that must be a non-negative int64 (shape dimensions).
enum class IntKind { kOk, kNegative, kTooLarge, kNotInteger };
IntKind ReadNonNegativeInt64(const json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return IntKind::kTooLarge;
    *out = static_cast<int64_t>(u);
    return IntKind::kOk;
  }
  // nlohmann stores non-negative integers as unsigned, so a signed integer here is negative.
  if (value.is_number_integer()) return IntKind::kNegative;
  return IntKind::kNotInteger;
}

// Parses JSON text; `on_key(depth, key)` sees every object key of depth 1 (the top-level object)
// and 2, in order of appearance. That is where the header order and duplicate keys are still
// visible: nlohmann's object sorts its keys and silently keeps the last of duplicates.
// Exceptions stay inside: every failure is a Status.
Status ParseJson(const std::string& path, const char* what, const char* begin, const char* end,
                 const std::function<void(int, const std::string&)>& on_key, json* out) {
  if (Status s = CheckJsonDepth({begin, static_cast<size_t>(end - begin)}, what); !s.ok()) {
    return s.WithContext(path);
  }
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth <= 2) {
      if (const auto* key = parsed.get_ptr<const std::string*>()) on_key(depth, *key);
    }
    return true;
  };
  try {
    *out = json::parse(begin, end, callback, /*allow_exceptions=*/true);
  } catch (const json::parse_error& e) {
    // The byte position rather than e.what(): what() quotes raw file bytes, which may be binary.
    return InvalidArgument("{}: {} is not valid JSON / UTF-8 (error at byte {} of {})", path, what,
                           e.byte, end - begin);
  } catch (const std::exception& e) {
    return InvalidArgument("{}: cannot parse {}: {}", path, what, e.what());
  }
  return OkStatus();
}

struct Range {
  uint64_t begin;
  uint64_t end;
  size_t tensor;
};

// ---- SafetensorsFile::Open's phases, in order ----

// The header length: u64 little-endian, whatever the host's byte order.
Result<uint64_t> ReadHeaderLength(const std::string& path, const std::byte* base,
                                  uint64_t file_size) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(base[i]);
  if (header_len == 0) return InvalidArgument("{}: header length is 0", path);
  if (header_len > file_size - 8) {
    return InvalidArgument("{}: header length {} runs past the end of the file ({} bytes)", path,
                           header_len, file_size);
  }
  if (header_len > kMaxHeaderBytes) {
    return InvalidArgument("{}: header length {} exceeds the limit of {} bytes", path, header_len,
                           kMaxHeaderBytes);
  }
  return header_len;
}

// The header's JSON object and its names in header order.
struct Header {
  json object;
  std::vector<std::string> names;
};

// Parses the header, keeping the header order and catching duplicate names.
Result<Header> ParseHeader(const std::string& path, const char* text, uint64_t header_len) {
  Header header;
  std::unordered_set<std::string> seen;
  std::optional<std::string> duplicate;
  RETURN_IF_ERROR(ParseJson(
      path, "header", text, text + header_len,
      [&](int depth, const std::string& key) {
        if (depth != 1) return;
        if (seen.insert(key).second) {
          header.names.push_back(key);
        } else if (!duplicate) {
          duplicate = key;
        }
      },
      &header.object));
  if (!header.object.is_object()) {
    return InvalidArgument("{}: header is a JSON {}, not a JSON object", path,
                           header.object.type_name());
  }
  if (duplicate) return InvalidArgument("{}: duplicate tensor name \"{}\"", path, *duplicate);
  return header;
}

// "__metadata__": only string values are metadata by the format; others are tolerated and
// ignored.
Status ReadMetadata(const std::string& path, const json& entry,
                    std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) {
    return InvalidArgument("{}: \"__metadata__\" is a JSON {}, not an object", path,
                           entry.type_name());
  }
  for (const auto& [key, value] : entry.items()) {
    if (const auto* s = value.get_ptr<const std::string*>()) (*metadata)[key] = *s;
  }
  return OkStatus();
}

// Every message about a tensor's entry names the file and the tensor.
struct BadEntry {
  const std::string& path;
  const std::string& name;
  Status operator()(const std::string& why) const {
    return InvalidArgument("{}: tensor \"{}\": {}", path, name, why);
  }
};

// A tensor's entry as read so far: {"dtype", "shape", "data_offsets"}.
struct TensorEntry {
  std::string dtype_name;  // as the header spells it
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;          // numel * DTypeSize(dtype)
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data area
};

Status ReadDType(const json& entry, const BadEntry& bad, TensorEntry* e) {
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return bad("missing \"dtype\"");
  const auto* dtype_name = dtype_it->get_ptr<const std::string*>();
  if (dtype_name == nullptr) {
    return bad(fmt::format("\"dtype\" is a JSON {}, not a string", dtype_it->type_name()));
  }
  const std::optional<DType> dtype = ParseSafetensorsDType(*dtype_name);
  if (!dtype) {
    return bad(fmt::format("unknown dtype \"{}\" (known: {})", *dtype_name, KnownDTypeList()));
  }
  e->dtype_name = *dtype_name;
  e->dtype = *dtype;
  return OkStatus();
}

Status ReadShape(const json& entry, const BadEntry& bad, TensorEntry* e) {
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return bad("missing \"shape\"");
  if (!shape_it->is_array()) {
    return bad(fmt::format("\"shape\" is a JSON {}, not an array", shape_it->type_name()));
  }
  // Tensor views hold at most kMaxTensorRank dimensions; a deeper tensor could not be viewed.
  if (shape_it->size() > kMaxTensorRank) {
    return bad(fmt::format("shape has rank {}, more than the supported {}", shape_it->size(),
                           kMaxTensorRank));
  }
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const json& d = (*shape_it)[i];
    int64_t dim = 0;
    switch (ReadNonNegativeInt64(d, &dim)) {
      case IntKind::kOk:
        break;
      case IntKind::kNegative:
        return bad(fmt::format("shape dimension {} is negative ({})", i, Brief(d)));
      case IntKind::kTooLarge:
        return bad(fmt::format("shape dimension {} is too large ({})", i, Brief(d)));
      case IntKind::kNotInteger:
        return bad(fmt::format("shape dimension {} is not an integer ({})", i, Brief(d)));
    }
    e->shape.push_back(dim);
  }
  return OkStatus();
}

// The tensor's byte count, and a shape whose strides fit int64.
Status CountBytes(const BadEntry& bad, TensorEntry* e) {
  int64_t numel = 0;
  // The product of the non-zero dimensions bounds the strides of a view; it must fit even when
  // a zero dimension makes the tensor empty, or [0, 2^40, 2^40] would overflow in view().
  std::vector<int64_t> nonzero;
  for (int64_t d : e->shape) {
    if (d != 0) nonzero.push_back(d);
  }
  int64_t nonzero_product = 0;
  if (!CheckedNumel(e->shape, &numel) || !CheckedNumel(nonzero, &nonzero_product)) {
    return bad(fmt::format("shape [{}] overflows int64", fmt::join(e->shape, ", ")));
  }
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), DTypeSize(e->dtype), &e->nbytes)) {
    return bad(fmt::format("shape [{}] of {} overflows the byte count", fmt::join(e->shape, ", "),
                           e->dtype_name));
  }
  return OkStatus();
}

// "data_offsets": exactly the tensor's bytes, inside the data area (data_size bytes).
Status ReadDataOffsets(const json& entry, uint64_t data_size, const BadEntry& bad, TensorEntry* e) {
  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return bad("missing \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return bad(fmt::format("\"data_offsets\" must be two non-negative integers, got {}",
                           Brief(*offsets_it)));
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) {
    return bad(fmt::format("data_offsets begin {} is after end {}", begin, end));
  }
  if (end - begin != e->nbytes) {
    return bad(fmt::format("data_offsets [{}, {}) hold {} bytes, but {} [{}] needs {} bytes",
                           begin, end, end - begin, e->dtype_name, fmt::join(e->shape, ", "),
                           e->nbytes));
  }
  if (end > data_size) {
    return bad(fmt::format("data_offsets end {} is past the end of the data area ({} bytes)", end,
                           data_size));
  }
  e->begin = begin;
  e->end = end;
  return OkStatus();
}

// Validates the entry of tensor `name`; data_size: bytes of the data area.
Result<TensorEntry> ParseTensorEntry(const std::string& path, const std::string& name,
                                     const json& entry, uint64_t data_size) {
  const BadEntry bad{path, name};
  if (name.empty()) return InvalidArgument("{}: a tensor has an empty name", path);
  if (!entry.is_object()) {
    return bad(fmt::format("entry is a JSON {}, not an object", entry.type_name()));
  }
  TensorEntry e;
  RETURN_IF_ERROR(ReadDType(entry, bad, &e));
  RETURN_IF_ERROR(ReadShape(entry, bad, &e));
  RETURN_IF_ERROR(CountBytes(bad, &e));
  RETURN_IF_ERROR(ReadDataOffsets(entry, data_size, bad, &e));
  return e;
}

// No two tensors may share bytes. Holes are tolerated; empty tensors occupy nothing (and have no
// range).
Status CheckNoOverlaps(const std::string& path, std::vector<Range> ranges,
                       const std::vector<SafetensorsTensor>& tensors) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    // Sorted by begin and free of overlaps so far, so the previous range ends last.
    const Range& prev = ranges[i - 1];
    const Range& cur = ranges[i];
    if (cur.begin < prev.end) {
      return InvalidArgument("{}: tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap", path,
                             tensors[prev.tensor].name, prev.begin, prev.end,
                             tensors[cur.tensor].name, cur.begin, cur.end);
    }
  }
  return OkStatus();
}

}  // namespace

// ---- SafetensorsTensor ----

int64_t SafetensorsTensor::numel() const {
  int64_t n = 0;
  CHECK(CheckedNumel(shape, &n)) << "tensor " << name << " has an invalid shape";
  return n;
}

Tensor SafetensorsTensor::view() const {
  CHECK(IsComputeDType(dtype)) << "tensor " << name << " has dtype " << DTypeName(dtype)
                               << ", which kernels do not compute with";
  // The mapping is PROT_READ: writing through this view would fault, which is the point.
  return Tensor(const_cast<std::byte*>(bytes.data()), dtype, shape);
}

// ---- SafetensorsFile ----

std::unique_ptr<SafetensorsFile> SafetensorsFile::FromMapping(
    std::string path, std::shared_ptr<const void> owner, std::span<const std::byte> mapping,
    std::vector<SafetensorsTensor> tensors) {
  CHECK(owner != nullptr);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(path);
  f->owner_ = std::move(owner);
  f->borrowed_mapping_ = mapping;
  f->tensors_ = std::move(tensors);
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    const SafetensorsTensor& t = f->tensors_[i];
    CHECK(t.bytes.empty() || (t.bytes.data() >= mapping.data() &&
                              t.bytes.data() + t.bytes.size() <= mapping.data() + mapping.size()))
        << t.name << " lies outside the mapping";
    CHECK(f->index_.emplace(t.name, i).second) << "duplicate tensor " << t.name;
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  ASSIGN_OR_RETURN(const FileMapping map, MapReadOnly(path, 8, "the 8-byte header length"));
  file->map_ = map.data;  // from here on the destructor unmaps, also on every error return
  file->map_size_ = map.size;
  const auto* base = static_cast<const std::byte*>(map.data);
  ASSIGN_OR_RETURN(const uint64_t header_len, ReadHeaderLength(path, base, map.size));
  const uint64_t data_size = map.size - 8 - header_len;
  const std::byte* data = base + 8 + header_len;
  ASSIGN_OR_RETURN(const Header header,
                   ParseHeader(path, reinterpret_cast<const char*>(base + 8), header_len));

  std::vector<SafetensorsTensor>& tensors = file->tensors_;
  std::vector<Range> ranges;
  tensors.reserve(header.names.size());
  for (const std::string& name : header.names) {
    const json& entry = *header.object.find(name);
    if (name == "__metadata__") {
      RETURN_IF_ERROR(ReadMetadata(path, entry, &file->metadata_));
      continue;
    }
    ASSIGN_OR_RETURN(TensorEntry e, ParseTensorEntry(path, name, entry, data_size));
    if (e.begin != e.end) ranges.push_back({e.begin, e.end, tensors.size()});
    SafetensorsTensor& t = tensors.emplace_back();
    t.name = name;
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.bytes = std::span<const std::byte>(data + e.begin, static_cast<size_t>(e.nbytes));
    t.file = path;
  }
  RETURN_IF_ERROR(CheckNoOverlaps(path, std::move(ranges), tensors));

  for (size_t i = 0; i < tensors.size(); ++i) file->index_.emplace(tensors[i].name, i);
  return file;
}

// ---- SafetensorsCheckpoint ----

namespace {

// Reads a whole small file (the index) into a string.
Status ReadSmallFile(const std::string& path, uint64_t max_bytes, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT) return NotFound("{}: no such file", path);
    return IoError("{}: cannot open: {}", path, ErrnoMessage(err));
  }
  out->clear();
  char buf[1 << 16];
  Status status;
  while (true) {
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    out->append(buf, n);
    if (out->size() > max_bytes) {
      status = InvalidArgument("{}: larger than the limit of {} bytes", path, max_bytes);
      break;
    }
    if (n < sizeof(buf)) {
      if (std::ferror(f)) status = IoError("{}: read failed: {}", path, ErrnoMessage(errno));
      break;
    }
  }
  std::fclose(f);
  return status;
}

// Whether `path` exists; an error other than "does not exist" (a permission problem on the way)
// is reported rather than mistaken for absence.
Result<bool> Exists(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) return false;
  if (ec) return IoError("{}: cannot stat: {}", path, ec.message());
  return true;
}

bool IsSafeShardName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find("..") == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::Open(const std::string& dir) {
  std::error_code ec;
  const fs::file_status dir_status = fs::status(dir, ec);
  if (dir_status.type() == fs::file_type::not_found) {
    return NotFound("{}: no such directory", dir);
  }
  if (ec) return IoError("{}: cannot stat: {}", dir, ec.message());
  if (!fs::is_directory(dir_status)) return InvalidArgument("{}: not a directory", dir);

  const std::string index_path = (fs::path(dir) / kIndexName).string();
  const std::string single_path = (fs::path(dir) / kSingleName).string();
  SafetensorsCheckpoint checkpoint;
  ASSIGN_OR_RETURN(const bool has_index, Exists(index_path));
  ASSIGN_OR_RETURN(const bool has_single, Exists(single_path));

  if (has_index) {
    std::string text;
    RETURN_IF_ERROR(ReadSmallFile(index_path, kMaxIndexBytes, &text));
    // Duplicate names in weight_map would silently lose all but one mapping.
    std::string top_key;
    std::unordered_set<std::string> top_seen, mapped_seen;
    std::optional<std::string> duplicate;
    json index;
    RETURN_IF_ERROR(ParseJson(
        index_path, "index", text.data(), text.data() + text.size(),
        [&](int depth, const std::string& key) {
          if (depth == 1) {
            top_key = key;
            if (!top_seen.insert(key).second && !duplicate) duplicate = key;
          } else if (top_key == "weight_map" && !mapped_seen.insert(key).second && !duplicate) {
            duplicate = key;
          }
        },
        &index));
    if (!index.is_object()) {
      return InvalidArgument("{}: index is a JSON {}, not an object", index_path,
                             index.type_name());
    }
    if (duplicate) return InvalidArgument("{}: duplicate key \"{}\"", index_path, *duplicate);
    const auto metadata_it = index.find("metadata");
    if (metadata_it != index.end() && !metadata_it->is_object()) {
      return InvalidArgument("{}: \"metadata\" is a JSON {}, not an object", index_path,
                             metadata_it->type_name());
    }
    const auto map_it = index.find("weight_map");
    if (map_it == index.end()) return InvalidArgument("{}: missing \"weight_map\"", index_path);
    if (!map_it->is_object()) {
      return InvalidArgument("{}: \"weight_map\" is a JSON {}, not an object", index_path,
                             map_it->type_name());
    }
    if (map_it->empty()) return InvalidArgument("{}: \"weight_map\" is empty", index_path);

    // Shard file name -> position in files_, in name order (which is shard order).
    std::map<std::string, size_t> shard_of;
    for (const auto& [name, value] : map_it->items()) {
      const auto* file_name = value.get_ptr<const std::string*>();
      if (file_name == nullptr) {
        return InvalidArgument("{}: tensor \"{}\" maps to a JSON {}, not a file name", index_path,
                               name, value.type_name());
      }
      if (name.empty())
        return InvalidArgument("{}: weight_map has an empty tensor name", index_path);
      // The index is data: it must not reach files outside the model folder.
      if (!IsSafeShardName(*file_name)) {
        return InvalidArgument(
            "{}: tensor \"{}\" maps to \"{}\", which is not a plain file name "
            "in the model folder (no '/' or '..')",
            index_path, name, *file_name);
      }
      shard_of.emplace(*file_name, 0);
    }
    for (auto& [file_name, position] : shard_of) {
      const std::string shard_path = (fs::path(dir) / file_name).string();
      Result<std::unique_ptr<SafetensorsFile>> shard = SafetensorsFile::Open(shard_path);
      if (!shard.ok()) return shard.status().WithContext(fmt::format("shard of {}", index_path));
      position = checkpoint.files_.size();
      checkpoint.files_.push_back(std::move(shard).value());
    }
    for (const auto& [name, value] : map_it->items()) {
      const std::string& file_name = value.get_ref<const std::string&>();
      const SafetensorsFile& shard = *checkpoint.files_[shard_of.at(file_name)];
      if (shard.Find(name) == nullptr) {
        return InvalidArgument("{}: tensor \"{}\" is mapped to {}, which does not contain it",
                               index_path, name, shard.path());
      }
    }
  } else if (has_single) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    checkpoint.files_.push_back(std::move(file));
  } else {
    return NotFound("{}: contains neither {} nor {}", dir, kIndexName, kSingleName);
  }

  for (const auto& file : checkpoint.files_) {
    for (const SafetensorsTensor& t : file->tensors()) {
      auto [it, inserted] = checkpoint.by_name_.emplace(t.name, &t);
      if (!inserted) {
        return InvalidArgument("{}: tensor \"{}\" appears in both {} and {}", dir, t.name,
                               it->second->file, t.file);
      }
    }
  }
  return checkpoint;
}

SafetensorsCheckpoint SafetensorsCheckpoint::FromFile(std::unique_ptr<SafetensorsFile> file) {
  SafetensorsCheckpoint checkpoint;
  for (const SafetensorsTensor& t : file->tensors()) checkpoint.by_name_.emplace(t.name, &t);
  checkpoint.files_.push_back(std::move(file));
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsCheckpoint::tensors() const {
  std::vector<const SafetensorsTensor*> all;
  all.reserve(by_name_.size());
  for (const auto& file : files_) {
    for (const SafetensorsTensor& t : file->tensors()) all.push_back(&t);
  }
  return all;
}

std::vector<const SafetensorsFile*> SafetensorsCheckpoint::files() const {
  std::vector<const SafetensorsFile*> files;
  for (const auto& file : files_) files.push_back(file.get());
  return files;
}

uint64_t SafetensorsCheckpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& file : files_) {
    for (const SafetensorsTensor& t : file->tensors()) total += t.bytes.size();
  }
  return total;
}

}  // namespace moeserve::io
