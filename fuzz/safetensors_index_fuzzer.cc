// Feeds arbitrary bytes as a model folder's model.safetensors.index.json, beside two real shards
// (made once, in a temporary folder): opening the checkpoint must give a Status or a checkpoint
// whose every tensor lies in its shard -- each of its bytes is read -- never a crash, a read
// outside a mapping, a path outside the folder or unbounded recursion.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using moeserve::DType;
using moeserve::io::SafetensorsTensorSpec;

// A folder with two shards: shard 1 holds "a" (f32 [2, 3]) and "b" (bf16 [4]), shard 2 "c"
// (f32 [5]). The fuzzer rewrites only the index. Removed at exit.
class ShardFolder {
 public:
  ShardFolder()
      : dir_(fs::temp_directory_path() / ("moeserve_index_fuzz_" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
    auto fill = [](size_t, std::span<std::byte> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 7);
    };
    (void)moeserve::io::WriteSafetensors(
        (dir_ / "model-00001-of-00002.safetensors").string(),
        {SafetensorsTensorSpec{"a", DType::kF32, {2, 3}}, SafetensorsTensorSpec{"b", DType::kBF16, {4}}},
        fill);
    (void)moeserve::io::WriteSafetensors((dir_ / "model-00002-of-00002.safetensors").string(),
                                         {SafetensorsTensorSpec{"c", DType::kF32, {5}}}, fill);
  }
  ~ShardFolder() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

const fs::path& Folder() {
  static const ShardFolder folder;
  return folder.dir();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = Folder();
  {
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto checkpoint = moeserve::io::SafetensorsCheckpoint::Open(dir.string());
  if (checkpoint.ok()) {
    uint64_t sum = 0;
    for (const moeserve::io::SafetensorsTensor* t : checkpoint->tensors()) {
      for (std::byte b : t->bytes) sum += static_cast<uint64_t>(b);
    }
    volatile uint64_t sink = sum + checkpoint->total_bytes();
    (void)sink;
  }
  return 0;
}
