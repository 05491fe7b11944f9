// moeserve bench serve: being written (issue 7).
#include "cli/commands.h"

namespace moeserve::cli {

int RunBenchServe(const std::vector<std::string>& args) {
  (void)args;
  return RuntimeError("bench serve", Unimplemented("not built yet"));
}

}  // namespace moeserve::cli
