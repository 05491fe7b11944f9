#include "cli/activation_dump.h"

#include <fmt/format.h>

#include <filesystem>

#include "cli/model_flags.h"

namespace moeserve::cli {

Result<std::unique_ptr<ActivationDump>> ActivationDump::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create {}: {}", dir, ec.message());
  std::FILE* index = std::fopen((dir + "/index.jsonl").c_str(), "w");
  if (index == nullptr) return IoError("cannot write {}/index.jsonl", dir);
  return std::unique_ptr<ActivationDump>(new ActivationDump(dir, index));
}

Result<std::unique_ptr<ActivationDump>> ActivationDump::AttachTo(model::CausalLm& lm,
                                                                 const std::string& dir) {
  if (dir.empty()) return std::unique_ptr<ActivationDump>();
  ASSIGN_OR_RETURN(std::unique_ptr<ActivationDump> dump, Create(dir));
  lm.set_activation_tap(dump->Tap());
  return dump;
}

ActivationDump::~ActivationDump() { std::fclose(index_); }

model::ActivationTap ActivationDump::Tap() {
  return
      [this](std::string_view name, int64_t layer, const float* data, int64_t rows, int64_t cols) {
        const std::string file = fmt::format("{}L{:02d}.{}.f32", prefix_, layer, name);
        Status s = WriteF32File(dir_ + "/" + file, data, static_cast<size_t>(rows * cols));
        if (!s.ok() && status_.ok()) status_ = s;
        std::fprintf(index_,
                     "{\"file\": \"%s\", \"name\": \"%.*s\", \"layer\": %lld, \"rows\": %lld, "
                     "\"cols\": %lld}\n",
                     file.c_str(), static_cast<int>(name.size()), name.data(),
                     static_cast<long long>(layer), static_cast<long long>(rows),
                     static_cast<long long>(cols));
      };
}

}  // namespace moeserve::cli
