// --prompts-file: one JSON request per line ({"prompt": TEXT} or {"token_ids": [...]} plus any of
// vLLM's sampling parameters), read into validated requests. Its own file so that the fuzz target
// of these lines runs the code `generate` runs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "structured/grammar_cache.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

// What parsing a request needs besides its text.
struct ParseContext {
  const tokenizer::Tokenizer* tok;  // null when the model folder has none
  Status tok_status;                // why there is none
  int64_t vocab_size;
  // Compiles the requests' structured output (null without a tokenizer: they are refused).
  structured::GrammarCache* grammars = nullptr;
};

// One request of the run, as parsed: where it came from, its prompt and how it samples. It
// becomes params.n engine requests, its choices.
struct RequestSpec {
  int64_t index = 0;   // 0-based line number in --prompts-file; 0 for a single prompt
  std::string origin;  // for messages: "--prompt", "--token-ids", "FILE:LINE" (1-based)
  std::vector<int32_t> prompt;
  engine::SamplingParams params;                               // validated, bad words resolved
  std::shared_ptr<const structured::CompiledGrammar> grammar;  // params.structured_outputs'
};

// What a request's parameters need of the tokenizer -- stop strings are matched on the
// detokenized text, bad words are tokenized here, structured output compiled into spec.grammar
// -- then vLLM's checks (InvalidArgument naming the parameter; they include the bad words' token
// ids).
Status PrepareParams(const ParseContext& ctx, RequestSpec& spec);

// A text prompt's ids (not empty, inside the vocabulary).
Result<std::vector<int32_t>> EncodePrompt(const ParseContext& ctx, const std::string& text);

// The requests of a --prompts-file's text: one per non-blank line, in order; `path` names the
// lines in messages ("PATH:LINE: ..."). Each starts from `defaults`.
Result<std::vector<RequestSpec>> ParsePromptsText(std::string_view text, const std::string& path,
                                                  const ParseContext& ctx,
                                                  const engine::SamplingParams& defaults);

// ParsePromptsText over the file at `path`.
Result<std::vector<RequestSpec>> ReadPromptsFile(const std::string& path, const ParseContext& ctx,
                                                 const engine::SamplingParams& defaults);

}  // namespace moeserve::cli
