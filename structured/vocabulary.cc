#include "structured/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace moeserve::structured {

namespace {

// Characters of a text token (a run of whole UTF-8 characters, none below U+0020, none '"' or
// '\'), or -1.
int TextChars(std::string_view b) {
  int chars = 0;
  size_t i = 0;
  while (i < b.size()) {
    const uint8_t c = static_cast<uint8_t>(b[i]);
    int len;
    uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return -1;
    }
    if (i + len > b.size()) return -1;
    for (int k = 1; k < len; ++k) {
      const uint8_t x = static_cast<uint8_t>(b[i + k]);
      if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return -1;
    }
    i += len;
    ++chars;
  }
  return chars;
}

// The trie of `ids` (sorted by their bytes): a node's path is a prefix of every later token
// until its subtree ends.
Status BuildTrie(const std::vector<std::string>& token_bytes, const std::vector<int32_t>& ids,
                 Vocabulary::Trie& trie) {
  std::vector<Vocabulary::Node>& nodes = trie.nodes;
  nodes.push_back(Vocabulary::Node{});
  std::vector<int32_t> path = {0};  // node index per depth of the current path
  std::string cur;                  // the current path's bytes
  for (int32_t id : ids) {
    const std::string& b = token_bytes[id];
    size_t common = 0;
    while (common < cur.size() && common < b.size() && cur[common] == b[common]) ++common;
    // Close the nodes deeper than the shared prefix.
    while (cur.size() > common) {
      nodes[path.back()].end = static_cast<int32_t>(nodes.size());
      path.pop_back();
      cur.pop_back();
    }
    for (size_t i = common; i < b.size(); ++i) {
      Vocabulary::Node n;
      n.byte = static_cast<uint8_t>(b[i]);
      n.depth = static_cast<uint16_t>(i + 1);
      n.token_begin = n.token_end = static_cast<int32_t>(trie.token_ids.size());
      path.push_back(static_cast<int32_t>(nodes.size()));
      nodes.push_back(n);
      cur += b[i];
    }
    Vocabulary::Node& leaf = nodes[path.back()];
    if (leaf.token_end != static_cast<int32_t>(trie.token_ids.size())) {
      // Not contiguous: only when a node already closed its tokens, impossible in sorted order.
      return Internal("vocabulary trie: token ids of one node not contiguous");
    }
    trie.token_ids.push_back(id);
    leaf.token_end = static_cast<int32_t>(trie.token_ids.size());
    trie.max_depth = std::max(trie.max_depth, static_cast<int>(b.size()));
  }
  while (!path.empty()) {
    nodes[path.back()].end = static_cast<int32_t>(nodes.size());
    path.pop_back();
  }
  return OkStatus();
}

}  // namespace

Result<std::shared_ptr<const Vocabulary>> Vocabulary::Create(std::vector<std::string> token_bytes,
                                                             std::vector<int32_t> eos_ids) {
  if (token_bytes.size() > (1u << 24)) {
    return InvalidArgument("vocabulary of {} tokens: more than 2^24", token_bytes.size());
  }
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= static_cast<int32_t>(token_bytes.size())) {
      return InvalidArgument("end-of-sequence id {} outside the vocabulary of {}", id,
                             token_bytes.size());
    }
  }
  std::shared_ptr<Vocabulary> v(new Vocabulary());
  v->token_bytes_ = std::move(token_bytes);
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  v->eos_ids_ = std::move(eos_ids);

  // Sorting the ids by their bytes gives the tries' preorder.
  std::vector<int32_t> order, rest;
  for (int32_t id = 0; id < v->size(); ++id) {
    const std::string& b = v->token_bytes_[id];
    if (!b.empty() && b.size() <= kMaxTokenBytes && !v->is_eos(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return v->token_bytes_[a] < v->token_bytes_[b]; });
  const size_t words = v->mask_words();
  v->text_up_to_.assign((kMaxTextChars + 1) * words, 0);
  for (int32_t id : order) {
    const int chars = TextChars(v->token_bytes_[id]);
    if (chars < 1 || chars > kMaxTextChars) {
      rest.push_back(id);
      continue;
    }
    // Set in text_up_to(chars .. kMaxTextChars).
    for (int n = chars; n <= kMaxTextChars; ++n) {
      v->text_up_to_[n * words + (id >> 5)] |= 1u << (id & 31);
    }
  }
  RETURN_IF_ERROR(BuildTrie(v->token_bytes_, order, v->trie_));
  RETURN_IF_ERROR(BuildTrie(v->token_bytes_, rest, v->rest_trie_));
  return std::shared_ptr<const Vocabulary>(std::move(v));
}

Result<std::shared_ptr<const Vocabulary>> Vocabulary::FromTokenizer(const tokenizer::Tokenizer& tok,
                                                                    std::vector<int32_t> eos_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(tok.id_limit(), 0)));
  for (int32_t id = 0; id < tok.id_limit(); ++id) {
    if (tok.IsSpecial(id)) continue;
    if (std::optional<std::string_view> b = tok.TokenBytes(id)) bytes[id] = std::string(*b);
  }
  return Create(std::move(bytes), std::move(eos_ids));
}

bool Vocabulary::is_eos(int32_t id) const {
  return std::binary_search(eos_ids_.begin(), eos_ids_.end(), id);
}

}  // namespace moeserve::structured
