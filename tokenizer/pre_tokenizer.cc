#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <optional>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

// Oniguruma's Unicode \s and \w, as the body of a character class.
constexpr std::string_view kOnigSpace = R"(\t-\r\x{85}\p{Z})";
constexpr std::string_view kOnigWord = R"(\p{L}\p{M}\p{Nd}\p{Pc})";

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0)
    return fmt::format("error {}", code);
  return std::string(reinterpret_cast<const char*>(buffer));
}

// The JIT stack of the calling thread. PCRE2's default (32 KiB on the machine stack) is too small
// for the lookahead patterns over long whitespace runs; each thread gets its own since matching
// runs concurrently.
pcre2_jit_stack* ThreadJitStack(void*) {
  struct Holder {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    ~Holder() { pcre2_jit_stack_free(stack); }
  };
  thread_local Holder holder;
  return holder.stack;
}

}  // namespace

const char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const char kQwen2SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen35SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|)"
    R"( ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kLlama3SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Regex::Impl {
  std::string pattern;
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  bool jit = false;

  ~Impl() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

std::string OnigurumaToPcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  int class_depth = 0;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 's' || d == 'w' || d == 'S' || d == 'W') {
        const std::string_view set = (d == 's' || d == 'S') ? kOnigSpace : kOnigWord;
        const bool negated = d == 'S' || d == 'W';
        if (class_depth == 0) {
          out += negated ? "[^" : "[";
          out += set;
          out += ']';
        } else if (!negated) {
          out += set;
        } else {
          // A negated set cannot be spliced into a class; PCRE2's own \S or \W differ from
          // Oniguruma's only on U+0085 and marks.
          out += c;
          out += d;
        }
        i += 2;
        continue;
      }
      out += c;
      out += d;
      i += 2;
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        // A POSIX class such as [:alpha:] inside a class: copied whole.
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
      }
      ++class_depth;
      out += c;
      ++i;
      // "[^]...]" and "[]...]": a ']' right after the opening is a literal.
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
    ++i;
  }
  return out;
}

Result<Regex> Regex::Compile(std::string_view pattern, bool literal) {
  auto impl = std::make_shared<Impl>();
  impl->pattern = std::string(pattern);
  const std::string translated = literal ? impl->pattern : OnigurumaToPcre2(pattern);
  // PCRE2_LITERAL refuses PCRE2_UCP (it has no classes to apply it to).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             options, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    return InvalidArgument("invalid regex '{}': {} (at offset {} of its PCRE2 form '{}')", pattern,
                           Pcre2Message(error), offset, translated);
  }
  // JIT is an optimization: without it (a PCRE2 built without JIT support) matching still works.
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  impl->context = pcre2_match_context_create(nullptr);
  if (impl->context == nullptr) return Internal("out of memory creating a PCRE2 match context");
  if (impl->jit) pcre2_jit_stack_assign(impl->context, &ThreadJitStack, nullptr);
  return Regex(std::move(impl));
}

const std::string& Regex::pattern() const { return impl_->pattern; }

Status Regex::ForEachMatch(std::string_view subject,
                           const std::function<void(size_t, size_t)>& on_match) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (data == nullptr) return Internal("out of memory creating PCRE2 match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  Status status;
  size_t offset = 0;
  while (offset < subject.size()) {
    // The text was validated once up front; PCRE2 would otherwise re-check the whole subject on
    // every call, which is quadratic.
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, subject.size(), offset, 0, data,
                                                impl_->context)
                              : pcre2_match(impl_->code, s, subject.size(), offset,
                                            PCRE2_NO_UTF_CHECK, data, impl_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = InvalidArgument("regex '{}' failed at byte {}: {}", impl_->pattern, offset,
                               Pcre2Message(rc));
      break;
    }
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end) {
      if (end >= subject.size()) break;
      offset = end;
      NextCodePoint(subject, &offset);
      continue;
    }
    on_match(start, end);
    offset = end;
  }
  pcre2_match_data_free(data);
  return status;
}

PreTokenizer::PreTokenizer(std::vector<SplitStep> splits, ByteLevelStep byte_level,
                           std::optional<Regex> gpt2)
    : splits_(std::move(splits)), byte_level_(byte_level), gpt2_(std::move(gpt2)) {}

Status PreTokenizer::Split(std::string_view text,
                           const std::function<void(std::string_view)>& on_word) const {
  if (text.empty()) return OkStatus();
  return Apply(0, text, on_word);
}

Status PreTokenizer::Apply(size_t step, std::string_view piece,
                           const std::function<void(std::string_view)>& on_word) const {
  if (step < splits_.size()) {
    const SplitStep& split = splits_[step];
    // Pieces are handed on as soon as they are found, so that no list of them is ever built.
    Status inner;
    size_t previous = 0;
    auto emit = [&](size_t start, size_t end, bool is_match) {
      if (!inner.ok() || start == end) return;
      if (split.invert) is_match = !is_match;
      if (split.behavior == SplitBehavior::kRemoved && is_match) return;
      inner = Apply(step + 1, piece.substr(start, end - start), on_word);
    };
    RETURN_IF_ERROR(split.pattern.ForEachMatch(piece, [&](size_t start, size_t end) {
      emit(previous, start, false);
      emit(start, end, true);
      previous = end;
    }));
    emit(previous, piece.size(), false);
    return inner;
  }

  // The ByteLevel step.
  std::string prefixed;
  if (byte_level_.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!byte_level_.use_regex) {
    on_word(piece);
    return OkStatus();
  }
  size_t previous = 0;
  RETURN_IF_ERROR(gpt2_->ForEachMatch(piece, [&](size_t start, size_t end) {
    if (previous < start) on_word(piece.substr(previous, start - previous));
    on_word(piece.substr(start, end - start));
    previous = end;
  }));
  if (previous < piece.size()) on_word(piece.substr(previous));
  return OkStatus();
}

}  // namespace moeserve::tokenizer
