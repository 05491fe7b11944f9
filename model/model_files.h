// A model as its user names it (--model): a Hugging Face folder (config.json and safetensors
// shards) or a GGUF file (gguf_checkpoint.h), told apart by the file's magic bytes.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "io/gguf.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace moeserve::model {

struct ModelFiles {
  io::ModelConfig config;
  io::SafetensorsCheckpoint checkpoint;   // a GGUF file's tensors under Hugging Face names
  std::shared_ptr<const io::GgufFile> gguf;  // the GGUF file; null for a folder
};

// Opens the config and the weights at `path`.
Result<ModelFiles> OpenModelFiles(const std::string& path);
// Only the config: config.json of a folder, the metadata of a GGUF file.
Result<io::ModelConfig> LoadModelConfigAt(const std::string& path);
// Whether `path` is a GGUF file rather than a folder.
bool IsGgufModel(const std::string& path);

}  // namespace moeserve::model
