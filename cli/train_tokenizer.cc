// moeserve train-tokenizer: being written (issue 8).
#include "cli/commands.h"

namespace moeserve::cli {

int RunTrainTokenizer(const std::vector<std::string>& args) {
  (void)args;
  return RuntimeError("train-tokenizer", Unimplemented("not built yet"));
}

}  // namespace moeserve::cli
