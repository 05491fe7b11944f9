// JSON Schema as a Grammar: every output is JSON that validates against the schema.
//
// Enforced (at least XGrammar's coverage):
//   type (one or a list), enum, const, anyOf, oneOf (as anyOf: branches should not overlap),
//   allOf (one schema, or object schemas whose properties and required lists merge),
//   $ref to "#", "#/$defs/..", "#/definitions/..", any "#/a/b" pointer, recursive too;
//   object: properties (in the schema's order, optional ones may be left out), required,
//           additionalProperties (false when not given, as vLLM's default strict mode through
//           xgrammar; true or a schema allows further keys, never one of the named properties);
//   array:  items, prefixItems (all present; then `items`, or nothing when `items` is absent),
//           minItems, maxItems;
//   string: minLength, maxLength, pattern (regex_parser.h; the whole string matches it),
//           format date, time, date-time, email, uuid, uri, ipv4, hostname;
//   integer and number: minimum, maximum, exclusiveMinimum, exclusiveMaximum (within +-1e15;
//           numbers are then written without exponent; a fraction only where every value it
//           can take is inside).
// Ignored annotations: title, description, default, examples, $schema, $id, $comment,
//   deprecated, readOnly, writeOnly. Any other keyword is an error naming it (never ignored).
//
// Layout: compact, an optional single space after ',' and ':' (bounded: a model cannot pad).
// Numbers: an exponent has at most two digits, so every number parses to a finite double.
// Strings: any character except '"', '\' and controls, or an escape (\uXXXX without surrogates).
// Limits: text size, nesting (max_nesting), $ref chains (max_ref_depth), rules, enum size, and
// the automaton's.
#pragma once

#include <string_view>

#include "core/status.h"
#include "structured/grammar.h"

namespace moeserve::structured {

Result<Grammar> JsonSchemaGrammar(std::string_view schema_json, const Limits& limits = {});

// Any JSON object (response_format {"type": "json_object"}), in the same layout.
Grammar JsonObjectGrammar();

}  // namespace moeserve::structured
