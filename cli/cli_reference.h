// docs/cli.md, the command-line reference, rendered from the registry that prints --help: the
// subcommand table (commands.h) and each subcommand's FlagSet. `moeserve help --markdown` prints
// it; cli_reference_test fails when the committed file differs.
#pragma once

#include <string>

namespace moeserve::cli {

std::string CliReferenceMarkdown();

}  // namespace moeserve::cli
