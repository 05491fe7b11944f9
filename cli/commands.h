// The subcommands of the moeserve binary. Each takes the words after its name and returns the
// process exit code: 0 success, 1 runtime failure, 2 usage error (docs/cli.md).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cli/flags.h"
#include "core/status.h"

namespace moeserve::cli {

int RunMakeModel(const std::vector<std::string>& args);
int RunExportGguf(const std::vector<std::string>& args);
int RunInspect(const std::vector<std::string>& args);
int RunLogits(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);
int RunServe(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);  // bench latency | serve
int RunBenchLatency(const std::vector<std::string>& args);
int RunBenchServe(const std::vector<std::string>& args);
int RunChat(const std::vector<std::string>& args);
int RunTrainTokenizer(const std::vector<std::string>& args);
int RunTokenize(const std::vector<std::string>& args);
int RunDetokenize(const std::vector<std::string>& args);

// One subcommand, as `moeserve --help` lists it and docs/cli.md documents it.
struct Subcommand {
  std::string_view name;     // the words after "moeserve": "generate", "bench latency"
  std::string_view summary;  // one line
  int (*run)(const std::vector<std::string>& args);  // given the words after the name
  // A group's subcommands ("bench": "bench latency", "bench serve"); its run picks one of them.
  std::span<const Subcommand> children = {};
};

// The subcommands main() dispatches on, in the order --help lists them.
std::span<const Subcommand> Subcommands();

// `moeserve --help`: the subcommands, a group's children in its place.
std::string Usage();

// The flags `run` registers, without running it: it is called with no arguments, and ParseFlags,
// instead of parsing, hands `describe` the subcommand's FlagSet and returns 0 (as after --help).
void DescribeFlags(int (*run)(const std::vector<std::string>&),
                   const std::function<void(const FlagSet&)>& describe);

// The model folder used when --model is omitted: $MOESERVE_MODEL, else the build's default.
std::string DefaultModelDir();

// Parses a subcommand's flags. Returns the exit code when the command should stop here: 0 after
// printing --help, 2 after printing a usage error; nullopt to go on. Every subcommand calls it
// once its flags are registered and before any work, and returns what it returns: DescribeFlags
// relies on that.
std::optional<int> ParseFlags(FlagSet& flags, const std::vector<std::string>& args,
                              const std::string& command);

// Print "moeserve <command>: <message>" on stderr and return the exit code.
int UsageError(const std::string& command, const Status& status);    // 2
int RuntimeError(const std::string& command, const Status& status);  // 1
// A bad input (InvalidArgument: a flag, a request line, a value the engine rejects) is a usage
// error; anything else a runtime failure.
int InputOrRuntimeError(const std::string& command, const Status& status);

// For an output file flag, before any work: InvalidArgument "<flag>: cannot write '<path>' (is
// <folder> a writable folder?)" when the folder is not writable or the path is a folder.
Status CheckWritableFile(const std::string& flag, const std::string& path);

// Writes `text` to `path` (created or truncated): an IoError naming the path if any of it fails.
Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace moeserve::cli
