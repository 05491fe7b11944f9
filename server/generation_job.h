// GenerationJob: one /v1/completions or /v1/chat/completions request as its handler thread sees
// it -- the choices' tokens from the engine loop's Channel, run through a detokenizer each (which
// finds the stop strings), and the OpenAI response or SSE events made of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/engine_loop.h"
#include "server/openai_json.h"
#include "server/output_parser.h"
#include "server/request_check.h"
#include "structured/grammar_cache.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

// A choice's tokens so far and the text they decoded to.
struct ChoiceState {
  // `sampling`: the request's, shared by its choices (the detokenizer reads its stop strings).
  ChoiceState(const tokenizer::Tokenizer& tok,
              const std::shared_ptr<const engine::PreparedParams>& sampling, size_t prompt_index);
  tokenizer::IncrementalDetokenizer detok;
  size_t prompt = 0;  // which of the request's prompts
  // When the params ask for them (the engine sends them once, with the first tokens).
  std::vector<engine::SampledToken> prompt_logprobs;
  bool prompt_logprobs_arrived = false;
  bool echoed = false;                 // stream: the prompt (echo) went out
  ordered_json stop_reason = nullptr;  // vLLM's: the stop string or stop token id that ended it
  std::vector<int32_t> tokens;
  std::vector<engine::SampledToken> logprobs;
  std::string text;
  bool finished = false;
  engine::FinishReason reason = engine::FinishReason::kNone;
  int64_t text_offset = 0;        // completions logprobs' running text_offset
  int64_t num_cached_tokens = 0;  // prompt tokens the prefix cache supplied
  // Chat with a reasoning or tool-call parser: the text read into reasoning, content and calls.
  std::optional<OutputParser> parser;
};

// What one Pull added to a choice.
struct Delta {
  bool prompt_logprobs_arrived = false;  // this Pull brought the choice's prompt logprobs
  size_t num_tokens = 0;                 // new tokens (their text may be held back: empty)
  std::string text;
  std::vector<engine::SampledToken> logprobs;
  bool finished = false;  // this Pull finished the choice
  MessageDelta message;   // with a parser: what `text` added to the message
};

struct GenerationJob {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;
  int64_t created = 0;
  std::string model;
  // The checked request; its sampling parameters moved into `sampling` (request.params is reset
  // to the defaults: read params()).
  GenerationRequest request;
  // The sampling parameters, validated and normalized, held once: the choices' engine requests
  // and detokenizers share them.
  std::shared_ptr<const engine::PreparedParams> sampling;
  // The prompts' ids and, for echo, their text (the request's own, or the ids decoded).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  EngineLoop* loop = nullptr;
  const tokenizer::Tokenizer* tok = nullptr;
  // Compiles (or finds) a request's structured output grammar; null: such requests are refused.
  structured::GrammarCache* grammars = nullptr;
  // The server's parsers of chat answers (none: the text is the content).
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  std::shared_ptr<Channel> channel;
  std::vector<ChoiceState> choices;  // n per prompt: choice p * n + j is prompt p's j-th
  bool stream_started = false;
  bool stream_done = false;

  // Takes the checked request: prepares its parameters once (`sampling`), fills `choices` (n per
  // prompt, in vLLM's order: choice p * n + j is prompt p's j-th) and returns the engine's
  // requests, one per choice, for EngineLoop::Submit (PrepareChoices; a failure to prepare is a
  // single failed input, which Submit reports on the channel). Needs `loop` and `tok`. Runs on
  // the handler's thread: whatever a request costs to prepare is paid here, its grammar's
  // compile included.
  std::vector<ChoiceInput> Start(CheckedRequest checked);
  const engine::SamplingParams& params() const { return sampling->params; }

  bool finished() const;
  int64_t prompt_tokens() const;
  int64_t completion_tokens() const;
  // Prompt tokens the prefix cache supplied: per prompt, its choices' most.
  int64_t cached_tokens() const;

  // Waits up to `timeout` for tokens and turns them into text. As `generate` does, the token
  // that completes a stop string is the last one kept; its choice is then aborted as stopped.
  // An error is the engine's refusal or failure.
  Status Pull(std::chrono::milliseconds timeout, std::vector<Delta>* deltas);

  // The non-stream response (after every choice finished).
  ordered_json Response();

  // The SSE events that are ready after waiting up to `timeout`: chat's opening role deltas,
  // the choices' deltas, then, once every choice finished, the usage chunk (when asked) and
  // [DONE]. An error after the stream started is an event too, as vLLM sends it.
  std::string NextEvents(std::chrono::milliseconds timeout);

 private:
  bool chat() const { return endpoint == Endpoint::kChat; }
  bool echo() const { return request.echo && !chat(); }
  // A chat choice's parser options when the server has a parser the request uses (reasoning, or
  // tool calls with tools and tool_choice other than none); nullopt: the text is the content.
  std::optional<OutputParserOptions> ParserOptions() const;
  // tool_choice "required" or a function: the request's grammar is its tools' calls, in the
  // model's format (structured/tool_calls_grammar.h). With thinking on, any grammar applies after
  // </think>.
  Status ConstrainToolCalls(const std::optional<OutputParserOptions>& parsing);
  ordered_json LogprobsJson(const std::vector<engine::SampledToken>& logprobs,
                            int64_t* text_offset) const;
  // Completions logprobs of `logprobs` (null when not asked), after the prompt's when
  // `with_prompt` (echo); offsets continue from the choice's text_offset.
  ordered_json CompletionLogprobs(ChoiceState& c, const std::vector<engine::SampledToken>& logprobs,
                                  bool with_prompt) const;
  // The stream may send choice i's first chunk: with echo, not before its prompt logprobs.
  bool EchoReady(const ChoiceState& c) const;
  // A stream chunk of choice i: its text delta (chat: the message delta), logprobs and, on the
  // last one, finish_reason.
  ordered_json Chunk(size_t i, const Delta& d, bool first);
  ordered_json UsageChunk() const;
};

}  // namespace moeserve::server
