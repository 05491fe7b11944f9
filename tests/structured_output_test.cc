// Structured output through `moeserve generate` as a user runs it: every test schema, regex and
// choice list of structured/testdata, sampled at temperature 1 from the default model and from a
// random-weight model (whose outputs are adversarial random walks through the grammar); each
// finished output is checked by validators independent of moeserve (Python's jsonschema and re,
// structured/testdata/validate.py). Speculative decoding changes no output: drafts are verified
// against the grammar's mask at every position.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTestdata = fs::path(MOESERVE_SOURCE_DIR) / "structured" / "testdata";

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_structured_output_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    const e2e::CommandResult made = e2e::RunMoeserve(
        fmt::format("make-model --arch qwen3_next --preset tiny --seed 11 --out {}",
                    (*dir_ / "random").string()),
        *dir_ / "make_model.err");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // One line per test schema, regex and choice list, sampled at temperature 1 (seeded).
  static std::vector<json> Lines(int seed) {
    std::vector<json> lines;
    std::ifstream schemas(kTestdata / "schemas.jsonl");
    for (std::string line; std::getline(schemas, line);) {
      if (line.empty()) continue;
      lines.push_back(
          {{"prompt", "Answer in JSON:"}, {"guided_json", json::parse(line)["schema"]}});
    }
    std::ifstream regexes(kTestdata / "regexes.txt");
    for (std::string line; std::getline(regexes, line);) {
      if (!line.empty()) lines.push_back({{"prompt", "Answer:"}, {"guided_regex", line}});
    }
    lines.push_back({{"prompt", "Yes or no?"}, {"guided_choice", {"yes", "no", "not sure"}}});
    lines.push_back({{"prompt", "Any object:"}, {"response_format", {{"type", "json_object"}}}});
    for (size_t i = 0; i < lines.size(); ++i) {
      lines[i]["temperature"] = 1.0;
      lines[i]["seed"] = seed * 1000 + static_cast<int>(i);
      lines[i]["max_tokens"] = 160;
    }
    return lines;
  }

  // `generate --json` over the lines; its "requests", in line order.
  static json Generate(const std::string& model_flag, const std::vector<json>& lines,
                       const std::string& flags = "") {
    std::string text;
    for (const json& line : lines) text += line.dump() + "\n";
    const fs::path file = *dir_ / "lines.jsonl";
    e2e::WriteFile(file, text);
    const e2e::CommandResult r = e2e::RunMoeserve(
        fmt::format("generate {} --prompts-file {} --json {}", model_flag, file.string(), flags),
        *dir_ / "generate.err");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["requests"] : json::array();
  }

  // Every finished output checked by validate.py (json, regex) or here (choice, json_object);
  // returns how many finished.
  static int Validate(const std::vector<json>& lines, const json& requests) {
    EXPECT_EQ(requests.size(), lines.size());
    std::string cases;
    int finished = 0;
    for (const json& r : requests) {
      const json& line = lines.at(r["index"].get<size_t>());
      const std::string text = r["text"];
      if (r["finish_reason"] != "stop") {
        EXPECT_EQ(r["finish_reason"], "length");
        continue;
      }
      ++finished;
      if (line.contains("guided_json")) {
        cases += json{{"kind", "json"}, {"schema", line["guided_json"]}, {"output", text}}.dump();
      } else if (line.contains("guided_regex")) {
        cases +=
            json{{"kind", "regex"}, {"pattern", line["guided_regex"]}, {"output", text}}.dump();
      } else if (line.contains("guided_choice")) {
        const std::set<std::string> choices = line["guided_choice"];
        EXPECT_TRUE(choices.count(text)) << text;
        continue;
      } else {
        EXPECT_TRUE(json::accept(text) && json::parse(text).is_object()) << text;
        continue;
      }
      cases += "\n";
    }
    const fs::path file = *dir_ / "validate.jsonl";
    e2e::WriteFile(file, cases);
    const e2e::CommandResult v = e2e::RunShell(
        fmt::format("python3 {} {}", (kTestdata / "validate.py").string(), file.string()),
        *dir_ / "validate.err");
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
    return finished;
  }

  static fs::path* dir_;
};

fs::path* StructuredOutputTest::dir_ = nullptr;

TEST_F(StructuredOutputTest, DefaultModelOutputsValidate) {
  const std::vector<json> lines = Lines(1);
  const json requests = Generate("", lines);
  const int finished = Validate(lines, requests);
  EXPECT_GE(finished, static_cast<int>(lines.size()) / 2);
}

TEST_F(StructuredOutputTest, RandomModelOutputsValidate) {
  const std::vector<json> lines = Lines(2);
  const json requests = Generate("--model " + (*dir_ / "random").string(), lines);
  const int finished = Validate(lines, requests);
  EXPECT_GE(finished, static_cast<int>(lines.size()) / 2);
}

// Properties come in the schema's order as written in the line (a parsed object's keys are
// sorted; the schema is taken from the line's text).
TEST_F(StructuredOutputTest, PropertiesFollowTheSchemasOrder) {
  const std::string line =
      R"({"prompt": "Think, then answer:", "temperature": 1.0, "seed": 9, "max_tokens": 120,
          "guided_json": {"type": "object", "properties": {"zeta": {"type": "boolean"},
          "reasoning": {"type": "string", "maxLength": 20}, "answer": {"enum": [1, 2]}},
          "required": ["zeta", "reasoning", "answer"]}})";
  const fs::path file = *dir_ / "order.jsonl";
  std::string one_line = line;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  e2e::WriteFile(file, one_line + "\n");
  const e2e::CommandResult r = e2e::RunMoeserve(
      fmt::format("generate --prompts-file {} --json", file.string()), *dir_ / "order.err");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out)["requests"][0];
  ASSERT_EQ(out["finish_reason"], "stop") << out.dump();
  const std::string text = out["text"];
  const size_t zeta = text.find("\"zeta\""), reasoning = text.find("\"reasoning\""),
               answer = text.find("\"answer\"");
  EXPECT_TRUE(zeta < reasoning && reasoning < answer && answer != std::string::npos) << text;
}

TEST_F(StructuredOutputTest, SpeculationChangesNoOutput) {
  // Greedy and sampled rows: greedy JSON repeats itself, so n-gram drafts get accepted.
  std::vector<json> lines = Lines(3);
  lines.resize(24);
  for (size_t i = 0; i < lines.size(); i += 2) lines[i]["temperature"] = 0;
  const json plain = Generate("", lines);
  const json speculative = Generate("", lines, "--spec ngram:3 --spec-disable-batch-size 0");
  ASSERT_EQ(plain.size(), speculative.size());
  int64_t accepted = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i]["token_ids"], speculative[i]["token_ids"]) << lines[i].dump();
    accepted += speculative[i]["spec"].value("num_accepted_tokens", int64_t{0});
  }
  EXPECT_GT(accepted, 0) << "no draft was ever accepted: the test checks nothing";
  Validate(lines, speculative);
}

// Rows are independent: a plain request gives the same tokens alone and batched with
// constrained neighbours (greedy and seeded sampling alike).
TEST_F(StructuredOutputTest, AConstrainedNeighbourChangesNoOtherOutput) {
  const std::vector<json> plain = {
      {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}},
      {{"prompt", "The king said"}, {"max_tokens", 40}, {"temperature", 1.0}, {"seed", 7}}};
  std::vector<json> mixed = plain;
  std::vector<json> constrained = Lines(4);
  constrained.resize(6);
  mixed.insert(mixed.end(), constrained.begin(), constrained.end());
  const json alone = Generate("", plain);
  const json batched = Generate("", mixed, "--max-num-seqs 8");
  ASSERT_EQ(alone.size(), 2u);
  ASSERT_EQ(batched.size(), mixed.size());
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(alone[i]["token_ids"], batched[i]["token_ids"]) << i;
}

TEST_F(StructuredOutputTest, FlagsAndBadSpecsAreClearErrors) {
  const fs::path schema = *dir_ / "schema.json";
  e2e::WriteFile(schema, R"({"type": "object", "properties": {"ok": {"type": "boolean"}},
                            "required": ["ok"]})");
  const e2e::CommandResult r = e2e::RunMoeserve(
      fmt::format("generate --prompt Hi --json-schema {} --temperature 1 --seed 4 --json "
                  "--max-tokens 40",
                  schema.string()),
      *dir_ / "flags.err");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out)["requests"][0];
  ASSERT_EQ(out["finish_reason"], "stop") << out.dump();
  const json value = json::parse(out["text"].get<std::string>());
  EXPECT_TRUE(value["ok"].is_boolean()) << value.dump();

  struct Bad {
    std::string flags;
    std::string says;
  };
  const Bad bad[] = {
      {"--regex 'a+' --choice a,b", "one kind of structured output"},
      {"--json-schema /nonexistent.json", "--json-schema"},
      {"--json-schema /dev/zero", "more than"},
      {"--regex '(a'", "regex"},
      {fmt::format("--json-schema {}", (*dir_ / "not_schema.json").string()), "not"},
  };
  e2e::WriteFile(*dir_ / "not_schema.json", R"({"type": "object", "not": {}})");
  for (const Bad& b : bad) {
    const e2e::CommandResult e =
        e2e::RunMoeserve("generate --prompt Hi --max-tokens 4 " + b.flags, *dir_ / "bad.err");
    EXPECT_NE(e.exit_code, 0) << b.flags;
    EXPECT_NE(e.err.find(b.says), std::string::npos) << b.flags << ": " << e.err;
  }
}

}  // namespace
}  // namespace moeserve
