// Runs `moeserve chat` as a user would, on a tiny random hybrid model, greedy: each answer must be,
// byte for byte, what `moeserve generate --token-ids` gives for the conversation so far rendered
// by `moeserve tokenize --chat-file` -- so the history (earlier answers included), /reset,
// --system, multi-line input and the dropping of old turns are checked against the chat
// template, not against chat's own rendering. Ctrl-C runs against a child process with pipes.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using e2e::CommandResult;
using nlohmann::json;

constexpr int kMaxTokens = 8;

std::string JoinIds(const json& ids) {
  std::string out;
  for (const json& id : ids) {
    if (!out.empty()) out += ',';
    out += id.dump();
  }
  return out;
}

class ChatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_chat_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    const CommandResult made =
        Run(fmt::format("make-model --arch qwen3_next --preset tiny --seed 3 --out {}", Model()));
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "stderr.txt");
  }
  static std::string Model() { return (*dir_ / "model").string(); }
  static fs::path Path(const std::string& name) { return *dir_ / name; }

  // `chat --model M <args>` with `input` on stdin (a file: not a terminal, so no prompts).
  static CommandResult Chat(const std::string& args, const std::string& input) {
    e2e::WriteFile(Path("stdin.txt"), input);
    return Run(fmt::format("chat --model {} {} <{}", Model(), args, Path("stdin.txt").string()));
  }

  // The prompt ids of `messages` as `tokenize --chat-file` renders them for the answer.
  static json PromptIds(const json& messages) {
    json line = {{"messages", messages}, {"add_generation_prompt", true}};
    e2e::WriteFile(Path("chat.jsonl"), line.dump() + "\n");
    const CommandResult r = Run(
        fmt::format("tokenize --model {} --chat-file {}", Model(), Path("chat.jsonl").string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out, nullptr, false);
    EXPECT_TRUE(out.is_object() && out.contains("ids")) << r.out;
    return out.is_object() ? out.value("ids", json::array()) : json::array();
  }

  // The greedy answer to `messages` as `generate --token-ids` gives it.
  static std::string Answer(const json& messages, int max_tokens = kMaxTokens,
                            const std::string& extra = "") {
    const CommandResult r =
        Run(fmt::format("generate --model {} --token-ids {} --max-tokens {} --temperature 0 "
                        "--json {}",
                        Model(), JoinIds(PromptIds(messages)), max_tokens, extra));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out, nullptr, false);
    if (!out.is_object()) {
      ADD_FAILURE() << r.out;
      return "";
    }
    return out["requests"][0]["text"].get<std::string>();
  }

  // What chat should print for `events` (messages, or "/reset"): each answer and a newline.
  // With max_model_len > 0, the oldest turns go while the prompt leaves fewer than kMaxTokens
  // positions, as chat drops them. `history` receives the conversation at the end.
  static std::string Expected(const std::vector<std::string>& events, const std::string& system,
                              int64_t max_model_len = 0, json* history_out = nullptr) {
    const json system_message = {{"role", "system"}, {"content", system}};
    json history = json::array();
    std::string out;
    for (const std::string& event : events) {
      if (event == "/reset") {
        history = json::array();
        continue;
      }
      history.push_back({{"role", "user"}, {"content", event}});
      const auto conversation = [&] {
        json messages = json::array();
        if (!system.empty()) messages.push_back(system_message);
        for (const json& m : history) messages.push_back(m);
        return messages;
      };
      if (max_model_len > 0) {
        while (history.size() > 1 &&
               static_cast<int64_t>(PromptIds(conversation()).size()) + kMaxTokens >
                   max_model_len) {
          history.erase(history.begin(), history.begin() + 2);
        }
      }
      const std::string answer = Answer(conversation());
      history.push_back({{"role", "assistant"}, {"content", answer}});
      out += answer + "\n";
    }
    if (history_out) *history_out = history;
    return out;
  }

  static fs::path* dir_;
};

fs::path* ChatTest::dir_ = nullptr;

const std::string kGreedy = fmt::format("--temperature 0 --max-tokens {}", kMaxTokens);

TEST_F(ChatTest, TwoTurnsCarryTheFirstAnswerInTheHistory) {
  const CommandResult r = Chat(kGreedy, "first message\nsecond\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected({"first message", "second"}, ""));
  // The second answer depends on the history: without it the model says something else.
  EXPECT_NE(r.out, Expected({"first message", "/reset", "second"}, ""));
}

// With a thinking template (Qwen3.5's), the answer's thinking is shown apart, after
// "thinking: "; an answer that never closes it is all thinking.
TEST_F(ChatTest, ThinkingIsShownApart) {
  const std::string tmpl =
      fs::path(MOESERVE_SOURCE_DIR) / "testdata" / "chat-templates" / "qwen3.5.jinja";
  const CommandResult r = Chat(
      fmt::format("--temperature 0 --max-tokens 6 --chat-template {}", tmpl), "hello\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("thinking: ", 0), 0u) << r.out;
}

TEST_F(ChatTest, ResetClearsTheHistoryAndEofExitsZero) {
  const CommandResult r = Chat(kGreedy, "first message\n/reset\nsecond\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected({"first message", "/reset", "second"}, ""));
}

TEST_F(ChatTest, SystemMessageStartsEveryConversation) {
  const std::string system = "You are a terse assistant.";
  const CommandResult r =
      Chat(kGreedy + " --system '" + system + "'", "hello\nand again\n/reset\nhello\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected({"hello", "and again", "/reset", "hello"}, system));
  EXPECT_NE(r.out, Expected({"hello", "and again", "/reset", "hello"}, ""));
}

TEST_F(ChatTest, MultiLineInputIsJoinedWithNewlines) {
  // A trailing backslash continues the line; """ lines wrap a block; blank lines are skipped;
  // "//" writes a message that starts with "/".
  const CommandResult r = Chat(kGreedy,
                               "line one\\\nline two\n"
                               "\n"
                               "\"\"\"\nblock a\n\nblock b\n\"\"\"\n"
                               "//not a command\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected({"line one\nline two", "block a\n\nblock b", "/not a command"}, ""));
}

TEST_F(ChatTest, UnknownCommandPrintsHelpAndGoesOn) {
  const CommandResult r = Chat(kGreedy, "/nope\nhi\n/help\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("unknown command /nope"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/reset"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, Expected({"hi"}, ""));
}

TEST_F(ChatTest, LongConversationDropsTheOldestTurns) {
  // Each turn adds ~20 tokens: by the fourth the prompt no longer leaves room for 8 tokens.
  const std::vector<std::string> messages = {"the first question", "the second question",
                                             "the third question", "the fourth question",
                                             "the fifth question"};
  const CommandResult r = Chat(kGreedy + " --max-model-len 64 --system 'be brief'",
                               fmt::format("{}\n", fmt::join(messages, "\n")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("dropped the"), std::string::npos) << r.err;
  json history;
  EXPECT_EQ(r.out, Expected(messages, "be brief", 64, &history));
  EXPECT_LT(history.size(), 2 * messages.size());  // the expectation dropped turns too
}

TEST_F(ChatTest, MessageTooLongIsAnErrorAndTheChatGoesOn) {
  std::string long_message;
  for (int i = 0; i < 100; ++i) long_message += "a rather long message ";
  const CommandResult r = Chat(kGreedy + " --max-model-len 64", "hi\n" + long_message + "\nho\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("too long"), std::string::npos) << r.err;
  // The long message is not in the history.
  EXPECT_EQ(r.out, Expected({"hi", "ho"}, ""));
}

TEST_F(ChatTest, GenerationConfigSetsTheDefaults) {
  // The model folder again, with a generation_config.json that asks for greedy 8-token answers
  // and ends them at the first token the model gives for "hi" too (an extra EOS id).
  const json hi = {{{"role", "user"}, {"content", "hi"}}};
  const CommandResult first =
      Run(fmt::format("generate --model {} --token-ids {} --max-tokens 1 --temperature 0 --json",
                      Model(), JoinIds(PromptIds(hi))));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const int first_token = json::parse(first.out)["requests"][0]["token_ids"][0].get<int>();
  const fs::path folder = Path("model_with_generation_config");
  fs::create_directories(folder);
  for (const fs::directory_entry& e : fs::directory_iterator(Model())) {
    if (e.path().filename() != "generation_config.json" &&
        !fs::exists(folder / e.path().filename())) {
      fs::create_symlink(e.path(), folder / e.path().filename());
    }
  }
  const auto chat = [&](const json& generation_config, const std::string& args) {
    e2e::WriteFile(folder / "generation_config.json", generation_config.dump());
    e2e::WriteFile(Path("stdin.txt"), "hi\n");
    return Run(
        fmt::format("chat --model {} {} <{}", folder.string(), args, Path("stdin.txt").string()));
  };
  const json greedy = {{"temperature", 0.0}, {"max_new_tokens", kMaxTokens}};
  CommandResult r = chat(greedy, "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected({"hi"}, ""));
  // The flags win: --max-tokens 1.
  r = chat(greedy, "--max-tokens 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Answer(hi, 1) + "\n");
  // generation_config.json's eos_token_id ids end the answer, unless --ignore-eos.
  json stops = greedy;
  const json config = json::parse(e2e::ReadFile(fs::path(Model()) / "config.json"));
  stops["eos_token_id"] = {config["eos_token_id"], first_token};
  r = chat(stops, "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Answer(hi, 1) + "\n");
  r = chat(stops, "--ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Answer(hi, kMaxTokens, "--ignore-eos") + "\n");
}

TEST_F(ChatTest, UsageAndRuntimeErrors) {
  struct Case {
    std::string args;
    int exit_code;
    std::string names;
  };
  const std::vector<Case> cases = {
      {"--model " + Model() + " --no-such-flag", 2, "--no-such-flag"},
      {"--model " + Model() + " --temperature 3", 2, "--temperature"},
      {"--model " + Model() + " --max-tokens -1", 2, "--max-tokens"},
      {"--model " + Model() + " --chat-template /nonexistent.jinja", 2, "--chat-template"},
      {"--model " + Path("no_model").string(), 1, "no_model"},
  };
  for (const Case& c : cases) {
    const CommandResult r = Run("chat " + c.args + " </dev/null");
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

// `moeserve chat <args>` with stdin, stdout and stderr on pipes.
class ChatProcess {
 public:
  explicit ChatProcess(const std::vector<std::string>& args) {
    int in[2], out[2], err[2];
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    EXPECT_EQ(pipe(err), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
      std::vector<const char*> argv = {MOESERVE_BINARY.c_str(), "chat"};
      for (const std::string& a : args) argv.push_back(a.c_str());
      argv.push_back(nullptr);
      execv(MOESERVE_BINARY.c_str(), const_cast<char* const*>(argv.data()));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~ChatProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_}) {
      if (fd >= 0) close(fd);
    }
  }

  void Write(const std::string& text) {
    ASSERT_EQ(write(in_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  void CloseStdin() {
    close(in_);
    in_ = -1;
  }
  void Interrupt() { kill(pid_, SIGINT); }

  // Reads stdout and stderr until done() holds (true) or 20 s pass (false).
  bool WaitFor(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      if (!Poll(100)) return done();
    }
    return true;
  }

  // Waits for the exit (reading what is left); the exit code, -signal, or nullopt after 20 s.
  std::optional<int> Wait() {
    WaitFor([&] { return out_eof_ && err_eof_; });
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      usleep(100000);
    }
    return std::nullopt;
  }

  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }

 private:
  // One poll of both pipes; false once both are closed.
  bool Poll(int timeout_ms) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    if (out_eof_ && err_eof_) return false;
    if (out_eof_) fds[0].fd = -1;
    if (err_eof_) fds[1].fd = -1;
    if (poll(fds, 2, timeout_ms) <= 0) return true;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        (i == 0 ? out_eof_ : err_eof_) = true;
      } else {
        (i == 0 ? out_text_ : err_text_).append(buf, static_cast<size_t>(n));
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool out_eof_ = false, err_eof_ = false, exited_ = false;
  std::string out_text_, err_text_;
};

// "chat: stopped after N tokens" notes in stderr: their N.
std::vector<int> StoppedCounts(const std::string& err) {
  std::vector<int> counts;
  const std::string marker = "chat: stopped after ";
  for (size_t at = err.find(marker); at != std::string::npos; at = err.find(marker, at + 1)) {
    counts.push_back(std::stoi(err.substr(at + marker.size())));
  }
  return counts;
}

TEST_F(ChatTest, CtrlCStopsTheAnswerAndTheChatGoesOn) {
  // Answers that would take seconds: 3000 tokens each unless stopped.
  ChatProcess chat(
      {"--model", Model(), "--temperature", "0", "--max-tokens", "3000", "--ignore-eos"});
  chat.Write("tell me a long story\n");
  ASSERT_TRUE(chat.WaitFor([&] { return !chat.out().empty(); })) << chat.err();
  chat.Interrupt();
  ASSERT_TRUE(chat.WaitFor([&] { return StoppedCounts(chat.err()).size() == 1; })) << chat.err();
  // The note follows the partial answer and its newline, flushed before it.
  const std::string first = chat.out();
  const int first_tokens = StoppedCounts(chat.err())[0];
  ASSERT_GT(first_tokens, 0);
  ASSERT_LT(first_tokens, 3000);

  chat.Write("and another\n");
  ASSERT_TRUE(chat.WaitFor([&] { return chat.out().size() > first.size(); })) << chat.err();
  chat.Interrupt();
  ASSERT_TRUE(chat.WaitFor([&] { return StoppedCounts(chat.err()).size() == 2; })) << chat.err();
  const int second_tokens = StoppedCounts(chat.err())[1];
  chat.Write("/exit\n");
  EXPECT_EQ(chat.Wait(), 0) << chat.err();

  // The partial answers are the first tokens of the full ones, and the first stays in the
  // history of the second.
  const json first_turn = {{{"role", "user"}, {"content", "tell me a long story"}}};
  const std::string first_answer = Answer(first_turn, first_tokens, "--ignore-eos");
  EXPECT_EQ(first, first_answer + "\n");
  json second_turn = first_turn;
  second_turn.push_back({{"role", "assistant"}, {"content", first_answer}});
  second_turn.push_back({{"role", "user"}, {"content", "and another"}});
  EXPECT_EQ(chat.out(), first + Answer(second_turn, second_tokens, "--ignore-eos") + "\n");
}

TEST_F(ChatTest, CtrlCAtThePromptExits130) {
  ChatProcess chat({"--model", Model()});
  // The help line shows that the loop (and its SIGINT handler) is waiting for input.
  chat.Write("/help\n");
  ASSERT_TRUE(chat.WaitFor([&] { return chat.err().find("/reset") != std::string::npos; }))
      << chat.err();
  chat.Interrupt();
  EXPECT_EQ(chat.Wait(), 130) << chat.err();
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// The default model (hybrid) through `chat`: each turn after the first resumes from the prefix
// cache where the previous answer ended, so it computes only its new tokens plus < 64 (the GDN
// state checkpoint sits at a multiple of 64; the answer's last token was never computed).
// Greedy: a sampled answer may re-tokenize differently inside the history (as in vLLM, the
// template renders it as text), which legitimately misses the cache and made this test flaky.
TEST(ChatPrefixCacheTest, EachTurnResumesFromThePreviousOne) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("moeserve_chat_pc_{}", getpid());
  fs::create_directories(dir);
  e2e::WriteFile(dir / "stdin.txt",
                 "Tell me a story about a cat.\nAnd then what happened next?\n"
                 "Why did the cat do that?\nThanks, tell me more.\n");
  const e2e::CommandResult r = e2e::RunMoeserve(
      fmt::format("chat --max-tokens 60 --temperature 0 <{}", (dir / "stdin.txt").string()),
      dir / "stderr.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex turn_line(
      R"((\d+) prompt tokens \((\d+) from the prefix cache\), (\d+) answer)");
  std::vector<std::array<int64_t, 3>> turns;
  for (std::sregex_iterator it(r.err.begin(), r.err.end(), turn_line), end; it != end; ++it) {
    turns.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3])});
  }
  ASSERT_EQ(turns.size(), 4u) << r.err;
  EXPECT_EQ(turns[0][1], 0);
  for (size_t k = 1; k < turns.size(); ++k) {
    const int64_t previous = turns[k - 1][0] + turns[k - 1][2];  // prompt + answer
    const int64_t new_tokens = turns[k][0] - previous;
    const int64_t computed = turns[k][0] - turns[k][1];
    EXPECT_GT(turns[k][1], 0) << "turn " << k;
    EXPECT_LE(computed, new_tokens + 64) << "turn " << k << ": " << r.err;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
