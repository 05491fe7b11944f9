// JSON text to interpreter values, as Python's json.loads builds them: objects keep key order
// (later duplicates overwrite in place), integers stay int, numbers with a fraction or exponent
// are float (so 1.0 renders "1.0"). The JSON library stays private to this file.
#pragma once

#include <string_view>

#include "core/status.h"
#include "jinja/value.h"

namespace moeserve::jinja {

// `what` names the input in error messages ("messages_json").
Result<Value> ParseJsonValue(std::string_view json_text, std::string_view what);

}  // namespace moeserve::jinja
