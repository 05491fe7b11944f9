// Test data shared by the tokenizer tests: the real Qwen3 tokenizer and its goldens in
// testdata/qwen3-tokenizer (README.md there says where they come from).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "core/test_paths.h"

namespace moeserve::tokenizer::testing {

inline const std::string kQwen3Dir = std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer";

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One JSON object per line.
inline std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(ReadFileOrDie(path));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// The Qwen3 tokenizer, loaded once per test binary (the file is 11 MB).
inline const Tokenizer& Qwen3() {
  static const Tokenizer* tokenizer = [] {
    Result<std::unique_ptr<Tokenizer>> loaded = Tokenizer::LoadFromDir(kQwen3Dir);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().ToString();
      std::abort();
    }
    return std::move(*loaded).release();
  }();
  return *tokenizer;
}

struct EncodeCase {
  std::string id;
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

inline std::vector<EncodeCase> EncodeCases() {
  std::vector<EncodeCase> cases;
  for (const nlohmann::json& j : ReadJsonl(kQwen3Dir + "/encode_cases.jsonl")) {
    cases.push_back({j.at("id").get<std::string>(), j.at("text").get<std::string>(),
                     j.at("ids").get<std::vector<int32_t>>(), j.at("decoded").get<std::string>()});
  }
  return cases;
}

struct ChatCase {
  std::string id;
  std::string rendered;
  std::vector<int32_t> ids;
};

// Both chat golden files (the Qwen3 template's and the Qwen3-Next thinking template's).
inline std::vector<ChatCase> ChatCases() {
  std::vector<ChatCase> cases;
  for (const char* file : {"chat_cases.jsonl", "chat_cases_qwen3_next_thinking.jsonl"}) {
    for (const nlohmann::json& j : ReadJsonl(kQwen3Dir + "/" + file)) {
      cases.push_back({std::string(file) + ":" + j.at("id").get<std::string>(),
                       j.at("rendered").get<std::string>(),
                       j.at("ids").get<std::vector<int32_t>>()});
    }
  }
  return cases;
}

}  // namespace moeserve::tokenizer::testing
