// Helpers shared by the filter implementations (filters.cc, sequence_filters.cc). Internal to
// the interpreter.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace moeserve::jinja::internal {

using FilterArgs = std::vector<std::optional<Value>>;
using FilterTable = std::unordered_map<std::string_view, FilterFn>;

// Jinja's soft_str: Markup stays Markup, anything else becomes str().
Value SoftStr(const Value& v);
// Truthiness of an optional argument, `fallback` when absent.
bool OptBool(const std::optional<Value>& v, bool fallback);
// An optional integer argument (`fallback` when absent or None); `what` names it in errors.
Result<int64_t> OptInt(const std::optional<Value>& v, int64_t fallback, std::string_view what);
// jinja2.filters.make_attrgetter: "a.b.0" walks getitem (item first, then attribute), integer
// parts index.
Result<Value> GetAttributePath(Evaluator& in, const Value& item, const Value& attribute);
// Sort key of sort/dictsort/unique/min/max: strings lower-cased unless case_sensitive.
Value IgnoreCase(const Value& v, bool case_sensitive);

// Adds the filters over sequences and mappings (sequence_filters.cc) to `table`.
void AddSequenceFilters(FilterTable* table);

}  // namespace moeserve::jinja::internal
