// moeserve generate: one prompt (--prompt TEXT, --token-ids) or a file of them (--prompts-file,
// one JSON request per line) through the engine, all requests added at once and run
// concurrently, sampled with vLLM's SamplingParams (n > 1 fans out into n engine requests, stop
// strings are found by the detokenizer); prints each request's text (a single prompt streams it)
// or, with --json, token ids, text, finish reason, timings and logprobs per request and choice
// (docs/cli.md). Unlike vLLM, temperature defaults to 0 (greedy) so that runs are reproducible.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "cli/activation_dump.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_files.h"
#include "cli/model_flags.h"
#include "cli/prompts_file.h"
#include "cli/sampling_flags.h"
#include "core/check.h"
#include "core/json.h"
#include "core/timer.h"
#include "engine/sampling_json.h"
#include "io/model_config.h"
#include "model/model_files.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

using engine::ApplySamplingKey;
using engine::SamplingKeys;

constexpr char kCommand[] = "generate";

using nlohmann::json;
using nlohmann::ordered_json;

// vLLM's defaults, except temperature: greedy unless asked, so that a run repeats.
engine::SamplingParams GenerateDefaults() {
  engine::SamplingParams p;
  p.temperature = 0;
  return p;
}

struct Options {
  ModelFlags model;
  EngineFlags engine;
  std::string prompt;
  std::string token_ids;
  std::string prompts_file;
  // The sampling flags: the defaults of the --prompts-file lines that do not set a key. Plain
  // numbers and switches write straight into `sampling`; the rest go through the JSON reader as
  // a line's keys do (SamplingDefaults).
  engine::SamplingParams sampling = GenerateDefaults();
  int64_t seed = -1;
  std::string stop;
  std::string stop_token_ids;
  int64_t logprobs = 0;
  int64_t prompt_logprobs = 0;
  // Structured output of every request (a line's own key replaces it).
  std::string json_schema_file;
  std::string regex;
  std::string choice;
  std::string grammar_file;
  bool json = false;
  std::string dump_activations;
  bool max_num_seqs_given = false;  // --max-num-seqs was on the command line
};

// ---- Sampling parameters ----

// The flag of a sampling key: --key-with-dashes.
std::string FlagName(std::string_view key) {
  std::string flag = "--" + std::string(key);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// A single prompt's parameters all come from flags: where a message starts with the parameter's
// name (as SamplingParams::Validate's do), name the flag instead.
Status NameTheFlag(const Status& s) {
  const std::string& message = s.message();
  const std::string_view first = std::string_view(message).substr(0, message.find(' '));
  const std::span<const std::string_view> keys = SamplingKeys();
  if (std::find(keys.begin(), keys.end(), first) == keys.end()) return s;
  return Status(s.code(), FlagName(first) + message.substr(first.size()));
}

json ParseJsonOrDiscarded(const std::string& text) {
  Result<json> j = ParseJson(text, "");
  return j.ok() ? std::move(*j) : json(json::value_t::discarded);
}

// --json-schema FILE, --regex R, --choice a,b, --grammar FILE: the guided_* key of each, so that a
// flag and a line mean the same; one of them at most.
Status StructuredOutputFlags(const Options& o, const FlagSet& flags, engine::SamplingParams& p) {
  const size_t max_bytes = structured::Limits{}.max_spec_bytes;
  const char* given = nullptr;
  for (const char* flag : {"json-schema", "regex", "choice", "grammar"}) {
    if (!flags.WasSet(flag)) continue;
    if (given != nullptr) {
      return InvalidArgument("--{} and --{}: give one kind of structured output", given, flag);
    }
    given = flag;
  }
  if (given == nullptr) return OkStatus();
  const std::string flag = fmt::format("--{}", given);
  json value;
  std::string_view key;
  if (flags.WasSet("json-schema")) {
    Result<std::string> text = ReadTextFile(o.json_schema_file, max_bytes);
    if (!text.ok()) return text.status().WithContext(flag);
    value = std::move(*text);
    key = "guided_json";
  } else if (flags.WasSet("grammar")) {
    Result<std::string> text = ReadTextFile(o.grammar_file, max_bytes);
    if (!text.ok()) return text.status().WithContext(flag);
    value = std::move(*text);
    key = "guided_grammar";
  } else if (flags.WasSet("regex")) {
    value = o.regex;
    key = "guided_regex";
  } else {
    value = json::array();
    for (size_t start = 0;;) {
      const size_t comma = o.choice.find(',', start);
      value.push_back(o.choice.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    key = "guided_choice";
  }
  bool known = false;
  RETURN_IF_ERROR(ApplySamplingKey(key, value, p, &known).WithContext(flag));
  CHECK(known) << key;
  return OkStatus();
}

// The flags' SamplingParams. The flags that are not plain numbers -- the seed (-1: none), stop
// strings, stop ids, logprobs (which exist only when given) -- are read as JSON values of their
// keys, so that a flag and a line mean the same.
Result<engine::SamplingParams> SamplingDefaults(const Options& o, const FlagSet& flags) {
  engine::SamplingParams p = o.sampling;
  const std::pair<std::string_view, json> values[] = {
      {"seed", o.seed},
      {"stop", o.stop},
      {"stop_token_ids", ParseJsonOrDiscarded("[" + o.stop_token_ids + "]")},
      {"logprobs", o.logprobs},
      {"prompt_logprobs", o.prompt_logprobs},
  };
  for (const auto& [key, value] : values) {
    const std::string flag = FlagName(key);
    if (!flags.WasSet(flag.substr(2))) continue;
    if (value.is_discarded()) {  // only the JSON made of --stop-token-ids can be malformed
      return InvalidArgument("{}: expected comma-separated token ids, e.g. 1,2", flag);
    }
    bool known = false;
    RETURN_IF_ERROR(ApplySamplingKey(key, value, p, &known).WithContext(flag));
    CHECK(known) << key;
  }
  RETURN_IF_ERROR(StructuredOutputFlags(o, flags, p));
  return p;
}

// The one request of --prompt / --token-ids, sampled as the flags say.
Result<RequestSpec> SinglePrompt(const Options& o, const ParseContext& ctx,
                                 const engine::SamplingParams& params) {
  RequestSpec spec{0, o.prompt.empty() ? "--token-ids" : "--prompt", {}, params, nullptr};
  RETURN_IF_ERROR(NameTheFlag(PrepareParams(ctx, spec)));
  if (o.prompt.empty()) {
    ASSIGN_OR_RETURN(spec.prompt, ParseTokenIds(o.token_ids, ctx.vocab_size));  // names the flag
    return spec;
  }
  Result<std::vector<int32_t>> encoded = EncodePrompt(ctx, o.prompt);
  if (!encoded.ok()) return encoded.status().WithContext("--prompt");
  spec.prompt = std::move(*encoded);
  return spec;
}

// ---- Running ----

// What the run saw of one engine request: choice `choice` of specs[spec]. Times are from the
// start of the run.
struct RequestResult {
  size_t spec = 0;
  int64_t choice = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<tokenizer::IncrementalDetokenizer> detok;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  double first_token_ms = 0;
  double last_token_ms = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens the prefix cache supplied
  int64_t num_preemptions = 0;
  engine::SpecDecodeStats spec_decode;  // drafts and their acceptance
  // When asked: one per output token, and one per prompt token after the first.
  std::vector<engine::SampledToken> logprobs;
  std::vector<engine::SampledToken> prompt_logprobs;

  bool hit_stop_string() const { return detok && detok->stopped(); }
  double tpot_ms() const {
    return tokens.size() > 1
               ? (last_token_ms - first_token_ms) / static_cast<double>(tokens.size() - 1)
               : 0;
  }
};

// How the run reports progress as it goes: text as it is decoded (a single prompt's stream),
// and each request when it finishes.
struct RunCallbacks {
  std::function<void(size_t request, const std::string& piece)> on_text;
  std::function<void(size_t request, const RequestResult& result)> on_finish;
};

// Adds every choice of every request (in input order, then choice order: the order of the
// results), then steps the engine until all have finished. A request the engine rejects (a
// prompt longer than max_model_len, ...) is a usage error naming it.
Result<std::vector<RequestResult>> RunRequests(engine::Engine& engine,
                                               const std::vector<RequestSpec>& specs,
                                               const tokenizer::Tokenizer* tok,
                                               ActivationDump* dump, const RunCallbacks& cb,
                                               double* wall_ms) {
  std::vector<RequestResult> results;
  std::unordered_map<int64_t, size_t> result_of;  // engine id -> index into results
  for (size_t s = 0; s < specs.size(); ++s) {
    const std::vector<engine::SamplingParams> choices = engine::FanOut(specs[s].params);
    for (size_t c = 0; c < choices.size(); ++c) {
      Result<int64_t> id = engine.AddRequest(specs[s].prompt, choices[c], specs[s].grammar);
      if (!id.ok()) {
        return id.status().WithContext(
            fmt::format("request {} ({})", specs[s].index, specs[s].origin));
      }
      result_of[*id] = results.size();
      RequestResult& result = results.emplace_back();
      result.spec = s;
      result.choice = static_cast<int64_t>(c);
      if (tok) {
        result.detok.emplace(
            *tok, tokenizer::DetokenizerOptions{
                      .skip_special_tokens = choices[c].skip_special_tokens,
                      .stop = std::make_shared<const std::vector<std::string>>(choices[c].stop),
                      .include_stop_str_in_output = choices[c].include_stop_str_in_output,
                      .min_tokens = choices[c].min_tokens});
      }
    }
  }

  // Text as the detokenizer releases it: kept, and streamed when asked.
  const auto append_text = [&](size_t i, const std::string& piece) {
    results[i].text += piece;
    if (cb.on_text && !piece.empty()) cb.on_text(i, piece);
  };
  Stopwatch watch;
  std::vector<int64_t> finished;
  for (int64_t step = 0; engine.HasUnfinished(); ++step) {
    // The model's activation tap fires inside Step: name this step's files.
    if (dump) dump->set_prefix(fmt::format("step{}.", step));
    ASSIGN_OR_RETURN(const std::vector<engine::Request*>* updated, StepEngine(engine));
    const double now = watch.ElapsedMillis();
    finished.clear();
    for (const engine::Request* r : *updated) {
      const size_t i = result_of.at(r->id);
      RequestResult& result = results[i];
      if (result.tokens.empty()) result.first_token_ms = now;
      result.last_token_ms = now;
      // Output tokens only grow (a preempted request keeps them and recomputes their cache).
      // The token that completes a stop string is the last one kept, as vLLM keeps it; the
      // detokenizer cuts the text.
      // A stop token (EOS, stop_token_ids) that ends the request adds no text, as in vLLM.
      const bool stop_token = r->finished() && r->finish_reason == engine::FinishReason::kStop;
      for (size_t t = result.tokens.size();
           t < r->output_token_ids.size() && !result.hit_stop_string(); ++t) {
        result.tokens.push_back(r->output_token_ids[t]);
        const bool last = stop_token && t + 1 == r->output_token_ids.size();
        if (result.detok) append_text(i, result.detok->Add(r->output_token_ids[t], last));
      }
      // A no-op when the engine finished the request with this token anyway (max_tokens, EOS).
      if (result.hit_stop_string()) engine.Abort(r->id, engine::FinishReason::kStop);
      if (!r->finished()) continue;
      // A stop string wins over the engine's reason, as in vLLM's output processor.
      result.finish_reason =
          result.hit_stop_string() ? engine::FinishReason::kStop : r->finish_reason;
      result.num_cached_tokens = r->num_cached_tokens;
      result.num_preemptions = r->num_preemptions;
      result.spec_decode = r->spec;
      result.logprobs.assign(
          r->output_logprobs.begin(),
          r->output_logprobs.begin() + std::min(r->output_logprobs.size(), result.tokens.size()));
      result.prompt_logprobs = r->prompt_logprobs;
      if (result.detok) append_text(i, result.detok->Flush());
      if (cb.on_finish) cb.on_finish(i, result);
      finished.push_back(r->id);
    }
    // Released after the loop: `updated` points into the requests.
    for (int64_t id : finished) engine.Release(id);
  }
  *wall_ms = watch.ElapsedMillis();
  return results;
}

// ---- Output ----

// {"token", "logprob", "rank"}. JSON has no -inf: a token the model rules out gets vLLM's API
// floor, -9999.
ordered_json LogprobJson(const engine::TokenLogprob& t) {
  return {{"token", t.token}, {"logprob", std::max(t.logprob, -9999.0f)}, {"rank", t.rank}};
}

// One position: its token's entry plus "top", the most likely tokens.
ordered_json PositionJson(const engine::SampledToken& s) {
  ordered_json position = LogprobJson(s.sampled);
  ordered_json& top = position["top"] = ordered_json::array();
  for (const engine::TokenLogprob& t : s.top) top.push_back(LogprobJson(t));
  return position;
}

// Positions as a JSON array; `first_is_null` for prompt logprobs, as vLLM writes them (the first
// prompt token has nothing before it).
ordered_json PositionsJson(const std::vector<engine::SampledToken>& positions, bool first_is_null) {
  ordered_json out = ordered_json::array();
  if (first_is_null) out.push_back(nullptr);
  for (const engine::SampledToken& s : positions) out.push_back(PositionJson(s));
  return out;
}

// Drafts and their acceptance, vLLM's counters: per draft position, how often it was accepted.
ordered_json SpecJson(const engine::SpecDecodeStats& s) {
  return {{"num_drafts", s.num_drafts},
          {"num_draft_tokens", s.num_draft_tokens},
          {"num_accepted_tokens", s.num_accepted_tokens},
          {"num_accepted_tokens_per_pos", s.accepted_per_pos},
          {"acceptance_rate", s.acceptance_rate()},
          {"mean_acceptance_length", s.mean_acceptance_length()}};
}

// {"requests": [...]}, one per choice of each request in input order, with docs/cli.md's keys.
void PrintJson(const std::vector<RequestSpec>& specs, const std::vector<RequestResult>& results,
               bool has_text, bool spec_decode) {
  ordered_json requests = ordered_json::array();
  for (const RequestResult& r : results) {
    const RequestSpec& spec = specs[r.spec];
    ordered_json request;
    request["index"] = spec.index;
    request["choice"] = r.choice;
    request["token_ids"] = r.tokens;
    if (has_text) request["text"] = r.text;
    request["finish_reason"] = engine::FinishReasonName(r.finish_reason);
    request["ttft_ms"] = r.first_token_ms;
    request["tpot_ms"] = r.tpot_ms();
    request["num_prompt_tokens"] = spec.prompt.size();
    request["num_cached_tokens"] = r.num_cached_tokens;
    request["num_preemptions"] = r.num_preemptions;
    if (spec_decode) request["spec"] = SpecJson(r.spec_decode);
    if (spec.params.logprobs) request["logprobs"] = PositionsJson(r.logprobs, false);
    if (spec.params.prompt_logprobs) {
      request["prompt_logprobs"] = PositionsJson(r.prompt_logprobs, /*first_is_null=*/true);
    }
    requests.push_back(std::move(request));
  }
  ordered_json out;
  out["requests"] = std::move(requests);
  std::puts(out.dump(2, ' ', false, ordered_json::error_handler_t::replace).c_str());
}

int Run(const Options& o, const engine::SamplingParams& defaults) {
  const bool from_file = !o.prompts_file.empty();
  if (!o.prompt.empty() + !o.token_ids.empty() + from_file != 1) {
    return UsageError(kCommand, InvalidArgument("give exactly one of --prompt, --token-ids and "
                                                "--prompts-file"));
  }
  if (from_file && !o.dump_activations.empty()) {
    return UsageError(kCommand, InvalidArgument("--dump-activations works with a single prompt "
                                                "(--prompt or --token-ids)"));
  }
  for (Status s : {o.model.Validate(), o.engine.Validate()}) {
    if (!s.ok()) return UsageError(kCommand, s);
  }
  Result<std::string> dir = o.model.Dir();
  if (!dir.ok()) return RuntimeError(kCommand, dir.status());

  // The requests first, from config.json alone, so that a bad line fails before the weights
  // load. The tokenizer is needed for text prompts, stop strings and bad words; with token ids
  // it only adds the text.
  Result<io::ModelConfig> model_config = model::LoadModelConfigAt(*dir);
  if (!model_config.ok()) return RuntimeError(kCommand, model_config.status());
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = LoadModelTokenizer(*dir);
  std::optional<structured::GrammarCache> grammars;
  if (tok.ok()) {
    grammars.emplace(**tok, std::vector<int32_t>(model_config->eos_token_ids.begin(),
                                                 model_config->eos_token_ids.end()));
  }
  const ParseContext ctx{tok.ok() ? tok->get() : nullptr, tok.status(), model_config->vocab_size,
                         grammars ? &*grammars : nullptr};
  std::vector<RequestSpec> specs;
  if (from_file) {
    Result<std::vector<RequestSpec>> read = ReadPromptsFile(o.prompts_file, ctx, defaults);
    if (!read.ok()) return InputOrRuntimeError(kCommand, read.status());
    specs = std::move(*read);
  } else {
    Result<RequestSpec> single = SinglePrompt(o, ctx, defaults);
    if (!single.ok()) return InputOrRuntimeError(kCommand, single.status());
    specs.push_back(std::move(*single));
  }
  int64_t num_requests = 0;  // engine requests: a request's n choices each
  for (const RequestSpec& spec : specs) num_requests += spec.params.n;

  // A config the model rejects (--max-model-len past the model's, a KV cache too small for one
  // request) is the user's flags.
  engine::EngineConfig config = o.engine.ToConfig();
  // Unless given, no more sequences than requests: the default KV cache holds max_num_seqs
  // full-length requests, which for one prompt to a mid-size model would be 4 GiB to zero.
  if (!o.max_num_seqs_given) config.max_num_seqs = std::min(config.max_num_seqs, num_requests);
  if (std::optional<int> refused = CheckMemoryPlan(o.model, o.engine, config, kCommand)) {
    return *refused;
  }
  LoadedModel loaded = LoadOrFollow(o.model, kCommand);
  if (loaded.group == nullptr) return loaded.exit_code;
  model::ModelGroup& group = *loaded.group;
  model::CausalLm& lm = group.model();
  Result<std::unique_ptr<engine::Engine>> engine = CreateEngine(group, config);
  if (!engine.ok()) return UsageError(kCommand, engine.status());
  Result<std::unique_ptr<ActivationDump>> dump = ActivationDump::AttachTo(lm, o.dump_activations);
  if (!dump.ok()) return RuntimeError(kCommand, dump.status());

  // Plain output: a single prompt with one choice streams its text; otherwise each choice prints
  // whole as it finishes, "[index] text" ("[index.choice]" when n > 1; ids without a
  // tokenizer). --json prints everything at the end.
  const bool has_text = ctx.tok != nullptr;
  const bool single = !from_file && num_requests == 1;
  RunCallbacks cb;
  if (!o.json && single && has_text) {
    cb.on_text = [](size_t, const std::string& piece) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    };
  }
  if (!o.json && !single) {
    cb.on_finish = [&](size_t, const RequestResult& r) {
      const RequestSpec& spec = specs[r.spec];
      const std::string label = spec.params.n > 1 ? fmt::format("{}.{}", spec.index, r.choice)
                                                  : fmt::format("{}", spec.index);
      fmt::print("[{}] {}\n", label,
                 has_text ? r.text : fmt::format("{}", fmt::join(r.tokens, " ")));
      std::fflush(stdout);
    };
  }
  double wall_ms = 0;
  Result<std::vector<RequestResult>> results =
      RunRequests(**engine, specs, ctx.tok, dump->get(), cb, &wall_ms);
  if (!results.ok()) return InputOrRuntimeError(kCommand, results.status());
  if (*dump && !(*dump)->status().ok()) return RuntimeError(kCommand, (*dump)->status());

  if (o.json) {
    PrintJson(specs, *results, has_text, (*engine)->layout().spec.enabled());
  } else if (single) {
    const RequestResult& r = results->front();
    // With a tokenizer the text was streamed; without one, the ids are the output.
    if (has_text) {
      std::fputs("\n", stdout);
    } else {
      fmt::print("{}\n", fmt::join(r.tokens, " "));
    }
    const double tpot_ms = r.tpot_ms();
    fmt::print(stderr,
               "generate: {} prompt tokens, {} generated ({}); TTFT {:.1f} ms, TPOT {:.2f} ms "
               "({:.1f} tokens/s)\n",
               specs.front().prompt.size(), r.tokens.size(),
               engine::FinishReasonName(r.finish_reason), r.first_token_ms, tpot_ms,
               tpot_ms > 0 ? 1000.0 / tpot_ms : 0.0);
    if ((*engine)->layout().spec.enabled()) {
      fmt::print(stderr,
                 "generate: {} drafts, {} of {} draft tokens accepted ({:.1f} %), mean "
                 "acceptance length {:.2f}\n",
                 r.spec_decode.num_drafts, r.spec_decode.num_accepted_tokens,
                 r.spec_decode.num_draft_tokens, 100.0 * r.spec_decode.acceptance_rate(),
                 r.spec_decode.mean_acceptance_length());
    }
  } else {
    size_t generated = 0;
    for (const RequestResult& r : *results) generated += r.tokens.size();
    fmt::print(stderr, "generate: {} requests, {} generated tokens in {:.2f} s ({:.1f} tokens/s)\n",
               results->size(), generated, wall_ms * 1e-3,
               wall_ms > 0 ? generated * 1000.0 / wall_ms : 0.0);
  }
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve generate",
      "Generation through the engine with vLLM's sampling parameters: one prompt, or a\n"
      "file of requests run concurrently. Temperature defaults to 0 (greedy), not vLLM's\n"
      "1, so that a run repeats. --max-num-seqs defaults to the number of requests (at\n"
      "most 64).");
  o.model.Register(flags);
  o.engine.Register(flags);
  engine::SamplingParams& p = o.sampling;
  flags.String("prompt", &o.prompt, "prompt text, encoded with the model's tokenizer");
  flags.String("token-ids", &o.token_ids, "or: comma-separated prompt token ids, e.g. 1,2,3");
  flags.String("prompts-file", &o.prompts_file,
               "or: JSON lines, one request each: {\"prompt\": TEXT} or {\"token_ids\": [...]}, "
               "plus any of vLLM's sampling parameters by name (n, temperature, stop, logprobs, "
               "logit_bias, bad_words, ...); the flags below are their defaults");
  flags.Int("n", &p.n, "choices per request: n engine requests, seeded seed, seed + 1, ...");
  flags.Int("max-tokens", &p.max_tokens, "tokens to generate at most");
  flags.Bool("ignore-eos", &p.ignore_eos, "keep generating past the end-of-sequence token");
  flags.Double("temperature", &p.temperature,
               "0: greedy (generate's default, for reproducible runs; vLLM's is 1), up to 2");
  flags.Int("seed", &o.seed, "sampling seed of each request (-1: a random one)");
  RegisterSamplingFlags(flags, p);
  flags.String("stop", &o.stop, "a stop string: the text ends before it");
  flags.Bool("include-stop-str-in-output", &p.include_stop_str_in_output,
             "keep the stop string at the end of the text");
  flags.String("stop-token-ids", &o.stop_token_ids,
               "comma-separated ids that end a request (the id is kept)");
  flags.Int("logprobs", &o.logprobs,
            "with --json: per output token its logprob and rank and the N most likely tokens' "
            "(-1: all; not given: none)");
  flags.Int("prompt-logprobs", &o.prompt_logprobs,
            "with --json: the same per prompt token (not given: none)");
  flags.String("json-schema", &o.json_schema_file,
               "structured output: every output is JSON valid under the JSON Schema in this file "
               "(a line's guided_json, response_format or structured_outputs replaces it)");
  flags.String("regex", &o.regex, "structured output: every output matches this regex whole");
  flags.String("choice", &o.choice,
               "structured output: every output is one of these comma-separated strings");
  flags.String("grammar", &o.grammar_file,
               "structured output: every output is a sentence of the GBNF grammar in this file");
  flags.Bool("json", &o.json,
             "print JSON: per request and choice token ids, text, finish reason, TTFT, TPOT");
  flags.String("dump-activations", &o.dump_activations,
               "write named intermediates of every step as raw f32 into this folder (single "
               "prompt)");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  o.max_num_seqs_given = flags.WasSet("max-num-seqs");
  Result<engine::SamplingParams> defaults = SamplingDefaults(o, flags);
  if (!defaults.ok()) return UsageError(kCommand, defaults.status());
  return Run(o, *defaults);
}

}  // namespace moeserve::cli
