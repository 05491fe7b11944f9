#include "cli/model_flags.h"

#include <cstdio>
#include <filesystem>
#include <numeric>

#include "cli/commands.h"
#include "core/log.h"
#include "core/timer.h"

namespace moeserve::cli {

void ModelFlags::Register(FlagSet& flags) {
  flags.String("model", &model, "model folder (default: the embedded default model)");
  flags.String("weight-dtype", &weight_dtype, "bf16 | f32 (default: as stored)");
  flags.Int("threads", &threads, "compute threads (0: all cores)");
}

Status ModelFlags::Validate() const {
  if (!weight_dtype.empty()) {
    std::optional<DType> dtype = ParseDTypeName(weight_dtype);
    if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kF32)) {
      return InvalidArgument("--weight-dtype: '{}' is not bf16 or f32", weight_dtype);
    }
  }
  if (threads < 0) return InvalidArgument("--threads: must not be negative");
  return OkStatus();
}

Result<std::string> ModelFlags::Dir() const {
  if (!model.empty()) return model;
  std::string dir = DefaultModelDir();
  if (!std::filesystem::exists(dir + "/config.json")) {
    return NotFound(
        "no default model at {} (scripts/run.sh creates it, or: moeserve make-model "
        "--preset small --out {})",
        dir, dir);
  }
  return dir;
}

Result<std::unique_ptr<model::CausalLm>> ModelFlags::Load() const {
  RETURN_IF_ERROR(Validate());
  model::LoadOptions options;
  if (!weight_dtype.empty()) options.weight_dtype = ParseDTypeName(weight_dtype);
  options.threads = static_cast<size_t>(threads);
  ASSIGN_OR_RETURN(const std::string dir, Dir());
  Stopwatch watch;
  Result<std::unique_ptr<model::CausalLm>> lm = model::CausalLm::Load(dir, options);
  if (!lm.ok()) return lm.status();
  LogDebug("loaded {} ({}, {} weights) in {:.2f} s", dir, (*lm)->config().architecture_name,
           DTypeName((*lm)->weights().matrix_dtype), watch.ElapsedSeconds());
  return lm;
}

namespace {

model::CacheSizes SingleSequenceSizes(int64_t max_positions) {
  model::CacheSizes sizes;
  sizes.num_blocks = (max_positions + sizes.block_size - 1) / sizes.block_size;
  return sizes;
}

}  // namespace

SingleSequence::SingleSequence(const io::ModelConfig& config, int64_t max_positions)
    : cache(config, SingleSequenceSizes(max_positions)), block_table(cache.sizes().num_blocks) {
  std::iota(block_table.begin(), block_table.end(), 0);
  cache.ResetSlot(0);
}

Result<std::vector<int32_t>> ParseTokenIds(const std::string& text, int64_t vocab_size) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) {
      return InvalidArgument("--token-ids: '{}' is not an integer", item);
    }
    if (v < 0 || v >= vocab_size) {
      return InvalidArgument("--token-ids: {} is outside the vocabulary [0, {})", v, vocab_size);
    }
    ids.push_back(static_cast<int32_t>(v));
    start = comma + 1;
  }
  return ids;
}

Status WriteF32File(const std::string& path, const float* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return IoError("cannot write {}", path);
  const size_t written = std::fwrite(data, sizeof(float), n, f);
  const bool closed = std::fclose(f) == 0;
  if (written != n || !closed) return IoError("writing {} failed", path);
  return OkStatus();
}

}  // namespace moeserve::cli
