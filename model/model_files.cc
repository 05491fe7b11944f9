#include "model/model_files.h"

#include <filesystem>

#include "model/gguf_checkpoint.h"

namespace moeserve::model {

bool IsGgufModel(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && IsGgufFile(path);
}

Result<ModelFiles> OpenModelFiles(const std::string& path) {
  if (IsGgufModel(path)) {
    ASSIGN_OR_RETURN(GgufCheckpoint g, OpenGgufCheckpoint(path));
    return ModelFiles{std::move(g.config), std::move(g.checkpoint), std::move(g.file)};
  }
  ASSIGN_OR_RETURN(io::ModelConfig config, io::LoadModelConfig(path));
  ASSIGN_OR_RETURN(io::SafetensorsCheckpoint checkpoint, io::SafetensorsCheckpoint::Open(path));
  return ModelFiles{std::move(config), std::move(checkpoint), nullptr};
}

Result<io::ModelConfig> LoadModelConfigAt(const std::string& path) {
  if (!IsGgufModel(path)) return io::LoadModelConfig(path);
  ASSIGN_OR_RETURN(std::unique_ptr<io::GgufFile> file, io::GgufFile::Open(path));
  return GgufModelConfig(*file);
}

}  // namespace moeserve::model
