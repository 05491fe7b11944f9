#include "cli/inflate_model.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"
#include "io/safetensors.h"

namespace moeserve::cli {

namespace fs = std::filesystem;

namespace {

enum class Role { kCopy, kRows, kColumns };  // as it is; gate / up rows; down columns

// A routed expert's projection (model and MTP layers): model.layers.L.mlp.experts.E.gate_proj
// .weight and mtp.layers.L.mlp.experts.E.down_proj.weight widen; the shared expert does not.
Role RoleOf(std::string_view name) {
  constexpr std::string_view kExperts = ".mlp.experts.", kWeight = ".weight";
  const size_t at = name.find(kExperts);
  if (at == std::string_view::npos || !name.ends_with(kWeight)) return Role::kCopy;
  std::string_view rest = name.substr(at + kExperts.size());  // E.gate_proj.weight
  size_t digits = 0;
  while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
  if (digits == 0 || digits >= rest.size() || rest[digits] != '.') return Role::kCopy;
  const std::string_view proj = rest.substr(digits + 1, rest.size() - digits - 1 - kWeight.size());
  if (proj == "down_proj") return Role::kColumns;
  return proj == "gate_proj" || proj == "up_proj" ? Role::kRows : Role::kCopy;
}

// The config.json object that holds the text model's fields (Qwen3.5 nests them in text_config).
nlohmann::ordered_json* TextConfig(nlohmann::ordered_json& config) {
  if (config.contains("moe_intermediate_size")) return &config;
  auto it = config.find("text_config");
  if (it != config.end() && it->is_object() && it->contains("moe_intermediate_size")) return &*it;
  return nullptr;
}

Result<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot read {}", path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Status InflateModel(const std::string& from, int64_t factor, const std::string& out,
                    uint64_t max_shard_bytes) {
  if (factor < 2 || factor > 1024 || (factor & (factor - 1)) != 0) {
    return InvalidArgument("--inflate-factor: {} is not a power of two in 2..1024", factor);
  }
  std::error_code ec;
  if (fs::equivalent(from, out, ec)) {
    return InvalidArgument("--out: the inflated model cannot replace --inflate-from {}", from);
  }
  ASSIGN_OR_RETURN(const std::string config_text, ReadFile(fs::path(from) / "config.json"));
  ASSIGN_OR_RETURN(nlohmann::ordered_json config,
                   ParseJson<nlohmann::ordered_json>(config_text, "config.json"));
  nlohmann::ordered_json* text = TextConfig(config);
  if (text == nullptr || !(*text)["moe_intermediate_size"].is_number_integer() ||
      (*text)["moe_intermediate_size"].get<int64_t>() <= 0) {
    return InvalidArgument(
        "--inflate-from {}: config.json has no moe_intermediate_size (a model "
        "without routed experts)",
        from);
  }
  const int64_t width = (*text)["moe_intermediate_size"].get<int64_t>();
  (*text)["moe_intermediate_size"] = width * factor;

  ASSIGN_OR_RETURN(io::SafetensorsCheckpoint checkpoint, io::SafetensorsCheckpoint::Open(from));
  const std::vector<const io::SafetensorsTensor*> tensors = checkpoint.tensors();
  std::vector<io::SafetensorsTensorSpec> specs;
  std::vector<Role> roles;
  int64_t widened = 0;
  for (const io::SafetensorsTensor* t : tensors) {
    const Role role = RoleOf(t->name);
    std::vector<int64_t> shape = t->shape;
    if (role != Role::kCopy) {
      const bool float_type =
          t->dtype == DType::kBF16 || t->dtype == DType::kF16 || t->dtype == DType::kF32;
      const int axis = role == Role::kRows ? 0 : 1;
      if (!float_type || shape.size() != 2 || shape[axis] != width) {
        return InvalidArgument(
            "--inflate-from: tensor {} ({}, shape [{}]) is not a 2-D bf16/f16/f32 projection with "
            "moe_intermediate_size {} along its {}",
            t->name, DTypeName(t->dtype), fmt::join(shape, ", "), width,
            role == Role::kRows ? "rows" : "columns");
      }
      shape[axis] *= factor;
      ++widened;
    }
    specs.push_back({t->name, t->dtype, shape});
    roles.push_back(role);
  }
  if (widened == 0) {
    return InvalidArgument(
        "--inflate-from {}: no tensor named *.mlp.experts.N.{{gate,up,down}}_proj.weight (fused "
        "or renamed experts are not read)",
        from);
  }

  fs::create_directories(out, ec);
  if (ec) return IoError("cannot create {}: {}", out, ec.message());
  // Every file but the weights, config.json rewritten.
  for (const fs::directory_entry& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json" || name == "config.json") {
      continue;
    }
    fs::copy_file(e.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError("cannot copy {} to {}: {}", e.path().string(), out, ec.message());
  }
  {
    std::ofstream f(fs::path(out) / "config.json", std::ios::binary | std::ios::trunc);
    f << config.dump(2) << "\n";
    if (!f) return IoError("cannot write {}/config.json", out);
  }

  std::vector<float> row, scaled;
  auto fill = [&](size_t index, std::span<std::byte> dst) {
    const io::SafetensorsTensor& t = *tensors[index];
    const std::span<const std::byte> src = t.bytes;
    if (roles[index] == Role::kCopy) {
      std::memcpy(dst.data(), src.data(), src.size());
    } else if (roles[index] == Role::kRows) {
      // [I, H] -> [R·I, H]: the whole tensor R times.
      for (int64_t r = 0; r < factor; ++r) {
        std::memcpy(dst.data() + r * src.size(), src.data(), src.size());
      }
    } else {
      // [H, I] -> [H, R·I]: each row's I values, divided by R, R times.
      const size_t es = DTypeSize(t.dtype), in_row = width * es;
      row.resize(width);
      scaled.resize(width);
      for (int64_t h = 0; h < t.shape[0]; ++h) {
        ConvertToF32(t.dtype, src.data() + h * in_row, row.data(), width);
        for (int64_t i = 0; i < width; ++i) scaled[i] = row[i] / static_cast<float>(factor);
        std::byte* out_row = dst.data() + h * in_row * factor;
        ConvertFromF32(scaled.data(), t.dtype, out_row, width);
        for (int64_t r = 1; r < factor; ++r) std::memcpy(out_row + r * in_row, out_row, in_row);
      }
    }
  };
  return io::WriteSafetensorsCheckpoint(out, specs, fill, max_shard_bytes);
}

}  // namespace moeserve::cli
