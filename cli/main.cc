// moeserve: one binary, one subcommand per job (docs/cli.md). The subcommands are commands.cc's
// table; `moeserve help --markdown` prints docs/cli.md from it.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli_reference.h"
#include "cli/commands.h"
#include "core/trace.h"
#include "kernels/isa.h"

int main(int argc, char** argv) {
  using namespace moeserve::cli;
  if (argc < 2) {
    std::fputs(Usage().c_str(), stderr);
    return 2;
  }
  const std::string_view first = argv[1];
  if (first == "help" && argc > 2 && std::string_view(argv[2]) == "--markdown") {
    std::fputs(CliReferenceMarkdown().c_str(), stdout);
    return 0;
  }
  if (first == "--help" || first == "-h" || first == "help") {
    std::fputs(Usage().c_str(), stdout);
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
  for (const Subcommand& s : Subcommands()) {
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
