#include "io/gguf_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace moeserve::io {
namespace {

using nlohmann::json;

class Bytes {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));  // little-endian, as GGUF
  }
  void Str(const std::string& s) {
    Put<uint64_t>(s.size());
    out_ += s;
  }
  void PadTo(uint64_t alignment) { out_.resize((out_.size() + alignment - 1) / alignment * alignment, '\0'); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

template <typename T>
Status PutNumber(Bytes& b, const json& v, const std::string& key) {
  if (!v.is_number() && !(std::is_same_v<T, uint8_t> && v.is_boolean())) {
    return InvalidArgument("GGUF key {}: {} is not a number", key, v.dump());
  }
  b.Put<T>(v.get<T>());
  return OkStatus();
}

Status PutScalar(Bytes& b, GgufType type, const json& v, const std::string& key) {
  switch (type) {
    case GgufType::kUint8: return PutNumber<uint8_t>(b, v, key);
    case GgufType::kInt8: return PutNumber<int8_t>(b, v, key);
    case GgufType::kUint16: return PutNumber<uint16_t>(b, v, key);
    case GgufType::kInt16: return PutNumber<int16_t>(b, v, key);
    case GgufType::kUint32: return PutNumber<uint32_t>(b, v, key);
    case GgufType::kInt32: return PutNumber<int32_t>(b, v, key);
    case GgufType::kFloat32: return PutNumber<float>(b, v, key);
    case GgufType::kUint64: return PutNumber<uint64_t>(b, v, key);
    case GgufType::kInt64: return PutNumber<int64_t>(b, v, key);
    case GgufType::kFloat64: return PutNumber<double>(b, v, key);
    case GgufType::kBool:
      if (!v.is_boolean()) return InvalidArgument("GGUF key {}: {} is not a bool", key, v.dump());
      b.Put<uint8_t>(v.get<bool>() ? 1 : 0);
      return OkStatus();
    case GgufType::kString:
      if (!v.is_string()) return InvalidArgument("GGUF key {}: {} is not a string", key, v.dump());
      b.Str(v.get_ref<const std::string&>());
      return OkStatus();
    case GgufType::kArray: break;
  }
  return InvalidArgument("GGUF key {}: type {} is not a scalar", key, static_cast<uint32_t>(type));
}

Status PutValue(Bytes& b, const GgufValue& value, const std::string& key) {
  b.Put<uint32_t>(static_cast<uint32_t>(value.type));
  if (value.type != GgufType::kArray) return PutScalar(b, value.type, value.value, key);
  if (!value.value.is_array()) {
    return InvalidArgument("GGUF key {}: {} is not an array", key, value.value.dump());
  }
  b.Put<uint32_t>(static_cast<uint32_t>(value.element_type));
  b.Put<uint64_t>(value.value.size());
  for (const json& e : value.value) RETURN_IF_ERROR(PutScalar(b, value.element_type, e, key));
  return OkStatus();
}

}  // namespace

void GgufWriter::Set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::SetString(const std::string& key, const std::string& value) {
  Set(key, {GgufType::kString, GgufType::kUint8, value});
}
void GgufWriter::SetU32(const std::string& key, uint32_t value) {
  Set(key, {GgufType::kUint32, GgufType::kUint8, value});
}
void GgufWriter::SetF32(const std::string& key, float value) {
  Set(key, {GgufType::kFloat32, GgufType::kUint8, value});
}
void GgufWriter::SetBool(const std::string& key, bool value) {
  Set(key, {GgufType::kBool, GgufType::kUint8, value});
}
void GgufWriter::SetArray(const std::string& key, GgufType element_type, json values) {
  Set(key, {GgufType::kArray, element_type, std::move(values)});
}

void GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> ne, uint32_t type,
                           std::string bytes) {
  tensors_.push_back({name, std::move(ne), type, std::move(bytes)});
}

void GgufWriter::RemoveTensor(const std::string& name) {
  std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
}

Status GgufWriter::Write(const std::string& path) const {
  Bytes b;
  b.str() += "GGUF";
  b.Put<uint32_t>(3);
  b.Put<uint64_t>(tensors_.size());
  const bool has_alignment =
      std::any_of(metadata_.begin(), metadata_.end(),
                  [](const auto& kv) { return kv.first == "general.alignment"; });
  b.Put<uint64_t>(metadata_.size() + (has_alignment || alignment_ == 32 ? 0 : 1));
  for (const auto& [key, value] : metadata_) {
    b.Str(key);
    RETURN_IF_ERROR(PutValue(b, value, key));
  }
  if (!has_alignment && alignment_ != 32) {
    b.Str("general.alignment");
    RETURN_IF_ERROR(PutValue(b, {GgufType::kUint32, GgufType::kUint8, alignment_}, ""));
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    const GgmlTypeTraits traits = GgmlType(t.type);
    int64_t numel = 1;
    for (int64_t d : t.ne) numel *= d;
    if (traits.block_bytes == 0 || t.ne.empty() || t.ne[0] % traits.block_size != 0 ||
        static_cast<uint64_t>(numel / traits.block_size * traits.block_bytes) != t.bytes.size()) {
      return InvalidArgument("GGUF tensor {}: {} bytes do not match its shape and type {}",
                             t.name, t.bytes.size(), t.type);
    }
    b.Str(t.name);
    b.Put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) b.Put<uint64_t>(static_cast<uint64_t>(d));
    b.Put<uint32_t>(t.type);
    b.Put<uint64_t>(offset);
    offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  b.PadTo(alignment_);
  for (const Tensor& t : tensors_) {
    b.str() += t.bytes;
    b.PadTo(alignment_);
  }
  const std::string tmp = fmt::format("{}.tmp{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(b.str().data(), static_cast<std::streamsize>(b.str().size()));
    out.close();
    if (!out) return IoError("writing {} failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IoError("renaming {} to {}: {}", tmp, path, ec.message());
  return OkStatus();
}

}  // namespace moeserve::io
