// For hf_compat/compare.mjs: encodes each {"text"} line of a JSON-lines file with the tokenizer in
// a folder and prints {"ids", "decoded", "skip"} per line (decoded with and without
// skip_special_tokens).
//
//   tokenizer_hf_driver DIR TEXTS.jsonl ADD_SPECIAL(0|1)
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  using moeserve::tokenizer::Tokenizer;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR TEXTS.jsonl ADD_SPECIAL(0|1)\n", argv[0]);
    return 2;
  }
  moeserve::Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  const bool add_special = std::string(argv[3]) == "1";
  std::ifstream in(argv[2], std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json request = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!request.is_object() || !request.contains("text") || !request["text"].is_string()) {
      std::fprintf(stderr, "bad line: %s\n", line.c_str());
      return 1;
    }
    moeserve::Result<std::vector<int32_t>> ids =
        (*tok)->Encode(request["text"].get<std::string>(), add_special);
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
      return 1;
    }
    nlohmann::ordered_json out;
    out["ids"] = *ids;
    out["decoded"] = (*tok)->Decode(*ids);
    out["skip"] = (*tok)->Decode(*ids, /*skip_special_tokens=*/true);
    std::puts(out.dump().c_str());
  }
  return 0;
}
