// The text of a --prompts-file (one JSON request per line) through the reader `generate` uses,
// with the default model's tokenizer: an error naming the line, or requests whose prompts lie
// inside the vocabulary and whose parameters validate (structured output compiled). Never a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "cli/prompts_file.h"
#include "fuzz/served_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeserve;
  const fuzz::ServedModel& model = fuzz::LoadServedModel();
  static structured::GrammarCache grammars(
      *model.tok,
      std::vector<int32_t>(model.config.eos_token_ids.begin(), model.config.eos_token_ids.end()));
  const cli::ParseContext ctx{model.tok.get(), OkStatus(), model.config.vocab_size, &grammars};
  Result<std::vector<cli::RequestSpec>> specs = cli::ParsePromptsText(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.jsonl", ctx, {});
  if (!specs.ok()) {
    if (specs.status().message().rfind("fuzz.jsonl", 0) != 0 &&
        specs.status().message().find("fuzz.jsonl") == std::string::npos) {
      std::fprintf(stderr, "an error that names no line: %s\n", specs.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  for (const cli::RequestSpec& spec : *specs) {
    bool bad = spec.prompt.empty() || !spec.params.Validate(ctx.vocab_size).ok() ||
               spec.params.structured_outputs.has_value() != (spec.grammar != nullptr);
    for (int32_t id : spec.prompt) bad = bad || id < 0 || id >= ctx.vocab_size;
    if (bad) {
      std::fprintf(stderr, "%s: an unchecked request passed\n", spec.origin.c_str());
      std::abort();
    }
  }
  return 0;
}
