// moeserve export-gguf: a Hugging Face model folder written as one GGUF file, laid out as
// llama.cpp's converter lays it out (model/gguf_export.h, tokenizer/gguf_tokenizer.h), so that
// llama.cpp and moeserve can run the same bits.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_files.h"
#include "core/timer.h"
#include "io/gguf_writer.h"
#include "model/gguf_export.h"
#include "model/model_files.h"
#include "tokenizer/gguf_tokenizer.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "export-gguf";

struct Options {
  std::string model;
  std::string out;
  std::string type = "bf16";
};

// The pre-tokenizer llama.cpp names for the architecture's tokenizer.
std::string PreTokenizer(io::Architecture arch) {
  return arch == io::Architecture::kLlama ? "llama-bpe" : "qwen2";
}

Status Export(const Options& o) {
  const std::optional<DType> dtype = ParseDTypeName(o.type);
  if (!dtype || !(IsGgmlBlockDType(*dtype) || *dtype == DType::kF32 || *dtype == DType::kF16 ||
                  *dtype == DType::kBF16)) {
    return InvalidArgument("--type: '{}' is not f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                           "q4_k, q5_k or q6_k", o.type);
  }
  if (o.out.empty()) return InvalidArgument("--out is required");
  if (model::IsGgufModel(o.model)) return InvalidArgument("--model is a GGUF file already");
  ASSIGN_OR_RETURN(model::ModelFiles files, model::OpenModelFiles(o.model));
  io::GgufWriter writer;
  writer.SetString("general.name", std::filesystem::path(o.model).filename().string());
  RETURN_IF_ERROR(model::AddGgufModel(files.config, files.checkpoint, *dtype, writer));
  ASSIGN_OR_RETURN(const std::string tokenizer_json, ReadTextFile(o.model + "/tokenizer.json"));
  std::string tokenizer_config = "{}";
  if (std::filesystem::exists(o.model + "/tokenizer_config.json")) {
    ASSIGN_OR_RETURN(tokenizer_config, ReadTextFile(o.model + "/tokenizer_config.json"));
  }
  nlohmann::json tok, config;
  try {
    tok = nlohmann::json::parse(tokenizer_json);
    config = nlohmann::json::parse(tokenizer_config);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: tokenizer files do not parse: {}", o.model, e.what());
  }
  tokenizer::AddGgufTokenizer(&writer, tok, config, static_cast<int>(files.config.vocab_size),
                              static_cast<int>(files.config.bos_token_id),
                              PreTokenizer(files.config.architecture));
  return writer.Write(o.out);
}

}  // namespace

int RunExportGguf(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve export-gguf",
      "Writes a Hugging Face model folder as one GGUF file as llama.cpp's converter\n"
      "(convert_hf_to_gguf.py) lays it out: qwen3moe, qwen3, qwen3next and qwen35moe (with\n"
      "their MTP layers) or llama; matrices in --type (block formats quantized by a simple reference\n"
      "quantizer, not llama.cpp's search), norms and routers f32, the tokenizer and chat\n"
      "template as metadata. The file is built in memory: for test-size models and cuts.");
  flags.String("model", &o.model, "the Hugging Face model folder");
  flags.String("out", &o.out, "the GGUF file to write");
  flags.String("type", &o.type,
               "matrix type: f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q5_k | "
               "q6_k");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  Stopwatch watch;
  const Status s = Export(o);
  if (s.code() == StatusCode::kInvalidArgument) return UsageError(kCommand, s);
  if (!s.ok()) return RuntimeError(kCommand, s);
  fmt::print(stderr, "export-gguf: wrote {} ({}) in {:.1f} s\n", o.out, o.type,
             watch.ElapsedSeconds());
  return 0;
}

}  // namespace moeserve::cli
