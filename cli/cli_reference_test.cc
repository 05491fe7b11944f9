// docs/cli.md is what `moeserve help --markdown` prints: the reference follows the flags.
#include "cli/cli_reference.h"
#include "core/test_paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace moeserve::cli {
namespace {

TEST(CliReferenceTest, DocsMatchTheFlagRegistry) {
  const std::string path = std::string(MOESERVE_SOURCE_DIR) + "/docs/cli.md";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream committed;
  committed << in.rdbuf();
  const std::string want = CliReferenceMarkdown();
  if (committed.str() == want) return;
  // The first line that differs, to say what changed.
  std::istringstream got_lines(committed.str()), want_lines(want);
  std::string got_line, want_line;
  int line = 1;
  for (;; ++line) {
    const bool got_more = static_cast<bool>(std::getline(got_lines, got_line));
    const bool want_more = static_cast<bool>(std::getline(want_lines, want_line));
    if (!got_more || !want_more || got_line != want_line) {
      if (!got_more) got_line = "(end of file)";
      if (!want_more) want_line = "(end of file)";
      break;
    }
  }
  ADD_FAILURE() << path << " differs from the flag registry (a subcommand's line or a flag "
                << "changed). Regenerate it: build/release/cli/moeserve help --markdown > "
                << "docs/cli.md\nline " << line << " is:\n  " << got_line
                << "\nthe registry prints:\n  " << want_line;
}

TEST(CliReferenceTest, EverySubcommandHasASection) {
  const std::string markdown = CliReferenceMarkdown();
  for (const char* name :
       {"make-model", "train-tokenizer", "inspect", "logits", "tokenize", "detokenize", "generate",
        "chat", "serve", "bench latency", "bench serve"}) {
    EXPECT_NE(markdown.find(std::string("\n## `moeserve ") + name + "`\n"), std::string::npos)
        << name;
  }
  // A flag of each kind, with its default.
  EXPECT_NE(markdown.find("| `--port` | integer | `8000` |"), std::string::npos);
  EXPECT_NE(markdown.find("| `--ignore-eos` | switch |  |"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::cli
