// moeserve chat: being written (issue 7).
#include "cli/commands.h"

namespace moeserve::cli {

int RunChat(const std::vector<std::string>& args) {
  (void)args;
  return RuntimeError("chat", Unimplemented("not built yet"));
}

}  // namespace moeserve::cli
