#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

namespace {

// Unicode composition shrinks text at most this much (NFC: three jamo of 3 bytes make one
// syllable of 3), with room to spare.
constexpr size_t kMaxNormalizerShrink = 4;

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  size_t longest = 1;
  for (size_t i = 0; i + 1 < impl_->decode_offsets.size(); ++i) {
    longest = std::max<size_t>(longest, impl_->decode_offsets[i + 1] - impl_->decode_offsets[i]);
  }
  impl_->max_bytes_per_token =
      longest * (impl_->normalizer.is_identity() ? 1 : kMaxNormalizerShrink);
}
Tokenizer::~Tokenizer() = default;

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                               bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return InvalidArgument("text is not valid UTF-8 (at byte {})", bad);
  }
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = m.template_prefix;

  Status status;
  const auto on_word = [&](std::string_view word) { m.model->Tokenize(word, &ids); };
  const auto encode_text = [&](std::string_view piece) {
    if (Status s = m.pre_tokenizer->Split(piece, on_word); !s.ok()) status = std::move(s);
  };
  // Hugging Face's extract_and_normalize: raw added tokens first, then each piece between them is
  // normalized on its own and searched for the normalized added tokens.
  std::string scratch;
  const auto encode_raw_piece = [&](std::string_view piece, const AddedToken* token) {
    if (!status.ok()) return;
    if (token != nullptr) {
      ids.push_back(token->id);
      return;
    }
    Result<std::string_view> normalized = m.normalizer.Normalize(piece, &scratch);
    if (!normalized.ok()) {
      status = normalized.status();
      return;
    }
    if (m.normalized_matcher.empty()) return encode_text(*normalized);
    m.normalized_matcher.Split(*normalized, [&](std::string_view p, const AddedToken* t) {
      if (!status.ok()) return;
      if (t != nullptr) {
        ids.push_back(t->id);
      } else {
        encode_text(p);
      }
    });
  };
  if (m.raw_matcher.empty()) {
    encode_raw_piece(text, nullptr);
  } else {
    m.raw_matcher.Split(text, encode_raw_piece);
  }
  RETURN_IF_ERROR(status);
  if (add_special_tokens) ids.insert(ids.end(), m.template_suffix.begin(), m.template_suffix.end());
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= id_limit()) continue;
    const uint8_t flags = m.id_flags[id];
    if (!(flags & Impl::kIdPresent)) continue;
    if (skip_special_tokens && (flags & Impl::kIdSpecial)) continue;
    bytes.append(m.decode_bytes, m.decode_offsets[id],
                 m.decode_offsets[id + 1] - m.decode_offsets[id]);
  }
  if (FindInvalidUtf8(bytes) == std::string_view::npos) return bytes;
  std::string text;
  text.reserve(bytes.size() + 8);
  AppendUtf8Lossy(bytes, /*final=*/true, &text);
  return text;
}

std::optional<std::string_view> Tokenizer::TokenBytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= id_limit() || !(m.id_flags[id] & Impl::kIdPresent)) return std::nullopt;
  return std::string_view(m.decode_bytes)
      .substr(m.decode_offsets[id], m.decode_offsets[id + 1] - m.decode_offsets[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < id_limit() && (impl_->id_flags[id] & Impl::kIdSpecial);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  // Added tokens first, as Hugging Face looks them up.
  if (const auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end()) {
    return it->second;
  }
  return impl_->model->TokenToId(token);
}

std::optional<std::string_view> Tokenizer::IdToToken(int32_t id) const {
  if (id >= 0 && id < id_limit() && impl_->added_index[id] >= 0) {
    return std::string_view(impl_->added_text[impl_->added_index[id]]);
  }
  return impl_->model->IdToToken(id);
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t Tokenizer::id_limit() const { return static_cast<int32_t>(impl_->id_flags.size()); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
size_t Tokenizer::max_bytes_per_token() const { return impl_->max_bytes_per_token; }
const std::optional<NamedToken>& Tokenizer::bos_token() const { return impl_->bos; }
const std::optional<NamedToken>& Tokenizer::eos_token() const { return impl_->eos; }
const std::optional<NamedToken>& Tokenizer::pad_token() const { return impl_->pad; }
const std::optional<NamedToken>& Tokenizer::unk_token() const { return impl_->unk; }
const std::vector<std::string>& Tokenizer::additional_special_tokens() const {
  return impl_->additional_special_tokens;
}
void Tokenizer::ClearWordCache() const { impl_->model->ClearCache(); }

}  // namespace moeserve::tokenizer
