// Helpers of the end-to-end tests that run the moeserve binary (MOESERVE_BINARY) as a user would.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/test_paths.h"

namespace moeserve::e2e {

struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Runs a shell command line (as written); stderr goes through err_file.
inline CommandResult RunShell(const std::string& command, const std::filesystem::path& err_file) {
  const std::string cmd = command + " 2>" + err_file.string();
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, ReadFile(err_file)};
}

// Runs `moeserve <args>` through the shell (args as written); stderr goes through err_file.
inline CommandResult RunMoeserve(const std::string& args, const std::filesystem::path& err_file) {
  return RunShell(std::string(MOESERVE_BINARY) + " " + args, err_file);
}

}  // namespace moeserve::e2e
