// moeserve: one binary, one subcommand per job (CLI.md).
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "core/trace.h"
#include "kernels/isa.h"

namespace moeserve::cli {
namespace {

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(const std::vector<std::string>&);
};

constexpr Subcommand kSubcommands[] = {
    {"make-model", "write a model folder with random weights (HF layout) for tests and benchmarks",
     &RunMakeModel},
    {"train-tokenizer", "train a byte-level BPE tokenizer on a text file (HF tokenizer files)",
     &RunTrainTokenizer},
    {"inspect", "print a model's architecture, parameter counts and roofline decode rate",
     &RunInspect},
    {"logits", "run token ids through a model and write the logits (and MTP draft logits)",
     &RunLogits},
    {"tokenize", "text to token ids (and chats rendered with the chat template)", &RunTokenize},
    {"detokenize", "token ids to text", &RunDetokenize},
    {"generate", "greedy generation for one prompt (text or token ids)", &RunGenerate},
    {"chat", "interactive chat in the terminal (the model's chat template)", &RunChat},
    {"serve", "OpenAI-compatible HTTP server (vLLM's API) over the engine", &RunServe},
    {"bench",
     "benchmarks: 'bench latency' (in-process decode / prefill vs the roofline) and\n"
     "                   'bench serve' (load generator against an OpenAI-compatible server)",
     &RunBench},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "usage: moeserve <subcommand> [flags]\n\n"
               "An inference and serving engine for hybrid Mixture-of-Experts language models.\n\n"
               "subcommands:\n");
  for (const Subcommand& s : kSubcommands) {
    std::fprintf(out, "  %-16.*s %.*s\n", static_cast<int>(s.name.size()), s.name.data(),
                 static_cast<int>(s.summary.size()), s.summary.data());
  }
  std::fprintf(out, "\n'moeserve <subcommand> --help' lists a subcommand's flags.\n");
}

}  // namespace

}  // namespace moeserve::cli

int main(int argc, char** argv) {
  using namespace moeserve::cli;
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  const std::string_view first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    PrintUsage(stdout);
    return 0;
  }
  if (first == "--version") {
    std::printf("moeserve %s\n", MOESERVE_VERSION);
    return 0;
  }
  // MOESERVE_ISA restricts every subcommand's kernels; --isa (an engine flag) overrides it.
  if (const moeserve::Status isa = moeserve::kernels::SelectIsaFromEnvironment(); !isa.ok()) {
    std::fprintf(stderr, "moeserve: %s\n", isa.message().c_str());
    return 2;
  }
  for (const Subcommand& s : kSubcommands) {
    if (s.name != first) continue;
    int exit_code = s.run(std::vector<std::string>(argv + 2, argv + argc));
    // --trace: the events recorded since the model loaded.
    if (const moeserve::Status written = moeserve::trace::Finish(); !written.ok()) {
      std::fprintf(stderr, "moeserve %s: %s\n", argv[1], written.message().c_str());
      if (exit_code == 0) exit_code = 1;
    }
    return exit_code;
  }
  std::fprintf(stderr, "moeserve: unknown subcommand '%s' (see moeserve --help)\n", argv[1]);
  return 2;
}
