// The embedded default model (models/default, trained by tools/train): it loads when --model is
// omitted, and greedy generation from a fixed prompt gives the committed expected output
// (tests/data/default_model_generation.json, written when the model was trained by
// tools/train/write_expected_generation.sh).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(DefaultModelTest, GreedyGenerationMatchesTheCommittedOutput) {
  unsetenv("MOESERVE_MODEL");  // the build's default, not the caller's
  const json expected = json::parse(e2e::ReadFile(fs::path(MOESERVE_SOURCE_DIR) / "tests" /
                                                  "data" / "default_model_generation.json"));
  const fs::path err = fs::temp_directory_path() / "moeserve_default_model_test.err";
  const std::string prompts = (fs::temp_directory_path() / "moeserve_default_model.jsonl").string();
  e2e::WriteFile(prompts, json{{"prompt", expected["prompt"]},
                               {"max_tokens", expected["max_tokens"]},
                               {"temperature", 0}}
                                  .dump() +
                              "\n");
  const e2e::CommandResult r = e2e::RunMoeserve("generate --json --prompts-file " + prompts, err);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json got = json::parse(r.out)["requests"][0];
  EXPECT_EQ(got["token_ids"], expected["token_ids"]);
  EXPECT_EQ(got["text"], expected["text"]);
}

}  // namespace
}  // namespace moeserve
