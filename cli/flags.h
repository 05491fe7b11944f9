// Command-line flags of one subcommand: declared with a pointer to where the value goes, parsed
// strictly. "--name value" and "--name=value" both work; a bool flag takes no value.
// Errors (unknown flag, missing or malformed value, stray argument) come back as a one-line
// message naming the flag; the caller prints it and exits 2 (docs/cli.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve::cli {

class FlagSet {
 public:
  // command: "moeserve make-model"; summary: one line for --help.
  FlagSet(std::string command, std::string summary);

  void String(const char* name, std::string* out, const char* help);
  void Int(const char* name, int64_t* out, const char* help);
  void Double(const char* name, double* out, const char* help);
  void Bool(const char* name, bool* out, const char* help);

  // Parses args (the words after the subcommand). On --help, sets help_requested() and stops.
  Status Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // Names of the flags that were given on the command line.
  bool WasSet(const std::string& name) const;
  std::string Help() const;

  // What Help() lists of one flag, and docs/cli.md too (cli_reference.h).
  struct Doc {
    std::string name;   // "max-tokens"
    std::string value;  // "" (a switch), "TEXT", "N" (an integer) or "X" (a number)
    std::string help;
    std::string default_text;  // "" when the default is empty or the flag is a switch
  };
  std::vector<Doc> Docs() const;  // in registration order
  const std::string& summary() const { return summary_; }

 private:
  enum class Type { kString, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Type type;
    void* out;
    std::string help;
    std::string default_text;
  };
  const Flag* Find(const std::string& name) const;
  Status Set(const Flag& flag, const std::string& value);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> set_;
  bool help_requested_ = false;
};

}  // namespace moeserve::cli
