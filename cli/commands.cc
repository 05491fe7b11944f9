#include "cli/commands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace moeserve::cli {
namespace {

// One line each, at most 80 characters: --help prints them after a 19-character column.
constexpr Subcommand kBenchSubcommands[] = {
    {"bench latency", "in-process prefill rate and decode TPOT per batch size against the roofline",
     &RunBenchLatency},
    {"bench serve", "load generator against an OpenAI-compatible server (vLLM's bench serve)",
     &RunBenchServe},
};

constexpr Subcommand kSubcommands[] = {
    {"make-model", "write a model folder with random weights (HF layout) for tests and benchmarks",
     &RunMakeModel},
    {"export-gguf", "write a model folder as a GGUF file, laid out as llama.cpp's converter does",
     &RunExportGguf},
    {"train-tokenizer", "train a byte-level BPE tokenizer on a text file (HF tokenizer files)",
     &RunTrainTokenizer},
    {"inspect", "print a model's architecture, parameter counts and roofline decode rate",
     &RunInspect},
    {"logits", "run token ids through a model and write the logits (and MTP draft logits)",
     &RunLogits},
    {"tokenize", "text to token ids (and chats rendered with the chat template)", &RunTokenize},
    {"detokenize", "token ids to text", &RunDetokenize},
    {"generate", "generation through the engine: one prompt or a file of them (greedy by default)",
     &RunGenerate},
    {"chat", "interactive chat in the terminal over the engine (the model's chat template)",
     &RunChat},
    {"serve", "OpenAI-compatible HTTP server (vLLM's API) and chat page over the engine",
     &RunServe},
    {"bench", "benchmarks", &RunBench, kBenchSubcommands},
};

// Set while DescribeFlags runs a subcommand.
thread_local const std::function<void(const FlagSet&)>* g_describe = nullptr;

}  // namespace

std::span<const Subcommand> Subcommands() { return kSubcommands; }

std::string Usage() {
  std::string out =
      "usage: moeserve <subcommand> [flags]\n\n"
      "An inference and serving engine for hybrid Mixture-of-Experts language models.\n\n"
      "subcommands:\n";
  for (const Subcommand& s : kSubcommands) {
    for (const Subcommand& leaf : s.children.empty() ? std::span(&s, 1) : s.children) {
      out += fmt::format("  {:<16} {}\n", leaf.name, leaf.summary);
    }
  }
  return out + "\n'moeserve <subcommand> --help' lists a subcommand's flags.\n";
}

int RunBench(const std::vector<std::string>& args) {
  for (const Subcommand& s : kBenchSubcommands) {
    if (!args.empty() && "bench " + args[0] == s.name) {
      return s.run(std::vector<std::string>(args.begin() + 1, args.end()));
    }
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::puts("usage: moeserve bench latency|serve [flags]   (see --help of each)");
    return 0;
  }
  return UsageError("bench", InvalidArgument("expected 'bench latency' or 'bench serve' (got '{}')",
                                             args.empty() ? "" : args[0]));
}

void DescribeFlags(int (*run)(const std::vector<std::string>&),
                   const std::function<void(const FlagSet&)>& describe) {
  g_describe = &describe;
  run({});
  g_describe = nullptr;
}

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
  if (g_describe != nullptr) {
    (*g_describe)(flags);
    return 0;
  }
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
