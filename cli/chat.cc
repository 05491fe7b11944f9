// moeserve chat: an interactive chat in the terminal over the engine. Each turn renders the whole
// conversation with the model's chat template (add_generation_prompt), runs it as one engine
// request and streams the answer to stdout as its tokens arrive; the answer joins the history.
// Re-rendering the conversation every turn would cost a full prefill of it; the prefix cache
// gives back what the last turn computed (KV blocks, and for hybrid models the GDN state
// checkpoint at the end of the last answer), so a turn computes little more than its new
// message. Each turn logs its prompt tokens and how many came from the cache.
//
// Choices where the issue left them open (also in --help):
//   - sampling defaults are vLLM's, overridden by the model folder's generation_config.json
//     (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), as vLLM's
//     --generation-config auto; its eos_token_id ids end an answer too; flags override both;
//   - Ctrl-C during an answer aborts it and keeps the partial answer in the history (as
//     llama-cli does); nothing generated yet drops the user's message too. Ctrl-C while reading
//     input exits with 130 (llama-cli's code, 128 + SIGINT); /exit and EOF exit 0;
//   - a conversation that leaves no room for an answer (--max-tokens, else a quarter of
//     max_model_len) loses its oldest turns, the system message kept, with a note on stderr;
//   - notes, help and errors of the loop go to stderr, so stdout is the answers alone.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_files.h"
#include "cli/model_flags.h"
#include "cli/sampling_flags.h"
#include "core/log.h"
#include "io/model_config.h"
#include "model/model_files.h"
#include "server/output_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

using nlohmann::json;

constexpr char kCommand[] = "chat";
constexpr int kExitInterrupted = 130;  // 128 + SIGINT, as llama-cli and shells

constexpr char kHelpLine[] =
    "commands: /reset (new conversation), /exit (or Ctrl-D); end a line with \\ to go on, or "
    "put lines between \"\"\" lines; a message starting with / is written //";

// ---- Ctrl-C ----

// Set by SIGINT; the generation loop checks it between engine steps, and a read of stdin returns
// EINTR (the handler is installed without SA_RESTART).
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);
pthread_t g_main_thread;

// The engine's worker threads do not block SIGINT, so the kernel may deliver it to one of them:
// it is passed on to the main thread, whose blocking read must see EINTR.
extern "C" void OnSigint(int) {
  if (!pthread_equal(pthread_self(), g_main_thread)) {
    pthread_kill(g_main_thread, SIGINT);
    return;
  }
  g_interrupted.store(true);
}

void InstallSigintHandler() {
  g_main_thread = pthread_self();
  struct sigaction action {};
  action.sa_handler = OnSigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: read(2) returns EINTR
  sigaction(SIGINT, &action, nullptr);
}

// ---- Input ----

enum class ReadResult { kOk, kEof, kInterrupted };

// Lines of stdin through read(2), so that Ctrl-C interrupts a blocking read (stdio would retry
// or latch an error).
class LineReader {
 public:
  // A line without its "\n" (nor a "\r" before it). A last line without "\n" is still a line.
  ReadResult ReadLine(std::string* line) {
    for (;;) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos || (eof_ && !buffer_.empty())) {
        const size_t end = newline != std::string::npos ? newline : buffer_.size();
        line->assign(buffer_, 0, end);
        if (!line->empty() && line->back() == '\r') line->pop_back();
        buffer_.erase(0, std::min(end + 1, buffer_.size()));
        return ReadResult::kOk;
      }
      if (eof_) return ReadResult::kEof;
      // A Ctrl-C between the last check and read() would not interrupt it.
      if (g_interrupted.load()) return ReadResult::kInterrupted;
      char chunk[4096];
      const ssize_t n = read(STDIN_FILENO, chunk, sizeof(chunk));
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        eof_ = true;
      } else if (errno != EINTR) {
        eof_ = true;  // an unreadable stdin ends the chat as EOF does
      }
    }
  }

 private:
  std::string buffer_;
  bool eof_ = false;
};

// What the user typed: a message, a command, or nothing (a blank line).
struct Input {
  enum class Kind { kMessage, kCommand, kEmpty } kind = Kind::kEmpty;
  std::string text;  // the message, or the command ("/reset")
};

// One input: a line; lines joined with "\n" while each ends in a backslash (llama.cpp's
// convention); or the lines between two lines that are exactly """. Prompts ("> ", then "... ")
// are printed only when stdin is a terminal. EOF inside a multi-line input ends it.
ReadResult ReadInput(LineReader& reader, bool tty, Input* input) {
  const auto prompt = [tty](const char* text) {
    if (!tty) return;
    std::fputs(text, stdout);
    std::fflush(stdout);
  };
  std::string line;
  prompt("> ");
  if (ReadResult r = reader.ReadLine(&line); r != ReadResult::kOk) return r;
  std::string text;
  if (line == "\"\"\"") {
    bool first = true;
    for (;;) {
      prompt("... ");
      const ReadResult r = reader.ReadLine(&line);
      if (r == ReadResult::kInterrupted) return r;
      if (r == ReadResult::kEof || line == "\"\"\"") break;
      if (!first) text += '\n';
      text += line;
      first = false;
    }
  } else {
    bool commandable = true;  // a command is a single line
    while (!line.empty() && line.back() == '\\') {
      line.pop_back();
      text += line;
      text += '\n';
      commandable = false;
      prompt("... ");
      const ReadResult r = reader.ReadLine(&line);
      if (r == ReadResult::kInterrupted) return r;
      if (r == ReadResult::kEof) {
        line.clear();
        break;
      }
    }
    text += line;
    if (commandable && text.starts_with('/')) {
      if (text.starts_with("//")) {
        text.erase(0, 1);
      } else {
        const size_t end = text.find_last_not_of(" \t");
        *input = {Input::Kind::kCommand, text.substr(0, end + 1)};
        return ReadResult::kOk;
      }
    }
  }
  const bool blank = text.find_first_not_of(" \t\n") == std::string::npos;
  *input = {blank ? Input::Kind::kEmpty : Input::Kind::kMessage, std::move(text)};
  return ReadResult::kOk;
}

// ---- Model folder ----

// ---- Options ----

struct Options {
  ModelFlags model;
  EngineFlags engine;
  std::string system;
  std::string chat_template;
  engine::SamplingParams sampling;  // vLLM's defaults until flags or generation_config set them
  int64_t max_tokens = 0;           // 0: until the end of the turn or max_model_len
  int64_t seed = -1;
  std::string stop;
};

// The sampling parameters of every answer but its max_tokens: the flags, else
// generation_config.json's values, else vLLM's defaults. The model's extra EOS ids (those of
// generation_config.json) become stop ids unless --ignore-eos, as in vLLM.
engine::SamplingParams AnswerParams(const Options& o, const FlagSet& flags,
                                    const GenerationConfig& g,
                                    std::span<const int64_t> model_eos_ids) {
  engine::SamplingParams p = o.sampling;
  if (!o.stop.empty()) p.stop = {o.stop};
  std::vector<std::string> keep;  // the keys whose flags were given
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}) {
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (flags.WasSet(flag)) keep.push_back(key);
  }
  const std::vector<std::string> from_file = g.ApplyTo(&p, keep);
  if (!from_file.empty()) {
    LogInfo("chat: sampling defaults from generation_config.json: {}", fmt::join(from_file, ", "));
  }
  if (o.seed >= 0) p.seed = o.seed;
  if (!p.ignore_eos) {
    for (int32_t id : g.ExtraEosIds(model_eos_ids)) p.stop_token_ids.push_back(id);
  }
  return p;
}

// SamplingParams::Validate names the parameter ("top_p must be ..."): name the flag instead.
Status NameTheFlag(const Status& s) {
  const std::string& message = s.message();
  const size_t space = message.find(' ');
  if (space == std::string::npos) return s;
  std::string flag = "--" + message.substr(0, space);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return Status(s.code(), flag + ":" + message.substr(space));
}

// ---- The conversation ----

struct Message {
  std::string role;
  std::string content;
};

// The chat's state and what each turn needs.
class Chat {
 public:
  Chat(const Options& o, engine::Engine& engine, const tokenizer::Tokenizer& tok,
       const tokenizer::ChatTemplate& chat_template, engine::SamplingParams params)
      : o_(o),
        engine_(engine),
        tok_(tok),
        template_(chat_template),
        params_(std::move(params)),
        reasoning_(server::ChooseParsers(chat_template.source()).reasoning) {}

  void Reset() { history_.clear(); }

  // One turn: the message joins the history, the answer streams to stdout and joins it too.
  // A message that cannot be answered (too long, the template refuses it) is reported on stderr
  // and left out of the history. Errors are the engine's: the chat cannot go on.
  Status Turn(std::string message) {
    history_.push_back({"user", std::move(message)});
    Result<std::vector<int32_t>> prompt = PromptThatFits();
    if (!prompt.ok()) {
      history_.pop_back();
      fmt::print(stderr, "chat: {}\n", prompt.status().message());
      return OkStatus();
    }
    engine::SamplingParams params = params_;
    const int64_t room = max_model_len() - static_cast<int64_t>(prompt->size());
    params.max_tokens = std::min(MaxTokens(), room);
    ASSIGN_OR_RETURN(const Answer answer, Generate(std::move(*prompt), params));
    if (answer.interrupted && answer.num_tokens == 0) {
      history_.pop_back();
      fmt::print(stderr, "chat: stopped before the answer began; the message is dropped\n");
      return OkStatus();
    }
    if (answer.interrupted) {
      fmt::print(stderr,
                 "chat: stopped after {} token{}; the partial answer stays in the conversation\n",
                 answer.num_tokens, answer.num_tokens == 1 ? "" : "s");
    }
    history_.push_back({"assistant", answer.text});
    return OkStatus();
  }

 private:
  struct Answer {
    std::string text;
    int64_t num_tokens = 0;
    bool interrupted = false;
  };

  int64_t max_model_len() const { return engine_.layout().max_model_len; }

  // --max-tokens (or generation_config.json's max_new_tokens, put there by Run), else no limit
  // but the context.
  int64_t MaxTokens() const {
    if (o_.max_tokens > 0) return o_.max_tokens;
    return std::numeric_limits<int64_t>::max();
  }

  // Token ids of `messages` after the system message, rendered for the assistant's answer.
  Result<std::vector<int32_t>> Render(std::span<const Message> messages) const {
    json list = json::array();
    if (!o_.system.empty()) list.push_back({{"role", "system"}, {"content", o_.system}});
    for (const Message& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    tokenizer::ChatTemplateInputs inputs;
    inputs.messages_json = list.dump(-1, ' ', false, json::error_handler_t::replace);
    inputs.add_generation_prompt = true;
    Result<std::string> text = template_.Render(inputs);
    if (!text.ok()) return text.status().WithContext("the chat template");
    // As apply_chat_template: the template writes the special tokens.
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok_.Encode(*text));
    const int64_t vocab_size = engine_.model().config().vocab_size;
    for (int32_t id : ids) {
      if (id >= vocab_size) {
        return OutOfRange("the tokenizer gives id {}, outside the model's vocabulary of {}", id,
                          vocab_size);
      }
    }
    return ids;
  }

  // The prompt of the conversation, its oldest turns dropped while it leaves no room for an
  // answer: --max-tokens, or a quarter of max_model_len (at least one token). The last message
  // alone (with the system message) that leaves no room at all is an error.
  Result<std::vector<int32_t>> PromptThatFits() {
    const int64_t limit = max_model_len();
    const int64_t reserve = std::min(MaxTokens(), std::max<int64_t>(1, limit / 4));
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, Render(history_));
    if (static_cast<int64_t>(ids.size()) + reserve <= limit) return ids;
    ASSIGN_OR_RETURN(std::vector<int32_t> alone, Render(std::span(history_).last(1)));
    if (static_cast<int64_t>(alone.size()) >= limit) {
      return OutOfRange(
          "the message is too long: {} prompt tokens{} leave no room for an answer within "
          "max_model_len {} (--max-model-len)",
          alone.size(), o_.system.empty() ? "" : " with the system message", limit);
    }
    int64_t dropped = 0;
    while (history_.size() > 1 && static_cast<int64_t>(ids.size()) + reserve > limit) {
      // The history alternates user, assistant; the last message is the new one.
      history_.erase(history_.begin(), history_.begin() + std::min<size_t>(2, history_.size() - 1));
      ++dropped;
      ASSIGN_OR_RETURN(ids, Render(history_));
    }
    if (dropped == 0) return ids;
    fmt::print(stderr,
               "chat: the conversation outgrew max_model_len {}: dropped the {} oldest turn{}{}\n",
               limit, dropped, dropped == 1 ? "" : "s",
               o_.system.empty() ? "" : " (the system message is kept)");
    return ids;
  }

  // Runs the prompt as one engine request, streaming the text to stdout (flushed per token)
  // until EOS, a stop id or string, max_tokens, or Ctrl-C (the request is aborted).
  Result<Answer> Generate(std::vector<int32_t> prompt, const engine::SamplingParams& params) {
    Answer answer;
    tokenizer::IncrementalDetokenizer detok(
        tok_, {.skip_special_tokens = params.skip_special_tokens,
               .stop = std::make_shared<const std::vector<std::string>>(params.stop),
               .include_stop_str_in_output = params.include_stop_str_in_output,
               .min_tokens = params.min_tokens});
    // A thinking model's reasoning is shown apart (dimmed on a terminal) and kept out of the
    // history, as the chat templates drop it from earlier turns.
    std::optional<server::OutputParser> parser;
    if (reasoning_ != server::ReasoningFormat::kNone) {
      const size_t tail = std::min<size_t>(prompt.size(), 8);
      parser.emplace(server::OutputParserOptions{.reasoning = reasoning_,
                                                 .thinking_enabled = !server::PromptClosesThinking(
                                                     tok_.Decode(std::span(prompt).last(tail)))});
    }
    const bool tty = isatty(STDOUT_FILENO) == 1;
    bool in_reasoning = false;
    const auto show = [&](const server::MessageDelta& d) {
      if (!d.reasoning.empty()) {
        if (!in_reasoning) std::fputs(tty ? "\x1b[2mthinking: " : "thinking: ", stdout);
        in_reasoning = true;
        std::fwrite(d.reasoning.data(), 1, d.reasoning.size(), stdout);
      }
      if (!d.content.empty()) {
        if (in_reasoning) std::fputs(tty ? "\x1b[0m\n" : "\n", stdout);
        in_reasoning = false;
        answer.text += d.content;
        std::fwrite(d.content.data(), 1, d.content.size(), stdout);
      }
      std::fflush(stdout);
    };
    const auto print = [&](const std::string& piece) {
      if (piece.empty()) return;
      if (parser) return show(parser->Feed(piece));
      answer.text += piece;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
    g_interrupted.store(false);
    const int64_t num_prompt = static_cast<int64_t>(prompt.size());
    ASSIGN_OR_RETURN(const int64_t id, engine_.AddRequest(std::move(prompt), params));
    while (engine_.HasUnfinished()) {
      if (g_interrupted.load()) {
        engine_.Abort(id);
        answer.interrupted = true;
        break;
      }
      ASSIGN_OR_RETURN(const std::vector<engine::Request*>* updated, StepEngine(engine_));
      for (const engine::Request* r : *updated) {
        for (size_t t = answer.num_tokens; t < r->output_token_ids.size() && !detok.stopped();
             ++t) {
          ++answer.num_tokens;
          print(detok.Add(r->output_token_ids[t]));
        }
        if (detok.stopped()) engine_.Abort(id, engine::FinishReason::kStop);
      }
    }
    print(detok.Flush());
    if (parser) show(parser->Finish());
    if (in_reasoning && tty) std::fputs("\x1b[0m", stdout);
    LogInfo("chat: {} prompt tokens ({} from the prefix cache), {} answer tokens", num_prompt,
            engine_.Find(id)->num_cached_tokens, engine_.Find(id)->output_token_ids.size());
    engine_.Release(id);
    // A Ctrl-C as the answer ended stopped it too: the next read must not see it.
    g_interrupted.store(false);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    return answer;
  }

  const Options& o_;
  engine::Engine& engine_;
  const tokenizer::Tokenizer& tok_;
  const tokenizer::ChatTemplate& template_;
  const engine::SamplingParams params_;
  const server::ReasoningFormat reasoning_;  // the chat template's (auto), or none
  std::vector<Message> history_;             // user, assistant, user, ... (no system message)
};

int Run(const Options& o, const FlagSet& flags) {
  for (Status s : {o.model.Validate(), o.engine.Validate()}) {
    if (!s.ok()) return UsageError(kCommand, s);
  }
  if (o.max_tokens < 0) {
    return UsageError(kCommand, InvalidArgument("--max-tokens: must be >= 1 (0: no limit)"));
  }
  Result<std::string> dir = o.model.Dir();
  if (!dir.ok()) return RuntimeError(kCommand, dir.status());
  Result<io::ModelConfig> model_config = model::LoadModelConfigAt(*dir);
  if (!model_config.ok()) return RuntimeError(kCommand, model_config.status());
  Result<ModelTokenizer> text = LoadModelTokenizerAndTemplate(*dir, o.chat_template);
  if (!text.ok()) return RuntimeError(kCommand, text.status());
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = std::move(text->tokenizer);
  Result<tokenizer::ChatTemplate> chat_template =
      RequiredChatTemplate(*dir, std::move(text->chat_template));
  if (!chat_template.ok()) {
    // A bad --chat-template is the user's flag; a folder without a template is the model's.
    return o.chat_template.empty() ? RuntimeError(kCommand, chat_template.status())
                                   : UsageError(kCommand, chat_template.status());
  }
  Result<GenerationConfig> generation_config = LoadGenerationConfig(*dir);
  if (!generation_config.ok()) return RuntimeError(kCommand, generation_config.status());

  Options options = o;
  if (options.max_tokens == 0 && generation_config->max_new_tokens.value_or(0) > 0 &&
      !flags.WasSet("max-tokens")) {
    options.max_tokens = *generation_config->max_new_tokens;
  }
  engine::SamplingParams params =
      AnswerParams(options, flags, *generation_config, model_config->eos_token_ids);
  {
    engine::SamplingParams checked = params;
    checked.max_tokens = std::max<int64_t>(1, options.max_tokens);
    if (Status s = checked.Validate(model_config->vocab_size); !s.ok()) {
      return UsageError(kCommand, NameTheFlag(s));
    }
  }

  engine::EngineConfig config = o.engine.ToConfig();
  // One conversation, one request at a time: a cache for one full-length request, not 64.
  if (!flags.WasSet("max-num-seqs")) config.max_num_seqs = 1;
  if (std::optional<int> refused = CheckMemoryPlan(o.model, o.engine, config, kCommand)) {
    return *refused;
  }
  LoadedModel loaded = LoadOrFollow(o.model, kCommand);
  if (loaded.group == nullptr) return loaded.exit_code;
  Result<std::unique_ptr<engine::Engine>> engine = CreateEngine(*loaded.group, config);
  if (!engine.ok()) return UsageError(kCommand, engine.status());

  const bool tty = isatty(STDIN_FILENO) == 1;
  if (tty) fmt::print(stderr, "chat: {}; Ctrl-C stops an answer\n", kHelpLine);
  InstallSigintHandler();
  Chat chat(options, **engine, **tok, *chat_template, params);
  LineReader reader;
  for (;;) {
    Input input;
    const ReadResult read = ReadInput(reader, tty, &input);
    if (read == ReadResult::kInterrupted) {
      std::fputs("\n", stdout);
      std::fflush(stdout);
      return kExitInterrupted;
    }
    if (read == ReadResult::kEof) {
      if (tty) std::fputs("\n", stdout);  // past the "> " that EOF answered
      return 0;
    }
    switch (input.kind) {
      case Input::Kind::kEmpty:
        break;
      case Input::Kind::kCommand:
        if (input.text == "/exit" || input.text == "/quit") return 0;
        if (input.text == "/reset") {
          chat.Reset();
          fmt::print(stderr, "chat: new conversation\n");
        } else {
          fmt::print(stderr, "chat: {}{}\n",
                     input.text == "/help" ? "" : "unknown command " + input.text + "; ",
                     kHelpLine);
        }
        break;
      case Input::Kind::kMessage:
        if (Status s = chat.Turn(std::move(input.text)); !s.ok()) {
          return RuntimeError(kCommand, s);
        }
        break;
    }
  }
}

}  // namespace

int RunChat(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve chat",
      "Interactive chat in the terminal: each message and the conversation so far go\n"
      "through the chat template (re-rendered each turn; the prefix cache gives back what\n"
      "the last turn computed) and the engine, the answer streamed as it is generated.\n"
      "Input: end a line with \\ to continue on the next, or put lines between two lines\n"
      "that are exactly \"\"\". Commands: /reset (new conversation, --system kept), /exit\n"
      "(or EOF: exit 0), /help; a message starting with / is written //.\n"
      "Ctrl-C stops the answer (the partial answer stays in the conversation) and returns\n"
      "to the prompt; at the prompt it exits with 130. A conversation that leaves no room\n"
      "for an answer (--max-tokens, else a quarter of max_model_len) drops its oldest\n"
      "turns. Sampling: vLLM's defaults, overridden by the model's generation_config.json\n"
      "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens, eos_token_id),\n"
      "overridden by the flags. --max-num-seqs defaults to 1.");
  o.model.Register(flags);
  o.engine.Register(flags);
  engine::SamplingParams& p = o.sampling;
  flags.String("system", &o.system, "a system message at the start of every conversation");
  flags.String("chat-template", &o.chat_template,
               "a Jinja chat template file instead of tokenizer_config.json's");
  flags.Int("max-tokens", &o.max_tokens,
            "tokens per answer at most (0: until the end of the turn or max_model_len)");
  flags.Bool("ignore-eos", &p.ignore_eos,
             "keep generating past the end of the turn (until --max-tokens)");
  flags.Double("temperature", &p.temperature, "0: greedy, up to 2");
  flags.Int("seed", &o.seed, "sampling seed of every answer (-1: a random one)");
  RegisterSamplingFlags(flags, p);
  flags.String("stop", &o.stop, "a stop string: the answer ends before it");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  return Run(o, flags);
}

}  // namespace moeserve::cli
