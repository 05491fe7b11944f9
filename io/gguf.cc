#include "io/gguf.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstring>

#include "core/check.h"
#include "io/mapped_file.h"

namespace moeserve::io {
namespace {

using nlohmann::json;

// Reads little-endian fields off the file's bytes, each checked against what is left.
class Cursor {
 public:
  Cursor(const std::string& path, const std::byte* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t position() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  template <typename T>
  Result<T> Read(std::string_view field) {
    if (left() < sizeof(T)) {
      return InvalidArgument("{}: {} at byte {} runs past the end of the file ({} bytes)", path_,
                             field, pos_, size_);
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // x86-64 is little-endian, as GGUF
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> ReadString(std::string_view field) {
    ASSIGN_OR_RETURN(const uint64_t n, Read<uint64_t>(field));
    if (n > left()) {
      return InvalidArgument("{}: {} at byte {} claims {} bytes, {} are left in the file", path_,
                             field, pos_ - 8, n, left());
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const std::byte* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// The fewest bytes one element of `type` takes in the file (a string: its length field).
uint64_t MinElementBytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;  // element type and count
  }
  return 0;
}

template <typename T>
Result<json> Number(Cursor& c, const std::string& field) {
  ASSIGN_OR_RETURN(const T v, c.Read<T>(field));
  return json(v);
}

// One value of a type that is not an array.
Result<json> ReadScalar(Cursor& c, const std::string& path, GgufType type,
                        const std::string& field) {
  switch (type) {
    case GgufType::kUint8:
      return Number<uint8_t>(c, field);
    case GgufType::kInt8:
      return Number<int8_t>(c, field);
    case GgufType::kUint16:
      return Number<uint16_t>(c, field);
    case GgufType::kInt16:
      return Number<int16_t>(c, field);
    case GgufType::kUint32:
      return Number<uint32_t>(c, field);
    case GgufType::kInt32:
      return Number<int32_t>(c, field);
    case GgufType::kFloat32:
      return Number<float>(c, field);
    case GgufType::kUint64:
      return Number<uint64_t>(c, field);
    case GgufType::kInt64:
      return Number<int64_t>(c, field);
    case GgufType::kFloat64:
      return Number<double>(c, field);
    case GgufType::kBool: {
      ASSIGN_OR_RETURN(const uint8_t b, c.Read<uint8_t>(field));
      if (b > 1) return InvalidArgument("{}: {} is a bool of value {}", path, field, b);
      return json(b == 1);
    }
    case GgufType::kString: {
      ASSIGN_OR_RETURN(std::string s, c.ReadString(field));
      return json(std::move(s));
    }
    default:
      break;
  }
  return InvalidArgument("{}: {} has unknown type {}", path, field, static_cast<uint32_t>(type));
}

// One value of `type` (an array's elements recursively, at most kMaxGgufArrayDepth deep).
Result<GgufValue> ReadValue(Cursor& c, const std::string& path, GgufType type,
                            const std::string& field, int depth) {
  GgufValue out{type, GgufType::kUint8, json()};
  if (type != GgufType::kArray) {
    ASSIGN_OR_RETURN(out.value, ReadScalar(c, path, type, field));
    return out;
  }
  if (depth >= kMaxGgufArrayDepth) {
    return InvalidArgument("{}: {} nests arrays deeper than {}", path, field, kMaxGgufArrayDepth);
  }
  ASSIGN_OR_RETURN(const uint32_t element, c.Read<uint32_t>(field + " (element type)"));
  if (MinElementBytes(static_cast<GgufType>(element)) == 0) {
    return InvalidArgument("{}: {} has elements of unknown type {}", path, field, element);
  }
  out.element_type = static_cast<GgufType>(element);
  ASSIGN_OR_RETURN(const uint64_t count, c.Read<uint64_t>(field + " (count)"));
  // Checked before anything is allocated: the elements must fit in what is left.
  if (count > c.left() / MinElementBytes(out.element_type)) {
    return InvalidArgument("{}: {} claims {} elements, more than the {} bytes left hold", path,
                           field, count, c.left());
  }
  out.value = json::array();
  out.value.get_ref<json::array_t&>().reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(GgufValue e, ReadValue(c, path, out.element_type,
                                            fmt::format("{}[{}]", field, i), depth + 1));
    out.value.push_back(std::move(e.value));
  }
  return out;
}

}  // namespace

namespace {

struct WeightType {
  uint32_t ggml;
  DType dtype;
};
constexpr WeightType kWeightTypes[] = {
    {0, DType::kF32},        {1, DType::kF16},        {30, DType::kBF16},
    {8, DType::kGgmlQ8_0},   {2, DType::kGgmlQ4_0},   {3, DType::kGgmlQ4_1},
    {6, DType::kGgmlQ5_0},   {7, DType::kGgmlQ5_1},   {12, DType::kGgmlQ4_K},
    {13, DType::kGgmlQ5_K},  {14, DType::kGgmlQ6_K},
};

}  // namespace

std::optional<DType> DTypeOfGgmlType(uint32_t type) {
  for (const WeightType& t : kWeightTypes) {
    if (t.ggml == type) return t.dtype;
  }
  return std::nullopt;
}

uint32_t GgmlTypeOfDType(DType dtype) {
  for (const WeightType& t : kWeightTypes) {
    if (t.dtype == dtype) return t.ggml;
  }
  CHECK(false) << DTypeName(dtype) << " has no ggml type";
  __builtin_unreachable();
}

GgmlTypeTraits GgmlType(uint32_t type) {
  switch (type) {
    case 0:
      return {"F32", 1, 4};
    case 1:
      return {"F16", 1, 2};
    case 2:
      return {"Q4_0", 32, 18};
    case 3:
      return {"Q4_1", 32, 20};
    case 6:
      return {"Q5_0", 32, 22};
    case 7:
      return {"Q5_1", 32, 24};
    case 8:
      return {"Q8_0", 32, 34};
    case 9:
      return {"Q8_1", 32, 36};
    case 10:
      return {"Q2_K", 256, 84};
    case 11:
      return {"Q3_K", 256, 110};
    case 12:
      return {"Q4_K", 256, 144};
    case 13:
      return {"Q5_K", 256, 176};
    case 14:
      return {"Q6_K", 256, 210};
    case 15:
      return {"Q8_K", 256, 292};
    case 24:
      return {"I8", 1, 1};
    case 25:
      return {"I16", 1, 2};
    case 26:
      return {"I32", 1, 4};
    case 27:
      return {"I64", 1, 8};
    case 28:
      return {"F64", 1, 8};
    case 30:
      return {"BF16", 1, 2};
    default:
      return {"unknown", 0, 0};
  }
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(const FileMapping m, MapReadOnly(path, 24, "the 24-byte GGUF header"));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = m.data;
  f->map_size_ = m.size;
  const auto* base = static_cast<const std::byte*>(m.data);
  Cursor c(f->path_, base, m.size);

  ASSIGN_OR_RETURN(const uint32_t magic, c.Read<uint32_t>("magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return InvalidArgument("{}: not a GGUF file (magic is not \"GGUF\")", path);
  }
  ASSIGN_OR_RETURN(f->version_, c.Read<uint32_t>("version"));
  if (f->version_ != 2 && f->version_ != 3) {
    return InvalidArgument("{}: GGUF version {} (this reader takes 2 and 3)", path, f->version_);
  }
  ASSIGN_OR_RETURN(const uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(const uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // A key-value takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8.
  if (n_kv > c.left() / 13) {
    return InvalidArgument("{}: metadata count {} is more than the file's {} bytes hold", path,
                           n_kv, m.size);
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    ASSIGN_OR_RETURN(std::string key, c.ReadString(fmt::format("metadata key #{}", i)));
    ASSIGN_OR_RETURN(const uint32_t type, c.Read<uint32_t>(fmt::format("type of '{}'", key)));
    ASSIGN_OR_RETURN(GgufValue value,
                     ReadValue(c, path, static_cast<GgufType>(type), fmt::format("'{}'", key), 0));
    if (!f->metadata_.emplace(key, std::move(value)).second) {
      return InvalidArgument("{}: metadata key '{}' appears twice", path, key);
    }
  }
  if (const GgufValue* a = f->FindValue("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->value.get<uint64_t>() == 0 ||
        (a->value.get<uint64_t>() & (a->value.get<uint64_t>() - 1)) != 0) {
      return InvalidArgument("{}: general.alignment must be a u32 power of two, is {}", path,
                             a->value.dump());
    }
    f->alignment_ = a->value.get<uint64_t>();
  }

  if (n_tensors > c.left() / 24) {
    return InvalidArgument("{}: tensor count {} is more than the file's {} bytes hold", path,
                           n_tensors, m.size);
  }
  f->tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    ASSIGN_OR_RETURN(t.name, c.ReadString(fmt::format("name of tensor #{}", i)));
    const std::string what = fmt::format("tensor '{}'", t.name);
    ASSIGN_OR_RETURN(const uint32_t n_dims, c.Read<uint32_t>(what + " n_dims"));
    if (n_dims == 0 || n_dims > 4) {
      return InvalidArgument("{}: {} has {} dimensions (1 to 4)", path, what, n_dims);
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(const uint64_t ne, c.Read<uint64_t>(what + " ne"));
      // Each dimension and the product stay below 2^62: no overflow in what follows.
      if (ne == 0 || ne > (uint64_t{1} << 62) / numel) {
        return InvalidArgument("{}: {} has dimension {} = {} (the product must stay in 1 .. 2^62)",
                               path, what, d, ne);
      }
      numel *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    ASSIGN_OR_RETURN(t.type, c.Read<uint32_t>(what + " type"));
    const GgmlTypeTraits traits = GgmlType(t.type);
    if (traits.block_bytes == 0) {
      return InvalidArgument("{}: {} has ggml type {}, which this reader does not know", path, what,
                             t.type);
    }
    if (t.ne[0] % traits.block_size != 0) {
      return InvalidArgument("{}: {} is {} with ne[0] = {}, not a multiple of its block of {}",
                             path, what, traits.name, t.ne[0], traits.block_size);
    }
    ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>(what + " offset"));
    if (t.offset % f->alignment_ != 0) {
      return InvalidArgument("{}: {} offset {} is not a multiple of the alignment {}", path, what,
                             t.offset, f->alignment_);
    }
    if (!f->index_.emplace(t.name, f->tensors_.size()).second) {
      return InvalidArgument("{}: tensor '{}' appears twice", path, t.name);
    }
    f->tensors_.push_back(std::move(t));
  }

  // The data area starts at the next multiple of the alignment (a file without tensors may end
  // before it: its data area is empty).
  const uint64_t data_start = (c.position() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  const uint64_t data_size = data_start <= m.size ? m.size - data_start : 0;
  for (GgufTensor& t : f->tensors_) {
    const GgmlTypeTraits traits = GgmlType(t.type);
    const uint64_t bytes = static_cast<uint64_t>(t.numel() / traits.block_size) *
                           static_cast<uint64_t>(traits.block_bytes);
    if (t.offset > data_size || bytes > data_size - t.offset) {
      return InvalidArgument(
          "{}: tensor '{}' ({} bytes at offset {}) runs past the end of the data area ({} bytes)",
          path, t.name, bytes, t.offset, data_size);
    }
    t.bytes = {base + data_start + t.offset, bytes};
  }
  return f;
}

}  // namespace moeserve::io
