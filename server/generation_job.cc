#include "server/generation_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "server/api_error.h"

namespace moeserve::server {

namespace {

// `more` after `*into`: each field's text appended; a call's arguments join its element when
// `more` goes on with the same call.
void AppendDelta(MessageDelta more, MessageDelta* into) {
  into->reasoning += more.reasoning;
  into->content += more.content;
  for (ToolCallDelta& call : more.tool_calls) {
    if (!into->tool_calls.empty() && into->tool_calls.back().index == call.index &&
        call.id.empty() && call.name.empty()) {
      into->tool_calls.back().arguments += call.arguments;
    } else {
      into->tool_calls.push_back(std::move(call));
    }
  }
}

}  // namespace

ChoiceState::ChoiceState(const tokenizer::Tokenizer& tok,
                         const std::shared_ptr<const engine::PreparedParams>& sampling,
                         size_t prompt_index)
    : detok(tok, {.skip_special_tokens = sampling->params.skip_special_tokens,
                  .stop = std::shared_ptr<const std::vector<std::string>>(sampling,
                                                                          &sampling->params.stop),
                  .include_stop_str_in_output = sampling->params.include_stop_str_in_output,
                  .min_tokens = sampling->params.min_tokens}),
      prompt(prompt_index) {}

std::vector<ChoiceInput> GenerationJob::Start(CheckedRequest checked) {
  CHECK(loop != nullptr && tok != nullptr) << "GenerationJob::Start needs loop and tok";
  request = std::move(checked.request);
  prompts = std::move(checked.prompts);
  prompt_texts = std::move(checked.prompt_texts);
  auto failed = [](Status error) {
    std::vector<ChoiceInput> inputs;
    inputs.push_back({std::move(error)});
    return inputs;
  };
  const std::optional<OutputParserOptions> parsing = ParserOptions();
  if (Status s = ConstrainToolCalls(parsing); !s.ok()) return failed(s);
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  if (const auto& spec = request.params.structured_outputs; spec.has_value()) {
    if (grammars == nullptr) return failed(InvalidArgument("structured output is not available"));
    Result<std::shared_ptr<const structured::CompiledGrammar>> compiled = grammars->Get(*spec);
    if (!compiled.ok()) return failed(compiled.status().WithContext("structured_outputs"));
    grammar = std::move(*compiled);
  }
  Result<std::shared_ptr<const engine::PreparedParams>> prepared =
      loop->engine().PrepareParams(std::move(request.params), std::move(grammar));
  request.params = {};
  if (!prepared.ok()) return failed(prepared.status());
  sampling = std::move(*prepared);
  const int64_t n = std::max<int64_t>(params().n, 1);
  choices.reserve(prompts.size() * n);
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t j = 0; j < n; ++j) {
      choices.emplace_back(*tok, sampling, p);
      if (parsing) choices.back().parser.emplace(*parsing);
    }
  }
  return PrepareChoices(loop->engine(), sampling, prompts);
}

std::optional<OutputParserOptions> GenerationJob::ParserOptions() const {
  if (!chat()) return std::nullopt;
  using ToolChoice = GenerationRequest::ToolChoice;
  OutputParserOptions o;
  o.reasoning = reasoning_format;
  if (request.tools != nullptr && request.tool_choice != ToolChoice::kNone) {
    o.tool_calls = tool_call_format;
    o.tools = request.tools;
    if (!request.parallel_tool_calls) o.limits.max_calls = 1;
  }
  if (o.reasoning == ReasoningFormat::kNone && o.tool_calls == ToolCallFormat::kNone) {
    return std::nullopt;
  }
  // Thinking is off when the request turned it off or the prompt closed it (Qwen3's template
  // writes an empty think block for enable_thinking false).
  const json kwargs = json::parse(request.chat_template_kwargs_json);
  const json thinking = kwargs.value("enable_thinking", json(true));
  o.thinking_enabled = !(thinking.is_boolean() && !thinking.get<bool>()) &&
                       !(prompt_texts.size() == 1 && PromptClosesThinking(prompt_texts[0]));
  return o;
}

namespace {

// Some tool of the request's `tools` (JSON text, checked) is marked "strict": true.
bool HasStrictTool(const std::string& tools_json) {
  const json tools = json::parse(tools_json, nullptr, false);
  if (!tools.is_array()) return false;
  return std::any_of(tools.begin(), tools.end(), [](const json& t) {
    return t.is_object() && t.contains("function") && t["function"].is_object() &&
           t["function"].value("strict", json(false)) == true;
  });
}

}  // namespace

Status GenerationJob::ConstrainToolCalls(const std::optional<OutputParserOptions>& parsing) {
  if (!chat()) return OkStatus();
  using ToolChoice = GenerationRequest::ToolChoice;
  engine::SamplingParams& p = request.params;
  if (request.tool_choice == ToolChoice::kRequired ||
      request.tool_choice == ToolChoice::kFunction) {
    if (tool_call_format == ToolCallFormat::kNone) {
      return InvalidArgument(
          "\"tool_choice\": calls are enforced in the model's call format, and this server reads "
          "none (serve --tool-call-parser)");
    }
    if (p.structured_outputs.has_value()) {
      return InvalidArgument(
          "\"tool_choice\" {} and structured output cannot be combined",
          request.tool_choice == ToolChoice::kRequired ? "\"required\"" : "naming a function");
    }
    // The tools as the client wrote them (tools_json), in the parser's format.
    const std::string spec = fmt::format(
        R"({{"format": "{}", "parallel": {}, "only": {}, "tools": {}}})",
        ToolCallFormatName(tool_call_format), request.parallel_tool_calls ? "true" : "false",
        request.tool_choice == ToolChoice::kFunction ? json(request.tool_choice_name).dump()
                                                     : "null",
        request.tools_json);
    p.structured_outputs =
        structured::GrammarSpec{structured::GrammarSpec::Kind::kToolCalls, spec, {}};
  } else if (request.tool_choice == ToolChoice::kAuto && request.tools != nullptr &&
             tool_call_format != ToolCallFormat::kNone && !p.structured_outputs.has_value() &&
             HasStrictTool(request.tools_json)) {
    // auto with "strict" tools: free text, but a call the model opens is held to its tool's
    // schema -- the grammar of one call wakes at the model's <tool_call> token and sleeps again
    // when the call is closed (llama.cpp's lazy grammar). Without such a token: not enforced.
    if (std::optional<int32_t> open = tok->TokenToId("<tool_call>")) {
      p.structured_outputs = structured::GrammarSpec{
          structured::GrammarSpec::Kind::kToolCalls,
          fmt::format(R"({{"format": "{}", "opened": true, "tools": {}}})",
                      ToolCallFormatName(tool_call_format), request.tools_json),
          {}};
      p.structured_outputs_after_token = *open;
      p.structured_outputs_rearm = true;
      return OkStatus();
    }
  }
  // A thinking model thinks freely; the grammar holds from its </think> on (vLLM starts
  // enforcing where its reasoning parser sees the reasoning end).
  if (p.structured_outputs.has_value() && parsing && parsing->reasoning != ReasoningFormat::kNone &&
      parsing->thinking_enabled) {
    if (std::optional<int32_t> end = tok->TokenToId("</think>")) {
      p.structured_outputs_after_token = *end;
    }
  }
  return OkStatus();
}

bool GenerationJob::finished() const {
  for (const ChoiceState& c : choices) {
    if (!c.finished) return false;
  }
  return true;
}

// vLLM counts each prompt once, however many choices it has.
int64_t GenerationJob::prompt_tokens() const {
  int64_t n = 0;
  for (const std::vector<int32_t>& p : prompts) n += static_cast<int64_t>(p.size());
  return n;
}

int64_t GenerationJob::cached_tokens() const {
  std::vector<int64_t> per_prompt(prompts.size(), 0);
  for (const ChoiceState& c : choices) {
    per_prompt[c.prompt] = std::max(per_prompt[c.prompt], c.num_cached_tokens);
  }
  int64_t n = 0;
  for (int64_t p : per_prompt) n += p;
  return n;
}

int64_t GenerationJob::completion_tokens() const {
  int64_t n = 0;
  for (const ChoiceState& c : choices) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

Status GenerationJob::Pull(std::chrono::milliseconds timeout, std::vector<Delta>* deltas) {
  std::vector<ChoiceUpdate> updates;
  RETURN_IF_ERROR(channel->Wait(timeout, &updates));
  deltas->assign(choices.size(), Delta{});
  for (size_t i = 0; i < choices.size(); ++i) {
    ChoiceState& c = choices[i];
    ChoiceUpdate& u = updates[i];
    Delta& d = (*deltas)[i];
    if (c.finished) continue;
    if (u.num_cached_tokens >= 0) c.num_cached_tokens = u.num_cached_tokens;
    if (u.has_prompt_logprobs) {
      c.prompt_logprobs = std::move(u.prompt_logprobs);
      c.prompt_logprobs_arrived = d.prompt_logprobs_arrived = true;
    }
    const bool was_stopped = c.detok.stopped();
    // The engine's kStop ends a choice on a stop token (EOS, stop_token_ids): the last one.
    const bool stop_token = u.finished && u.finish_reason == engine::FinishReason::kStop;
    for (size_t t = 0; t < u.tokens.size() && !c.detok.stopped(); ++t) {
      c.tokens.push_back(u.tokens[t]);
      ++d.num_tokens;
      if (t < u.logprobs.size()) d.logprobs.push_back(u.logprobs[t]);
      d.text += c.detok.Add(u.tokens[t], stop_token && t + 1 == u.tokens.size());
    }
    if (c.detok.stopped() && !was_stopped) {
      loop->AbortChoice(channel, i, engine::FinishReason::kStop);
    }
    if (u.finished) {
      c.finished = d.finished = true;
      // A stop string wins over the engine's reason, as in vLLM's output processor.
      c.reason = c.detok.stopped() ? engine::FinishReason::kStop : u.finish_reason;
      if (c.detok.stopped()) {
        c.stop_reason = params().stop[c.detok.stop_index()];
      } else if (stop_token && !c.tokens.empty() &&
                 std::count(params().stop_token_ids.begin(), params().stop_token_ids.end(),
                            c.tokens.back())) {
        c.stop_reason = c.tokens.back();
      }
      d.text += c.detok.Flush();
    }
    if (c.parser) {
      d.message = c.parser->Feed(d.text);
      if (u.finished) AppendDelta(c.parser->Finish(), &d.message);
    }
    c.text += d.text;
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  }
  return OkStatus();
}

ordered_json GenerationJob::LogprobsJson(const std::vector<engine::SampledToken>& logprobs,
                                         int64_t* text_offset) const {
  if (!params().logprobs) return nullptr;
  if (chat()) {
    return {{"content", ChatLogprobsContentJson(*tok, logprobs, *params().logprobs)}};
  }
  return CompletionLogprobsJson(*tok, logprobs, text_offset);
}

ordered_json GenerationJob::CompletionLogprobs(ChoiceState& c,
                                               const std::vector<engine::SampledToken>& logprobs,
                                               bool with_prompt) const {
  if (!params().logprobs) return nullptr;
  if (!with_prompt) return CompletionLogprobsJson(*tok, logprobs, &c.text_offset);
  ordered_json out =
      EchoedPromptLogprobsJson(*tok, prompts[c.prompt], c.prompt_logprobs, &c.text_offset);
  AppendCompletionLogprobs(out, CompletionLogprobsJson(*tok, logprobs, &c.text_offset));
  return out;
}

bool GenerationJob::EchoReady(const ChoiceState& c) const {
  return !params().logprobs || c.prompt_logprobs_arrived;
}

ordered_json GenerationJob::Response() {
  ordered_json out = Envelope(id, chat() ? "chat.completion" : "text_completion", created, model);
  ordered_json choices_json = ordered_json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    ChoiceState& c = choices[i];
    ordered_json choice = {{"index", i}};
    const char* reason = FinishReasonJson(c.reason);
    if (c.parser) {
      const ParsedMessage message = c.parser->message();
      choice["message"] = ChatMessageJson(message);
      reason = ChatFinishReason(message, reason);
    } else if (chat()) {
      choice["message"] = {
          {"role", "assistant"}, {"content", c.text}, {"tool_calls", ordered_json::array()}};
    } else {
      choice["text"] = echo() ? prompt_texts[c.prompt] + c.text : c.text;
    }
    choice["logprobs"] = chat() ? LogprobsJson(c.logprobs, &c.text_offset)
                                : CompletionLogprobs(c, c.logprobs, echo());
    choice["finish_reason"] = reason;
    choice["stop_reason"] = c.stop_reason;
    if (request.return_prompt_logprobs && !chat()) {
      choice["prompt_logprobs"] = PromptLogprobsJson(*tok, c.prompt_logprobs);
    }
    choices_json.push_back(std::move(choice));
  }
  out["choices"] = std::move(choices_json);
  // Chat has one prompt: its logprobs are the response's.
  if (request.return_prompt_logprobs && chat() && !choices.empty()) {
    out["prompt_logprobs"] = PromptLogprobsJson(*tok, choices[0].prompt_logprobs);
  }
  out["usage"] = UsageJson(prompt_tokens(), completion_tokens(), cached_tokens());
  return out;
}

ordered_json GenerationJob::Chunk(size_t i, const Delta& d, bool first) {
  ChoiceState& c = choices[i];
  ordered_json out =
      Envelope(id, chat() ? "chat.completion.chunk" : "text_completion", created, model);
  ordered_json choice = {{"index", i}};
  if (chat()) {
    ordered_json delta = c.parser && !first ? ChatDeltaJson(d.message) : ordered_json::object();
    if (first) delta["role"] = "assistant";
    if (first || (!c.parser && !d.text.empty())) delta["content"] = d.text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] =
        d.logprobs.empty() ? ordered_json(nullptr) : LogprobsJson(d.logprobs, &c.text_offset);
  } else {
    // With echo, the choice's first chunk carries the prompt before the first output.
    const bool echo_now = echo() && !c.echoed;
    c.echoed |= echo_now;
    choice["text"] = echo_now ? prompt_texts[c.prompt] + d.text : d.text;
    choice["logprobs"] = d.logprobs.empty() && !echo_now
                             ? ordered_json(nullptr)
                             : CompletionLogprobs(c, d.logprobs, echo_now);
  }
  const char* reason = FinishReasonJson(c.reason);
  if (c.parser && d.finished) reason = ChatFinishReason(c.parser->message(), reason);
  choice["finish_reason"] = d.finished ? ordered_json(reason) : ordered_json(nullptr);
  choice["stop_reason"] = d.finished ? c.stop_reason : ordered_json(nullptr);
  if (d.prompt_logprobs_arrived && request.return_prompt_logprobs) {
    const ordered_json prompt_logprobs = PromptLogprobsJson(*tok, c.prompt_logprobs);
    if (chat()) {
      out["prompt_logprobs"] = prompt_logprobs;
    } else {
      choice["prompt_logprobs"] = prompt_logprobs;
    }
  }
  out["choices"] = ordered_json::array({std::move(choice)});
  return out;
}

ordered_json GenerationJob::UsageChunk() const {
  ordered_json out =
      Envelope(id, chat() ? "chat.completion.chunk" : "text_completion", created, model);
  out["choices"] = ordered_json::array();
  out["usage"] = UsageJson(prompt_tokens(), completion_tokens(), cached_tokens());
  return out;
}

std::string GenerationJob::NextEvents(std::chrono::milliseconds timeout) {
  std::string events;
  if (!stream_started) {
    stream_started = true;
    if (chat()) {
      for (size_t i = 0; i < choices.size(); ++i) events += SseEvent(Chunk(i, Delta{}, true));
    }
  }
  std::vector<Delta> deltas;
  const Status s = Pull(timeout, &deltas);
  if (!s.ok()) {
    events += SseEvent(json::parse(ToApiError(s).Body()));
    events += kSseDone;
    stream_done = true;
    return events;
  }
  for (size_t i = 0; i < deltas.size(); ++i) {
    const Delta& d = deltas[i];
    const ChoiceState& c = choices[i];
    // A delta with new tokens is sent even when their text is held back (a partial character, a
    // possible stop string) or empty, as vLLM sends one per output; a prefill step's is not.
    const bool has_news =
        c.parser ? !d.message.empty() || !d.logprobs.empty() : d.num_tokens > 0 || !d.text.empty();
    if (has_news || d.finished || (d.prompt_logprobs_arrived && request.return_prompt_logprobs) ||
        (echo() && !c.echoed && EchoReady(c))) {
      events += SseEvent(Chunk(i, d, false));
    }
  }
  if (finished()) {
    if (request.include_usage) events += SseEvent(UsageChunk());
    events += kSseDone;
    stream_done = true;
  }
  return events;
}

}  // namespace moeserve::server
