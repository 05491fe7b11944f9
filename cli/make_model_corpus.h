// The English text make-model trains its byte-level BPE tokenizer on.
#pragma once

namespace moeserve::cli {

extern const char kMakeModelCorpus[];

}  // namespace moeserve::cli
