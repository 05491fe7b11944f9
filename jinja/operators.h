// Python semantics of Jinja's operators: int/float arithmetic with floor division and modulo
// following the divisor's sign, str and list concatenation and repetition, markupsafe's escaping
// when Markup meets str, chained comparisons, `in`, and printf-style `%` string formatting.
#pragma once

#include <string>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace moeserve::jinja {

// Largest string or list an operation may build, and the largest rendered output: a prompt is
// megabytes at most, so anything near this is a runaway template (`'x' * 10**12`).
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;

// Arithmetic and `~` (kAnd / kOr are short-circuited by the interpreter, never passed here).
Result<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b);
Result<Value> UnaryOperation(UnaryOp op, const Value& v);
Result<bool> CompareOperation(CompareOp op, const Value& a, const Value& b);

// Python's `format % args`: args is a tuple for several values, a dict for %(name)s fields, or
// one value. `escape` is markupsafe's Markup.__mod__: %s and %r output is HTML-escaped unless the
// argument is Markup itself.
Result<std::string> PercentFormat(std::string_view format, const Value& args, bool escape = false);

// Python iter(): list items, dict keys, str code points; Undefined iterates as empty.
Result<std::vector<Value>> Iterate(const Value& v);

// Python `item in container`.
Result<bool> Contains(const Value& container, const Value& item);

// Python's int(x) and float(x) conversions used by filters and tests.
Result<int64_t> ToInteger(const Value& v);

// The error Jinja raises when an Undefined is used in an operation.
Status UndefinedError(const Value& undefined);

}  // namespace moeserve::jinja
