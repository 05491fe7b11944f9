#include "tokenizer/incremental_detokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               DetokenizerOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {}

const std::vector<std::string>& IncrementalDetokenizer::stop_strings() const {
  static const std::vector<std::string> kNone;
  return options_.stop != nullptr ? *options_.stop : kNone;
}

std::string IncrementalDetokenizer::Add(int32_t id, bool ends_generation) {
  std::string out;
  if (stopped() || flushed_) return out;
  ++num_ids_;
  if (ends_generation && !options_.include_stop_str_in_output) return out;
  const std::optional<std::string_view> bytes = tokenizer_.TokenBytes(id);
  // Unknown ids decode to nothing, as in Tokenizer::Decode.
  if (!bytes.has_value()) return out;
  if (options_.skip_special_tokens && tokenizer_.IsSpecial(id)) return out;
  bytes_ += *bytes;
  const size_t before = pending_.size();
  bytes_.erase(0, AppendUtf8Lossy(bytes_, /*final=*/false, &pending_));
  // Within min_tokens the new text counts as searched: no stop string can end in it.
  const size_t searched = num_ids_ <= options_.min_tokens ? pending_.size() : before;
  if (pending_.size() > before) Release(&out, searched, /*final=*/false);
  return out;
}

std::string IncrementalDetokenizer::Add(std::span<const int32_t> ids) {
  std::string out;
  for (const int32_t id : ids) {
    if (stopped()) break;
    out += Add(id);
  }
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  if (stopped() || flushed_) return out;
  flushed_ = true;
  const size_t before = pending_.size();
  AppendUtf8Lossy(bytes_, /*final=*/true, &pending_);
  bytes_.clear();
  Release(&out, std::min(before, pending_.size()), /*final=*/true);
  return out;
}

void IncrementalDetokenizer::Release(std::string* out, size_t searched_up_to, bool final) {
  // A stop string that completes now ends inside the new text (pending_[searched_up_to..]); the
  // text before that was searched already, so the search starts as far back as a stop string
  // reaching into the new text can begin.
  size_t best_start = 0;
  size_t best_end = std::string::npos;
  int best = -1;
  for (size_t i = 0; i < stop_strings().size(); ++i) {
    const std::string& stop = stop_strings()[i];
    if (stop.empty()) continue;
    const size_t from = searched_up_to >= stop.size() - 1 ? searched_up_to - (stop.size() - 1) : 0;
    const size_t at = pending_.find(stop, from);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < best_start)) {
      best_start = at;
      best_end = end;
      best = static_cast<int>(i);
    }
  }
  if (best >= 0) {
    out->append(pending_, 0, options_.include_stop_str_in_output ? best_end : best_start);
    pending_.clear();
    bytes_.clear();
    stop_index_ = best;
    return;
  }
  // Hold back the longest tail of pending_ that a stop string starts with.
  size_t hold = 0;
  if (!final) {
    for (const std::string& stop : stop_strings()) {
      if (stop.empty()) continue;
      for (size_t k = std::min(stop.size() - 1, pending_.size()); k > hold; --k) {
        if (std::string_view(pending_).substr(pending_.size() - k) ==
            std::string_view(stop).substr(0, k)) {
          hold = k;
          break;
        }
      }
    }
  }
  out->append(pending_, 0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
}

}  // namespace moeserve::tokenizer
