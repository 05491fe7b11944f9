#include "structured/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace moeserve::structured {

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

  // Sorting the ids by their bytes gives the trie's preorder: a node's path is a prefix of every
  // later token until its subtree ends.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < v->size(); ++id) {
    const std::string& b = v->token_bytes_[id];
    if (!b.empty() && b.size() <= kMaxTokenBytes && !v->is_eos(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return v->token_bytes_[a] < v->token_bytes_[b]; });
  std::vector<Node>& nodes = v->nodes_;
  nodes.push_back(Node{});
  std::vector<int32_t> path = {0};  // node index per depth of the current path
  std::string cur;                  // the current path's bytes
  for (int32_t id : order) {
    const std::string& b = v->token_bytes_[id];
    size_t common = 0;
    while (common < cur.size() && common < b.size() && cur[common] == b[common]) ++common;
    // Close the nodes deeper than the shared prefix.
    while (cur.size() > common) {
      nodes[path.back()].end = static_cast<int32_t>(nodes.size());
      path.pop_back();
      cur.pop_back();
    }
    for (size_t i = common; i < b.size(); ++i) {
      Node n;
      n.byte = static_cast<uint8_t>(b[i]);
      n.depth = static_cast<uint16_t>(i + 1);
      n.token_begin = n.token_end = static_cast<int32_t>(v->token_ids_.size());
      path.push_back(static_cast<int32_t>(nodes.size()));
      nodes.push_back(n);
      cur += b[i];
    }
    Node& leaf = nodes[path.back()];
    if (leaf.token_end != static_cast<int32_t>(v->token_ids_.size())) {
      // Not contiguous: only when a node already closed its tokens, impossible in sorted order.
      return Internal("vocabulary trie: token ids of one node not contiguous");
    }
    v->token_ids_.push_back(id);
    leaf.token_end = static_cast<int32_t>(v->token_ids_.size());
    v->max_depth_ = std::max(v->max_depth_, static_cast<int>(b.size()));
  }
  while (!path.empty()) {
    nodes[path.back()].end = static_cast<int32_t>(nodes.size());
    path.pop_back();
  }
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
