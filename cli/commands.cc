#include "cli/commands.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <cstdlib>

namespace moeserve::cli {

std::string DefaultModelDir() {
  if (const char* env = std::getenv("MOESERVE_MODEL"); env != nullptr && *env != '\0') return env;
  return MOESERVE_DEFAULT_MODEL_DIR;
}

int UsageError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "moeserve %s: %s\n", command.c_str(), status.message().c_str());
  return 2;
}

std::optional<int> ParseFlags(FlagSet& flags, const std::vector<std::string>& args,
                              const std::string& command) {
  if (Status s = flags.Parse(args); !s.ok()) return UsageError(command, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

int RuntimeError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "moeserve %s: %s\n", command.c_str(), status.message().c_str());
  return 1;
}

int InputOrRuntimeError(const std::string& command, const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? UsageError(command, status)
                                                       : RuntimeError(command, status);
}

Status CheckWritableFile(const std::string& flag, const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (access(dir.c_str(), W_OK) != 0 || std::filesystem::is_directory(path)) {
    return InvalidArgument("{}: cannot write '{}' (is {} a writable folder?)", flag, path, dir);
  }
  return OkStatus();
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return IoError("cannot write {}", path);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written) return IoError("cannot write {}", path);
  return OkStatus();
}

}  // namespace moeserve::cli
