// moeserve generate: one prompt (--prompt TEXT, --token-ids) or a file of them (--prompts-file,
// one JSON request per line) through the engine, all requests added at once and run
// concurrently; prints each request's text (a single prompt streams it) or, with --json, token
// ids, text, finish reason and timings per request (CLI.md). Greedy only: sampling parameters
// are accepted at their greedy values until the sampling issue brings the sampler.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "cli/activation_dump.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_flags.h"
#include "core/timer.h"
#include "io/model_config.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "generate";

using nlohmann::json;

struct Options {
  ModelFlags model;
  EngineFlags engine;
  std::string prompt;
  std::string token_ids;
  std::string prompts_file;
  // Defaults for the --prompts-file lines that do not set them.
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  bool ignore_eos = false;
  // vLLM's sampling flags, accepted at their greedy values only (see SamplingParameters()).
  double temperature = 0;
  double top_p = 1;
  int64_t top_k = 0;
  double min_p = 0;
  int64_t seed = 0;
  bool json = false;
  std::string dump_activations;
  bool max_num_seqs_given = false;  // --max-num-seqs was on the command line
};

// An error in the user's input (a flag, a prompts-file line) is a usage error; anything else --
// a file that cannot be read, a model folder without a tokenizer -- a runtime failure.
int ErrorExit(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument ? UsageError(kCommand, s)
                                                  : RuntimeError(kCommand, s);
}

// ---- Sampling parameters (greedy values only for now) ----

// A vLLM sampling parameter and the values that leave greedy decoding unchanged.
struct SamplingParameter {
  const char* key;  // vLLM's name: the JSON key; the flag, where there is one, is --key-with-dashes
  bool integer;
  std::vector<double> greedy;  // empty: any value (the seed of a greedy run does nothing)
};

const std::vector<SamplingParameter>& SamplingParameters() {
  static const std::vector<SamplingParameter> kParameters = {
      {"temperature", false, {0}},
      {"top_p", false, {1}},
      {"top_k", true, {0, -1}},
      {"min_p", false, {0}},
      {"seed", true, {}},
      {"presence_penalty", false, {0}},
      {"frequency_penalty", false, {0}},
      {"repetition_penalty", false, {1}},
  };
  return kParameters;
}

const SamplingParameter* FindSamplingParameter(std::string_view key) {
  for (const SamplingParameter& p : SamplingParameters()) {
    if (key == p.key) return &p;
  }
  return nullptr;
}

// OK when `value` keeps decoding greedy; the caller puts the flag or key in front.
Status CheckGreedy(const SamplingParameter& p, double value) {
  if (p.greedy.empty() || std::find(p.greedy.begin(), p.greedy.end(), value) != p.greedy.end()) {
    return OkStatus();
  }
  return InvalidArgument(
      "{} needs sampling, which arrives with the sampling issue (greedy "
      "decoding only for now: {} {})",
      value, p.key, fmt::join(p.greedy, " or "));
}

Status CheckGreedyFlags(const Options& o) {
  const std::pair<const char*, double> flags[] = {{"temperature", o.temperature},
                                                  {"top_p", o.top_p},
                                                  {"top_k", static_cast<double>(o.top_k)},
                                                  {"min_p", o.min_p}};
  for (const auto& [key, value] : flags) {
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    RETURN_IF_ERROR(CheckGreedy(*FindSamplingParameter(key), value).WithContext(flag));
  }
  return OkStatus();
}

// ---- Requests ----

// One request of the run, as parsed: where it came from, its prompt and when it stops.
struct RequestSpec {
  int64_t index = 0;   // 0-based line number in --prompts-file; 0 for a single prompt
  std::string origin;  // for messages: "--prompt", "--token-ids", "FILE:LINE" (1-based)
  std::vector<int32_t> prompt;
  engine::StopConditions stop;
};

// What parsing a request needs besides its text.
struct ParseContext {
  const tokenizer::Tokenizer* tok;  // null when the model folder has none
  Status tok_status;                // why there is none
  int64_t vocab_size;
};

Result<std::vector<int32_t>> EncodePrompt(const ParseContext& ctx, const std::string& text) {
  // A folder without a (readable) tokenizer is a runtime failure, whatever the loader said.
  if (ctx.tok == nullptr) {
    return NotFound("a text prompt needs the model's tokenizer: {}", ctx.tok_status.message());
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ctx.tok->Encode(text));
  if (ids.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t id : ids) {
    // The folder's tokenizer and weights disagree: not the user's input.
    if (id >= ctx.vocab_size) {
      return OutOfRange("the tokenizer gives id {}, outside the model's vocabulary of {}", id,
                        ctx.vocab_size);
    }
  }
  return ids;
}

Result<int64_t> IntValue(const json& v, const char* key) {
  if (!v.is_number_integer()) return InvalidArgument("\"{}\" must be an integer", key);
  return v.get<int64_t>();
}

// A JSON array of token ids, each in [0, vocab_size).
Result<std::vector<int32_t>> TokenIdsValue(const json& v, const char* key, int64_t vocab_size) {
  if (!v.is_array()) return InvalidArgument("\"{}\" must be an array of token ids", key);
  std::vector<int32_t> ids;
  for (const json& id : v) {
    if (!id.is_number_integer()) {
      return InvalidArgument("\"{}\": {} is not an integer", key, id.dump());
    }
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= vocab_size) {
      return InvalidArgument("\"{}\": {} is outside the vocabulary [0, {})", key, value,
                             vocab_size);
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

// One --prompts-file line: {"prompt": TEXT} or {"token_ids": [...]} plus vLLM's request
// parameters -- max_tokens, min_tokens, ignore_eos, stop_token_ids, and the sampling ones at
// their greedy values. A null value means "not given". `spec.stop` holds the defaults on entry.
Status ParseRequestLine(const json& line, const ParseContext& ctx, RequestSpec& spec) {
  if (!line.is_object()) return InvalidArgument("expected a JSON object");
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> ids;
  for (const auto& [key, value] : line.items()) {
    if (value.is_null()) continue;
    if (key == "prompt") {
      if (!value.is_string()) return InvalidArgument("\"prompt\" must be a string");
      text = value.get<std::string>();
    } else if (key == "token_ids") {
      ASSIGN_OR_RETURN(ids, TokenIdsValue(value, "token_ids", ctx.vocab_size));
      if (ids->empty()) return InvalidArgument("\"token_ids\" is empty");
    } else if (key == "max_tokens") {
      ASSIGN_OR_RETURN(spec.stop.max_tokens, IntValue(value, "max_tokens"));
      if (spec.stop.max_tokens < 1) return InvalidArgument("\"max_tokens\" must be >= 1");
    } else if (key == "min_tokens") {
      ASSIGN_OR_RETURN(spec.stop.min_tokens, IntValue(value, "min_tokens"));
      if (spec.stop.min_tokens < 0) return InvalidArgument("\"min_tokens\" must be >= 0");
    } else if (key == "ignore_eos") {
      if (!value.is_boolean()) return InvalidArgument("\"ignore_eos\" must be true or false");
      spec.stop.ignore_eos = value.get<bool>();
    } else if (key == "stop_token_ids") {
      ASSIGN_OR_RETURN(spec.stop.stop_token_ids,
                       TokenIdsValue(value, "stop_token_ids", ctx.vocab_size));
    } else if (const SamplingParameter* p = FindSamplingParameter(key)) {
      if (p->integer ? !value.is_number_integer() : !value.is_number()) {
        return InvalidArgument("\"{}\" must be {}", key, p->integer ? "an integer" : "a number");
      }
      RETURN_IF_ERROR(CheckGreedy(*p, value.get<double>()).WithContext("\"" + key + "\""));
    } else {
      return InvalidArgument(
          "unknown key \"{}\" (known: prompt, token_ids, max_tokens, "
          "min_tokens, ignore_eos, stop_token_ids and sampling parameters "
          "at greedy values)",
          key);
    }
  }
  if (text.has_value() == ids.has_value()) {
    return InvalidArgument("give exactly one of \"prompt\" and \"token_ids\"");
  }
  if (spec.stop.min_tokens > spec.stop.max_tokens) {
    return InvalidArgument("\"min_tokens\" {} exceeds \"max_tokens\" {}", spec.stop.min_tokens,
                           spec.stop.max_tokens);
  }
  if (!text) {
    spec.prompt = std::move(*ids);
    return OkStatus();
  }
  Result<std::vector<int32_t>> encoded = EncodePrompt(ctx, *text);
  if (!encoded.ok()) return encoded.status().WithContext("\"prompt\"");
  spec.prompt = std::move(*encoded);
  return OkStatus();
}

// The requests of --prompts-file: one per non-blank line, in file order.
Result<std::vector<RequestSpec>> ReadPromptsFile(const std::string& path, const ParseContext& ctx,
                                                 const engine::StopConditions& defaults) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("--prompts-file: cannot open {}", path);
  std::vector<RequestSpec> specs;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    RequestSpec spec{number - 1, fmt::format("{}:{}", path, number), {}, defaults};
    json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    Status s = parsed.is_discarded() ? InvalidArgument("not valid JSON")
                                     : ParseRequestLine(parsed, ctx, spec);
    if (!s.ok()) return s.WithContext(spec.origin);
    specs.push_back(std::move(spec));
  }
  if (in.bad()) return IoError("reading {} failed", path);
  if (specs.empty()) return InvalidArgument("--prompts-file: {} has no requests", path);
  return specs;
}

// The one request of --prompt / --token-ids, stopping as the flags say.
Result<RequestSpec> SinglePrompt(const Options& o, const ParseContext& ctx,
                                 const engine::StopConditions& stop) {
  RequestSpec spec{0, o.prompt.empty() ? "--token-ids" : "--prompt", {}, stop};
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

// What the run saw of one request. Times are from the start of the run.
struct RequestResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<tokenizer::IncrementalDetokenizer> detok;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  double first_token_ms = 0;
  double last_token_ms = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens the prefix cache supplied
  int64_t num_preemptions = 0;

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

// Adds every request, then steps the engine until all have finished. A request the engine
// rejects (a prompt longer than max_model_len, ...) is a usage error naming it.
Result<std::vector<RequestResult>> RunRequests(engine::Engine& engine,
                                               const std::vector<RequestSpec>& specs,
                                               const tokenizer::Tokenizer* tok,
                                               ActivationDump* dump, const RunCallbacks& cb,
                                               double* wall_ms) {
  std::vector<RequestResult> results(specs.size());
  std::unordered_map<int64_t, size_t> request_of;  // engine id -> index into specs
  for (size_t i = 0; i < specs.size(); ++i) {
    Result<int64_t> id = engine.AddRequest(specs[i].prompt, specs[i].stop);
    if (!id.ok()) {
      return id.status().WithContext(
          fmt::format("request {} ({})", specs[i].index, specs[i].origin));
    }
    request_of[*id] = i;
    if (tok) {
      results[i].detok.emplace(*tok, tokenizer::DetokenizerOptions{.skip_special_tokens = true});
    }
  }

  Stopwatch watch;
  std::vector<int64_t> finished;
  for (int64_t step = 0; engine.HasUnfinished(); ++step) {
    // The model's activation tap fires inside Step: name this step's files.
    if (dump) dump->set_prefix(fmt::format("step{}.", step));
    ASSIGN_OR_RETURN(const std::vector<engine::Request*>* updated, StepEngine(engine));
    const double now = watch.ElapsedMillis();
    finished.clear();
    for (const engine::Request* r : *updated) {
      const size_t i = request_of.at(r->id);
      RequestResult& result = results[i];
      if (result.tokens.empty()) result.first_token_ms = now;
      result.last_token_ms = now;
      // Output tokens only grow (a preempted request keeps them and recomputes their cache).
      for (size_t t = result.tokens.size(); t < r->output_token_ids.size(); ++t) {
        result.tokens.push_back(r->output_token_ids[t]);
        if (result.detok) {
          const std::string piece = result.detok->Add(r->output_token_ids[t]);
          result.text += piece;
          if (cb.on_text && !piece.empty()) cb.on_text(i, piece);
        }
      }
      if (!r->finished()) continue;
      result.finish_reason = r->finish_reason;
      result.num_cached_tokens = r->num_cached_tokens;
      result.num_preemptions = r->num_preemptions;
      if (result.detok) {
        const std::string rest = result.detok->Flush();
        result.text += rest;
        if (cb.on_text && !rest.empty()) cb.on_text(i, rest);
      }
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

// {"requests": [...]} in input order, with CLI.md's keys.
void PrintJson(const std::vector<RequestSpec>& specs, const std::vector<RequestResult>& results,
               bool has_text) {
  nlohmann::ordered_json requests = nlohmann::ordered_json::array();
  for (size_t i = 0; i < specs.size(); ++i) {
    const RequestResult& r = results[i];
    nlohmann::ordered_json request;
    request["index"] = specs[i].index;
    request["token_ids"] = r.tokens;
    if (has_text) request["text"] = r.text;
    request["finish_reason"] = engine::FinishReasonName(r.finish_reason);
    request["ttft_ms"] = r.first_token_ms;
    request["tpot_ms"] = r.tpot_ms();
    request["num_prompt_tokens"] = specs[i].prompt.size();
    request["num_cached_tokens"] = r.num_cached_tokens;
    request["num_preemptions"] = r.num_preemptions;
    requests.push_back(std::move(request));
  }
  nlohmann::ordered_json out;
  out["requests"] = std::move(requests);
  std::puts(out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
}

int Run(const Options& o) {
  const bool from_file = !o.prompts_file.empty();
  if (!o.prompt.empty() + !o.token_ids.empty() + from_file != 1) {
    return UsageError(kCommand, InvalidArgument("give exactly one of --prompt, --token-ids and "
                                                "--prompts-file"));
  }
  if (o.max_tokens < 1) return UsageError(kCommand, InvalidArgument("--max-tokens: must be >= 1"));
  if (o.min_tokens < 0) return UsageError(kCommand, InvalidArgument("--min-tokens: must be >= 0"));
  if (o.min_tokens > o.max_tokens) {
    return UsageError(kCommand, InvalidArgument("--min-tokens {} exceeds --max-tokens {}",
                                                o.min_tokens, o.max_tokens));
  }
  if (from_file && !o.dump_activations.empty()) {
    return UsageError(kCommand, InvalidArgument("--dump-activations works with a single prompt "
                                                "(--prompt or --token-ids)"));
  }
  for (Status s : {o.model.Validate(), o.engine.Validate(), CheckGreedyFlags(o)}) {
    if (!s.ok()) return UsageError(kCommand, s);
  }
  Result<std::string> dir = o.model.Dir();
  if (!dir.ok()) return RuntimeError(kCommand, dir.status());

  // The requests first, from config.json alone, so that a bad line fails before the weights
  // load. The tokenizer is needed for text prompts; with token ids it only adds the text.
  Result<io::ModelConfig> model_config = io::LoadModelConfig(*dir);
  if (!model_config.ok()) return RuntimeError(kCommand, model_config.status());
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::LoadFromDir(*dir);
  const ParseContext ctx{tok.ok() ? tok->get() : nullptr, tok.status(), model_config->vocab_size};
  engine::StopConditions defaults;
  defaults.max_tokens = o.max_tokens;
  defaults.min_tokens = o.min_tokens;
  defaults.ignore_eos = o.ignore_eos;
  std::vector<RequestSpec> specs;
  if (from_file) {
    Result<std::vector<RequestSpec>> read = ReadPromptsFile(o.prompts_file, ctx, defaults);
    if (!read.ok()) return ErrorExit(read.status());
    specs = std::move(*read);
  } else {
    Result<RequestSpec> single = SinglePrompt(o, ctx, defaults);
    if (!single.ok()) return ErrorExit(single.status());
    specs.push_back(std::move(*single));
  }

  Result<std::unique_ptr<model::CausalLm>> loaded = o.model.Load();
  if (!loaded.ok()) return RuntimeError(kCommand, loaded.status());
  model::CausalLm& lm = **loaded;
  // A config the model rejects (--max-model-len past the model's, a KV cache too small for one
  // request) is the user's flags.
  engine::EngineConfig config = o.engine.ToConfig();
  // Unless given, no more sequences than requests: the default KV cache holds max_num_seqs
  // full-length requests, which for one prompt to a mid-size model would be 4 GiB to zero.
  if (!o.max_num_seqs_given) {
    config.max_num_seqs = std::min<int64_t>(config.max_num_seqs, std::ssize(specs));
  }
  Result<std::unique_ptr<engine::Engine>> engine = CreateEngine(lm, config);
  if (!engine.ok()) return UsageError(kCommand, engine.status());
  Result<std::unique_ptr<ActivationDump>> dump = ActivationDump::AttachTo(lm, o.dump_activations);
  if (!dump.ok()) return RuntimeError(kCommand, dump.status());

  // Plain output: a single prompt streams its text; a file's requests print whole as each
  // finishes, "[index] text" (ids without a tokenizer). --json prints everything at the end.
  const bool has_text = ctx.tok != nullptr;
  RunCallbacks cb;
  if (!o.json && !from_file && has_text) {
    cb.on_text = [](size_t, const std::string& piece) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    };
  }
  if (!o.json && from_file) {
    cb.on_finish = [&](size_t i, const RequestResult& r) {
      fmt::print("[{}] {}\n", specs[i].index,
                 has_text ? r.text : fmt::format("{}", fmt::join(r.tokens, " ")));
      std::fflush(stdout);
    };
  }
  double wall_ms = 0;
  Result<std::vector<RequestResult>> results =
      RunRequests(**engine, specs, ctx.tok, dump->get(), cb, &wall_ms);
  if (!results.ok()) return ErrorExit(results.status());
  if (*dump && !(*dump)->status().ok()) return RuntimeError(kCommand, (*dump)->status());

  if (o.json) {
    PrintJson(specs, *results, has_text);
  } else if (!from_file) {
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
  } else {
    size_t generated = 0;
    for (const RequestResult& r : *results) generated += r.tokens.size();
    fmt::print(stderr, "generate: {} requests, {} generated tokens in {:.2f} s ({:.1f} tokens/s)\n",
               specs.size(), generated, wall_ms * 1e-3,
               wall_ms > 0 ? generated * 1000.0 / wall_ms : 0.0);
  }
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags("moeserve generate",
                "Greedy generation through the engine: one prompt, or a file of requests run\n"
                "concurrently. --max-num-seqs defaults to the number of requests (at most 64).");
  o.model.Register(flags);
  o.engine.Register(flags);
  flags.String("prompt", &o.prompt, "prompt text, encoded with the model's tokenizer");
  flags.String("token-ids", &o.token_ids, "or: comma-separated prompt token ids, e.g. 1,2,3");
  flags.String("prompts-file", &o.prompts_file,
               "or: JSON lines, one request each: {\"prompt\": TEXT} or {\"token_ids\": [...]}, "
               "plus max_tokens, min_tokens, ignore_eos, stop_token_ids");
  flags.Int("max-tokens", &o.max_tokens, "tokens to generate at most (default of each request)");
  flags.Int("min-tokens", &o.min_tokens, "tokens before EOS or a stop id may end a request");
  flags.Bool("ignore-eos", &o.ignore_eos, "keep generating past the end-of-sequence token");
  flags.Double("temperature", &o.temperature, "0 only for now (sampling: a later issue)");
  flags.Double("top-p", &o.top_p, "1 only for now");
  flags.Int("top-k", &o.top_k, "0 or -1 only for now");
  flags.Double("min-p", &o.min_p, "0 only for now");
  flags.Int("seed", &o.seed, "sampling seed (no effect on greedy decoding)");
  flags.Bool("json", &o.json, "print JSON: per request token ids, text, finish reason, TTFT, TPOT");
  flags.String("dump-activations", &o.dump_activations,
               "write named intermediates of every step as raw f32 into this folder (single "
               "prompt)");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  o.max_num_seqs_given = flags.WasSet("max-num-seqs");
  return Run(o);
}

}  // namespace moeserve::cli
