// moeserve train-tokenizer: a byte-level BPE tokenizer trained on a text file, written as Hugging
// Face tokenizer files (tokenizer.json, tokenizer_config.json with the ChatML template), the same
// layout make-model writes. tools/train/ trains the default model on its output.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/timer.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/tokenizer_files.h"

namespace moeserve::cli {
namespace {

constexpr char kCommand[] = "train-tokenizer";

// The ChatML specials, appended after the BPE vocabulary (as make-model does).
constexpr const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
constexpr int64_t kNumSpecials = 3;

struct Options {
  std::string corpus;
  int64_t vocab_size = 8192;
  std::string out;
  int64_t model_max_length = 4096;
};

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("reading {} failed", path);
  return std::move(text).str();
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("cannot write {}", path);
  out << text;
  out.close();
  if (!out) return IoError("writing {} failed", path);
  return OkStatus();
}

Status CheckOptions(const Options& o) {
  if (o.corpus.empty()) return InvalidArgument("--corpus is required");
  if (o.out.empty()) return InvalidArgument("--out is required");
  if (o.vocab_size < 256 + kNumSpecials) {
    return InvalidArgument("--vocab-size: must be at least {} (256 byte tokens + {} special)",
                           256 + kNumSpecials, kNumSpecials);
  }
  if (o.model_max_length <= 0) return InvalidArgument("--model-max-length: must be positive");
  return OkStatus();
}

Status TrainTokenizer(const Options& o) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(o.corpus));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out)) {
    return IoError("cannot create the folder {}: {}", o.out, ec ? ec.message() : "not a folder");
  }

  Stopwatch watch;
  const tokenizer::BpeVocab vocab =
      tokenizer::TrainByteLevelBpe(text, static_cast<size_t>(o.vocab_size - kNumSpecials));
  const double train_seconds = watch.ElapsedSeconds();
  // A corpus that runs out of pairs seen twice gives a smaller vocabulary; the specials follow
  // whatever it has, so the vocabulary is dense.
  const int first_special = static_cast<int>(vocab.tokens.size());
  std::vector<tokenizer::SpecialToken> specials;
  for (int i = 0; i < kNumSpecials; ++i) specials.push_back({kSpecials[i], first_special + i});

  RETURN_IF_ERROR(
      WriteFile(o.out + "/tokenizer.json", tokenizer::MakeTokenizerJson(vocab, specials)));
  RETURN_IF_ERROR(
      WriteFile(o.out + "/tokenizer_config.json",
                tokenizer::MakeTokenizerConfigJson(specials, tokenizer::kChatMlTemplate,
                                                   static_cast<int>(o.model_max_length))));
  std::fprintf(stderr,
               "train-tokenizer: %zu bytes of text, %zu merges, vocabulary %d (+%lld special: "
               "<|endoftext|> %d, <|im_start|> %d, <|im_end|> %d) in %.1f s -> %s\n",
               text.size(), vocab.merges.size(), first_special,
               static_cast<long long>(kNumSpecials), first_special, first_special + 1,
               first_special + 2, train_seconds, o.out.c_str());
  return OkStatus();
}

}  // namespace

int RunTrainTokenizer(const std::vector<std::string>& args) {
  Options o;
  FlagSet flags(
      "moeserve train-tokenizer",
      "Trains a byte-level BPE tokenizer (Qwen2 pre-tokenizer) on a text file and writes\n"
      "tokenizer.json and tokenizer_config.json (ChatML chat template; specials\n"
      "<|endoftext|>, <|im_start|>, <|im_end|> after the BPE vocabulary).");
  flags.String("corpus", &o.corpus, "training text (UTF-8)");
  flags.Int("vocab-size", &o.vocab_size,
            "total vocabulary including the 3 special tokens (fewer when the text runs out of "
            "pairs seen twice)");
  flags.String("out", &o.out, "output folder (created if absent)");
  flags.Int("model-max-length", &o.model_max_length, "model_max_length in tokenizer_config.json");
  if (std::optional<int> exit_code = ParseFlags(flags, args, kCommand)) return *exit_code;
  if (Status s = CheckOptions(o); !s.ok()) return UsageError(kCommand, s);
  if (Status s = TrainTokenizer(o); !s.ok()) return RuntimeError(kCommand, s);
  return 0;
}

}  // namespace moeserve::cli
