// Feeds arbitrary bytes to the GGUF model reader as a file: the config from its metadata, every
// tensor the architecture needs found and shape-checked. It must return a Status or a checkpoint
// whose every tensor lies inside the file -- never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/scratch_file.h"
#include "model/gguf_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = moeserve::fuzz::WriteScratchFile("gguf_model_fuzz", data, size);
  if (path.empty()) return 0;
  auto checkpoint = moeserve::model::OpenGgufCheckpoint(path);
  if (checkpoint.ok()) {
    for (const auto* file : checkpoint->checkpoint.files()) {
      moeserve::fuzz::TouchEveryByte(file->tensors());
    }
  }
  return 0;
}
