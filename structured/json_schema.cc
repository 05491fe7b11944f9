#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "structured/regex_parser.h"

namespace moeserve::structured {

namespace {

using Json = nlohmann::ordered_json;

// ---- JSON text pieces ----

// An optional single space (after ',' and ':').
Expr Space() { return Opt(Lit(" ")); }

Expr HexDigit() { return Chars({{'0', '9'}, {'A', 'F'}, {'a', 'f'}}); }

// \uXXXX without surrogates (a surrogate pair would count as one character, not two).
Expr UnicodeEscape() {
  Expr h = HexDigit();
  return Seq({Lit("\\u"), Alt({Seq({Chars({{'0', '9'}, {'A', 'C'}, {'a', 'c'}}), h, h, h}),
                               Seq({Chars({{'D', 'D'}, {'d', 'd'}}), Chars({{'0', '7'}}), h, h}),
                               Seq({Chars({{'E', 'F'}, {'e', 'f'}}), h, h, h})})});
}

// Characters a JSON string holds as themselves.
const std::vector<CodeRange> kPlainChars = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}};

// One character of a JSON string's contents: plain or escaped.
Expr JsonChar() {
  return Alt({Chars(kPlainChars),
              Seq({Lit("\\"), Chars({{'"', '"'},
                                     {'\\', '\\'},
                                     {'/', '/'},
                                     {'b', 'b'},
                                     {'f', 'f'},
                                     {'n', 'n'},
                                     {'r', 'r'},
                                     {'t', 't'}})}),
              UnicodeEscape()});
}

// A regex over code points rewritten for a JSON string's contents: '"' and '\' become their
// escapes, controls their short escapes where JSON has one (others are left out).
Expr ToJsonString(const Expr& e) {
  if (e.kind != Expr::Kind::kChars) {
    Expr out = e;
    for (Expr& c : out.children) c = ToJsonString(c);
    return out;
  }
  std::vector<Expr> alts;
  std::vector<CodeRange> plain = IntersectRanges(e.ranges, kPlainChars);
  if (!plain.empty()) alts.push_back(Chars(plain));
  auto has = [&](uint32_t c) {
    for (const CodeRange& r : e.ranges) {
      if (r.lo <= c && c <= r.hi) return true;
    }
    return false;
  };
  const std::pair<uint32_t, const char*> escapes[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"},
                                                      {'\t', "\\t"}, {'\r', "\\r"},  {'\b', "\\b"},
                                                      {'\f', "\\f"}};
  for (const auto& [c, text] : escapes) {
    if (has(c)) alts.push_back(Lit(text));
  }
  if (alts.empty()) return Chars({});  // matches nothing
  return Alt(std::move(alts));
}

// The regexes of `format`.
const std::map<std::string, std::string>& Formats() {
  static const auto* formats = new std::map<std::string, std::string>{
      {"date",
       R"([1-9]\d{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31))"},
      {"time",
       R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))"},
      {"date-time",
       R"([1-9]\d{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))"},
      {"email", R"([A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"uri", R"([a-zA-Z][a-zA-Z0-9+.-]*:[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]*)"},
      {"ipv4",
       R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
      {"hostname",
       R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,2})"},
  };
  return *formats;
}

// ---- integer ranges as digit automata ----

constexpr int64_t kNoBound = INT64_MAX;  // "unbounded" for the range helpers
// Bounds beyond are refused: below 2^53 every integer is exact as a double, so ceil and floor of
// a bound are exact.
constexpr int64_t kMaxAbsBound = 1000000000000000;  // 1e15

int Digits(int64_t x) {
  int n = 1;
  while (x >= 10) x /= 10, ++n;
  return n;
}

int64_t Pow10(int n) {
  int64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

Expr DigitRange(int lo, int hi) { return Chars({{uint32_t('0' + lo), uint32_t('0' + hi)}}); }

Expr AnyDigits(int w) { return Repeat(DigitRange(0, 9), w, w); }

// Strings of exactly w digits (leading zeros allowed) whose value is >= x (x < 10^w). Linear in
// w: only the branch that keeps x's digit recurses.
Expr AtLeast(int64_t x, int w) {
  if (w == 0) return Empty();
  const int64_t p = Pow10(w - 1);
  const int d = static_cast<int>(x / p);
  std::vector<Expr> alts = {Seq({DigitRange(d, d), AtLeast(x % p, w - 1)})};
  if (d < 9) alts.push_back(Seq({DigitRange(d + 1, 9), AnyDigits(w - 1)}));
  return Alt(std::move(alts));
}

// Strings of exactly w digits whose value is <= y (y < 10^w).
Expr AtMost(int64_t y, int w) {
  if (w == 0) return Empty();
  const int64_t p = Pow10(w - 1);
  const int d = static_cast<int>(y / p);
  std::vector<Expr> alts;
  if (d > 0) alts.push_back(Seq({DigitRange(0, d - 1), AnyDigits(w - 1)}));
  alts.push_back(Seq({DigitRange(d, d), AtMost(y % p, w - 1)}));
  return Alt(std::move(alts));
}

// Strings of exactly w digits (leading zeros allowed) whose value is in [x, y]: the shared
// leading digits, then one branch each for x's digit, the digits between, and y's digit.
Expr FixedRange(int64_t x, int64_t y, int w) {
  if (w == 1) return DigitRange(static_cast<int>(x), static_cast<int>(y));
  const int64_t p = Pow10(w - 1);
  const int dx = static_cast<int>(x / p), dy = static_cast<int>(y / p);
  const int64_t rx = x % p, ry = y % p;
  if (dx == dy) return Seq({DigitRange(dx, dx), FixedRange(rx, ry, w - 1)});
  std::vector<Expr> alts;
  alts.push_back(Seq({DigitRange(dx, dx), AtLeast(rx, w - 1)}));
  if (dx + 1 <= dy - 1) alts.push_back(Seq({DigitRange(dx + 1, dy - 1), AnyDigits(w - 1)}));
  alts.push_back(Seq({DigitRange(dy, dy), AtMost(ry, w - 1)}));
  return Alt(std::move(alts));
}

// Decimal numerals (no sign, no leading zeros) of the integers in [a, b]; 0 <= a <= b;
// b == kNoBound: no upper bound.
Expr NaturalRange(int64_t a, int64_t b) {
  std::vector<Expr> alts;
  const int la = Digits(a);
  const int lb = b == kNoBound ? la : Digits(b);
  for (int len = la; len <= lb; ++len) {
    const int64_t lo = std::max(a, len == 1 ? 0 : Pow10(len - 1));
    const int64_t hi = (b == kNoBound || len < lb) ? Pow10(len) - 1 : b;
    if (lo <= hi) alts.push_back(FixedRange(lo, hi, len));
  }
  if (b == kNoBound) {
    // Every longer numeral.
    alts.push_back(Seq({DigitRange(1, 9), Repeat(DigitRange(0, 9), la, Expr::kUnbounded)}));
  }
  return Alt(std::move(alts));
}

// Integers in [lo, hi]; -kNoBound / kNoBound: unbounded. lo <= hi.
Expr IntegerRange(int64_t lo, int64_t hi) {
  std::vector<Expr> alts;
  if (lo < 0) {
    // -m for m in [max(1, -hi), -lo].
    const int64_t a = hi >= 0 ? 1 : -hi;
    const int64_t b = lo == -kNoBound ? kNoBound : -lo;
    alts.push_back(Seq({Lit("-"), NaturalRange(a, b)}));
  }
  if (hi >= 0) alts.push_back(NaturalRange(std::max<int64_t>(lo, 0), hi));
  return Alt(std::move(alts));
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const Limits& limits) : root_(root), limits_(limits) {}

  Result<Grammar> Compile() {
    g_.root = g_.AddRule("root");
    ASSIGN_OR_RETURN(Expr body, Schema(root_, 0, 0, "#"));
    g_.bodies[g_.root] = std::move(body);
    RETURN_IF_ERROR(CheckGrammar(g_, limits_));
    return std::move(g_);
  }

  // Any JSON value (shared rules).
  int ValueRule() {
    if (value_ >= 0) return value_;
    value_ = g_.AddRule("value");
    const int object = g_.AddRule("object");
    const int array = g_.AddRule("array");
    const Expr member = Seq({Ref(StringRule()), Lit(":"), Space(), Ref(value_)});
    g_.bodies[object] =
        Seq({Lit("{"), Opt(Seq({member, Star(Seq({Lit(","), Space(), member}))})), Lit("}")});
    g_.bodies[array] = Seq(
        {Lit("["), Opt(Seq({Ref(value_), Star(Seq({Lit(","), Space(), Ref(value_)}))})), Lit("]")});
    g_.bodies[value_] = Alt({Ref(object), Ref(array), Ref(StringRule()), Ref(NumberRule()),
                             Lit("true"), Lit("false"), Lit("null")});
    object_ = object;
    return value_;
  }
  int ObjectRule() {
    ValueRule();
    return object_;
  }

 private:
  Status Error(const std::string& path, std::string_view what) const {
    return InvalidArgument("JSON schema at {}: {}", path, what);
  }

  int StringRule() {
    if (string_ < 0) {
      string_ = g_.AddRule("string");
      g_.bodies[string_] = Seq({Lit("\""), Star(JsonChar()), Lit("\"")});
    }
    return string_;
  }
  int NumberRule() {
    if (number_ < 0) {
      number_ = g_.AddRule("number");
      const Expr digits = Plus(DigitRange(0, 9));
      g_.bodies[number_] =
          Seq({Opt(Lit("-")), Alt({Lit("0"), Seq({DigitRange(1, 9), Star(DigitRange(0, 9))})}),
               Opt(Seq({Lit("."), digits})),
               // An exponent of at most two digits: every number is a finite double.
               Opt(Seq({Chars({{'E', 'E'}, {'e', 'e'}}), Opt(Chars({{'+', '+'}, {'-', '-'}})),
                        DigitRange(0, 9), Opt(DigitRange(0, 9))}))});
    }
    return number_;
  }
  int IntegerRule() {
    if (integer_ < 0) {
      integer_ = g_.AddRule("integer");
      g_.bodies[integer_] = IntegerRange(-kNoBound, kNoBound);
    }
    return integer_;
  }

  // A rule holding e (so repetitions copy one call, not the expression).
  Result<int> NewRule(const std::string& name, Expr e) {
    if (g_.bodies.size() >= limits_.max_rules) {
      return InvalidArgument("JSON schema: more than {} rules (max_rules)", limits_.max_rules);
    }
    const int r = g_.AddRule(name);
    RETURN_IF_ERROR(SetBody(r, std::move(e)));
    return r;
  }

  // Rules are where a schema's parts are copied (allOf merges, optional properties): counting
  // their nodes here bounds the grammar while it is built, before CheckGrammar sees it whole.
  Status SetBody(int rule, Expr e) {
    nodes_ += CountNodes(e);
    if (nodes_ > limits_.max_expr_nodes) {
      return InvalidArgument("JSON schema: grammar of more than {} nodes (max_expr_nodes)",
                             limits_.max_expr_nodes);
    }
    g_.bodies[rule] = std::move(e);
    return OkStatus();
  }

  Result<Expr> Schema(const Json& s, int depth, int ref_depth, const std::string& path) {
    if (depth > limits_.max_nesting) {
      return Error(path, fmt::format("nested deeper than {} (max_nesting)", limits_.max_nesting));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return Ref(ValueRule());
      return Error(path, "schema false matches nothing");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    static const std::set<std::string> kAnnotations = {
        "title",    "description", "default",  "examples",  "$schema", "$id",
        "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
    static const std::set<std::string> kKnown = {"type",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "items",
                                                 "prefixItems",
                                                 "minItems",
                                                 "maxItems",
                                                 "minLength",
                                                 "maxLength",
                                                 "pattern",
                                                 "format",
                                                 "minimum",
                                                 "maximum",
                                                 "exclusiveMinimum",
                                                 "exclusiveMaximum"};
    std::vector<std::string> keys;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kAnnotations.count(it.key())) continue;
      if (!kKnown.count(it.key())) {
        return Error(path, fmt::format("keyword '{}' is not supported", it.key()));
      }
      keys.push_back(it.key());
    }
    auto only = [&](const char* keyword, bool with_type = false) -> Status {
      for (const std::string& k : keys) {
        if (k != keyword && !(with_type && k == "type")) {
          return Error(path, fmt::format("'{}' beside '{}' is not supported", k, keyword));
        }
      }
      return OkStatus();
    };
    // const and enum may name their type too (tools write {"type": "string", "enum": [...]}):
    // the values of another type are left out.
    auto of_type = [&](const Json& v) {
      if (!s.contains("type")) return true;
      const Json& t = s["type"];
      const auto is = [&v](const Json& name) {
        return name == "string" ? v.is_string()
               : name == "integer"
                   ? v.is_number_integer() ||
                         (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))
               : name == "number"  ? v.is_number()
               : name == "boolean" ? v.is_boolean()
               : name == "null"    ? v.is_null()
               : name == "object"  ? v.is_object()
               : name == "array"   ? v.is_array()
                                   : false;
      };
      if (t.is_array()) return std::any_of(t.begin(), t.end(), is);
      return is(t);
    };
    if (s.contains("$ref")) {
      RETURN_IF_ERROR(only("$ref"));
      return RefRule(s["$ref"], depth, ref_depth, path);
    }
    if (s.contains("const")) {
      RETURN_IF_ERROR(only("const", /*with_type=*/true));
      if (!of_type(s["const"])) return Error(path, "const is not of the schema's type");
      return Lit(s["const"].dump());
    }
    if (s.contains("enum")) {
      RETURN_IF_ERROR(only("enum", /*with_type=*/true));
      const Json& values = s["enum"];
      if (!values.is_array() || values.empty()) return Error(path, "enum must be a non-empty list");
      if (values.size() > limits_.max_enum_values) {
        return Error(path, fmt::format("enum of {} values, more than {} (max_enum_values)",
                                       values.size(), limits_.max_enum_values));
      }
      std::vector<Expr> alts;
      for (const Json& v : values) {
        if (of_type(v)) alts.push_back(Lit(v.dump()));
      }
      if (alts.empty()) return Error(path, "no enum value is of the schema's type");
      return Alt(std::move(alts));
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!s.contains(keyword)) continue;
      RETURN_IF_ERROR(only(keyword));
      const Json& list = s[keyword];
      if (!list.is_array() || list.empty()) {
        return Error(path, fmt::format("{} must be a non-empty list", keyword));
      }
      std::vector<Expr> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        ASSIGN_OR_RETURN(Expr e, Schema(list[i], depth + 1, ref_depth,
                                        fmt::format("{}/{}/{}", path, keyword, i)));
        alts.push_back(std::move(e));
      }
      return Alt(std::move(alts));
    }
    if (s.contains("allOf")) {
      RETURN_IF_ERROR(only("allOf"));
      ASSIGN_OR_RETURN(Json merged, MergeAllOf(s["allOf"], ref_depth, path));
      return Schema(merged, depth + 1, ref_depth, path + "/allOf");
    }
    // The types: given, or implied by the keywords.
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Error(path, "type must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(path, "type must be a string or a list of strings");
      }
    } else {
      std::set<std::string> implied;
      for (const std::string& k : keys) {
        if (k == "properties" || k == "required" || k == "additionalProperties") {
          implied.insert("object");
        } else if (k == "items" || k == "prefixItems" || k == "minItems" || k == "maxItems") {
          implied.insert("array");
        } else if (k == "minLength" || k == "maxLength" || k == "pattern" || k == "format") {
          implied.insert("string");
        } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" ||
                   k == "exclusiveMaximum") {
          implied.insert("number");
        }
      }
      if (implied.empty()) return Ref(ValueRule());
      if (implied.size() > 1) {
        return Error(path, "keywords of several types without 'type' are not supported");
      }
      types.push_back(*implied.begin());
    }
    std::vector<Expr> alts;
    for (const std::string& t : types) {
      Result<Expr> e = Typed(s, t, depth, ref_depth, path);
      if (!e.ok()) return e.status();
      alts.push_back(std::move(e).value());
    }
    return Alt(std::move(alts));
  }

  // Every keyword of one type (minLength, ...) belongs to a type the schema lists.
  Status KeywordsOf(const Json& s, const std::string& type, const std::string& path) {
    static const std::map<std::string, std::set<std::string>> kTypesOf = {
        {"properties", {"object"}},
        {"required", {"object"}},
        {"additionalProperties", {"object"}},
        {"items", {"array"}},
        {"prefixItems", {"array"}},
        {"minItems", {"array"}},
        {"maxItems", {"array"}},
        {"minLength", {"string"}},
        {"maxLength", {"string"}},
        {"pattern", {"string"}},
        {"format", {"string"}},
        {"minimum", {"number", "integer"}},
        {"maximum", {"number", "integer"}},
        {"exclusiveMinimum", {"number", "integer"}},
        {"exclusiveMaximum", {"number", "integer"}}};
    std::set<std::string> listed = {type};
    if (s.contains("type") && s["type"].is_array()) {
      for (const Json& t : s["type"]) listed.insert(t.get<std::string>());
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      auto owners = kTypesOf.find(it.key());
      if (owners == kTypesOf.end()) continue;
      bool ok = false;
      for (const std::string& t : owners->second) ok |= listed.count(t) > 0;
      if (!ok)
        return Error(path, fmt::format("keyword '{}' does not apply to type {}", it.key(), type));
    }
    return OkStatus();
  }

  Result<Expr> Typed(const Json& s, const std::string& type, int depth, int ref_depth,
                     const std::string& path) {
    RETURN_IF_ERROR(KeywordsOf(s, type, path));
    if (type == "null") return Lit("null");
    if (type == "boolean") return Alt({Lit("true"), Lit("false")});
    if (type == "string") return StringSchema(s, path);
    if (type == "integer" || type == "number") return NumberSchema(s, type == "integer", path);
    if (type == "object") return ObjectSchema(s, depth, ref_depth, path);
    if (type == "array") return ArraySchema(s, depth, ref_depth, path);
    return Error(path, fmt::format("unknown type '{}'", type));
  }

  Result<int> Count(const Json& s, const char* keyword, const std::string& path) {
    const Json& v = s[keyword];
    if (!v.is_number_integer() &&
        !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))) {
      return Error(path, fmt::format("{} must be an integer", keyword));
    }
    const double d = v.get<double>();
    if (d < 0) return Error(path, fmt::format("{} must not be negative", keyword));
    if (d > limits_.max_repeat) {
      return Error(
          path, fmt::format("{} of {} is above {} (max_repeat)", keyword, d, limits_.max_repeat));
    }
    return static_cast<int>(d);
  }

  Result<Expr> StringSchema(const Json& s, const std::string& path) {
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern") || s.contains("format")) {
      if (has_length) return Error(path, "minLength/maxLength beside pattern or format");
      if (s.contains("pattern") && s.contains("format")) {
        return Error(path, "pattern beside format is not supported");
      }
      std::string regex;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) return Error(path, "pattern must be a string");
        regex = s["pattern"].get<std::string>();
        // JSON Schema's pattern searches; the whole string matching it is one way to match.
        if (!regex.empty() && regex.front() == '^') regex.erase(0, 1);
        if (!regex.empty() && regex.back() == '$' &&
            (regex.size() < 2 || regex[regex.size() - 2] != '\\')) {
          regex.pop_back();
        }
      } else {
        if (!s["format"].is_string()) return Error(path, "format must be a string");
        const std::string format = s["format"].get<std::string>();
        auto it = Formats().find(format);
        if (it == Formats().end()) {
          return Error(path, fmt::format("format '{}' is not supported", format));
        }
        regex = it->second;
      }
      Result<Expr> e = ParseRegex(regex, limits_);
      if (!e.ok()) return Error(path, e.status().message());
      return Seq({Lit("\""), ToJsonString(*e), Lit("\"")});
    }
    if (!has_length) return Ref(StringRule());
    int min = 0, max = Expr::kUnbounded;
    if (s.contains("minLength")) {
      ASSIGN_OR_RETURN(min, Count(s, "minLength", path));
    }
    if (s.contains("maxLength")) {
      ASSIGN_OR_RETURN(max, Count(s, "maxLength", path));
      if (max < min) return Error(path, "maxLength below minLength");
    }
    return Seq({Lit("\""), Repeat(JsonChar(), min, max), Lit("\"")});
  }

  Result<Expr> NumberSchema(const Json& s, bool integer, const std::string& path) {
    // Bounds as doubles; lo_strict: the bound itself is excluded.
    double lo = -INFINITY, hi = INFINITY;
    bool lo_strict = false, hi_strict = false;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number()) return Error(path, fmt::format("{} must be a number", k));
      const double v = s[k].get<double>();
      // Integers are compared as integers (1e17 + 1 is 1e17 as a double).
      const bool too_far =
          s[k].is_number_unsigned() ? s[k].get<uint64_t>() > uint64_t(kMaxAbsBound)
          : s[k].is_number_integer()
              ? s[k].get<int64_t>() < -kMaxAbsBound || s[k].get<int64_t>() > kMaxAbsBound
              : !std::isfinite(v) || std::fabs(v) > double(kMaxAbsBound);
      if (too_far) {
        return Error(path, fmt::format("{} of {} is beyond +-1e15", k, v));
      }
      const bool strict = k[0] == 'e';
      const bool is_min = std::string_view(k).find("inimum") != std::string_view::npos;
      if (is_min && (v > lo || (v == lo && strict))) lo = v, lo_strict = strict;
      if (!is_min && (v < hi || (v == hi && strict))) hi = v, hi_strict = strict;
    }
    if (std::isinf(lo) && std::isinf(hi)) return Ref(integer ? IntegerRule() : NumberRule());
    // The integers inside.
    int64_t ilo = -kNoBound, ihi = kNoBound;
    if (!std::isinf(lo)) {
      ilo = static_cast<int64_t>(std::ceil(lo));
      if (lo_strict && double(ilo) == lo) ++ilo;
    }
    if (!std::isinf(hi)) {
      ihi = static_cast<int64_t>(std::floor(hi));
      if (hi_strict && double(ihi) == hi) --ihi;
    }
    std::vector<Expr> alts;
    if (ilo <= ihi) alts.push_back(IntegerRange(ilo, ihi));
    if (!integer) {
      // I.F with F's last digit nonzero lies strictly between I and I+1 (or -I-1 and -I).
      const Expr fraction = Seq({Lit("."), Star(DigitRange(0, 9)), DigitRange(1, 9)});
      // Positive: I >= 0, I >= ceil(lo), I + 1 <= hi.
      int64_t a = std::max<int64_t>(0, std::isinf(lo) ? 0 : static_cast<int64_t>(std::ceil(lo)));
      int64_t b = std::isinf(hi) ? kNoBound : static_cast<int64_t>(std::floor(hi)) - 1;
      if (b == kNoBound || a <= b) alts.push_back(Seq({NaturalRange(a, b), fraction}));
      // Negative: -(I + 1) >= lo, -I <= hi, I >= 0.
      a = std::max<int64_t>(0, std::isinf(hi) ? 0 : static_cast<int64_t>(std::ceil(-hi)));
      b = std::isinf(lo) ? kNoBound : static_cast<int64_t>(std::floor(-lo)) - 1;
      if (b == kNoBound || a <= b) alts.push_back(Seq({Lit("-"), NaturalRange(a, b), fraction}));
    }
    if (alts.empty()) return Error(path, "no number lies within the bounds");
    return Alt(std::move(alts));
  }

  // Key strings (no escapes) other than every name of `names` (each as its JSON text, quotes
  // excluded): the complement of a finite set over the plain characters, built on their trie.
  Expr KeyNotIn(const std::vector<std::u32string>& names) {
    bool has_empty = false;
    std::map<char32_t, std::vector<std::u32string>> by_first;
    for (const std::u32string& n : names) {
      if (n.empty()) {
        has_empty = true;
      } else {
        by_first[n[0]].push_back(n.substr(1));
      }
    }
    const std::vector<CodeRange> plain =
        IntersectRanges(kPlainChars, ComplementRanges({{'\\', '\\'}}));
    std::vector<Expr> alts;
    if (!has_empty) alts.push_back(Empty());
    std::vector<CodeRange> firsts;
    for (const auto& [c, rest] : by_first) firsts.push_back({uint32_t(c), uint32_t(c)});
    const std::vector<CodeRange> others = IntersectRanges(plain, ComplementRanges(firsts));
    if (!others.empty()) alts.push_back(Seq({Chars(others), Star(Chars(plain))}));
    for (const auto& [c, rest] : by_first) {
      if (IntersectRanges(plain, {{uint32_t(c), uint32_t(c)}}).empty()) continue;
      alts.push_back(Seq({Char(c), KeyNotIn(rest)}));
    }
    return Alt(std::move(alts));
  }

  Result<Expr> ObjectSchema(const Json& s, int depth, int ref_depth, const std::string& path) {
    struct Property {
      std::string name;
      Expr member;  // "name": value
      bool required = false;
    };
    std::vector<Property> props;
    if (s.contains("properties")) {
      const Json& p = s["properties"];
      if (!p.is_object()) return Error(path, "properties must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        ASSIGN_OR_RETURN(
            Expr value, Schema(it.value(), depth + 1, ref_depth, path + "/properties/" + it.key()));
        ASSIGN_OR_RETURN(int rule, NewRule("property " + it.key(), std::move(value)));
        props.push_back(
            {it.key(), Seq({Lit(Json(it.key()).dump()), Lit(":"), Space(), Ref(rule)}), false});
      }
    }
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) return Error(path, "required must be a list");
      for (const Json& name : r) {
        if (!name.is_string()) return Error(path, "required must list strings");
        bool found = false;
        for (Property& p : props) {
          if (p.name == name.get<std::string>()) p.required = found = true;
        }
        if (!found) {
          return Error(path, fmt::format("required property '{}' is not in properties",
                                         name.get<std::string>()));
        }
      }
    }
    // Further keys: additionalProperties true or a schema (false when absent: strict mode).
    std::optional<Expr> extra;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        ASSIGN_OR_RETURN(Expr value,
                         Schema(a, depth + 1, ref_depth, path + "/additionalProperties"));
        ASSIGN_OR_RETURN(int value_rule, NewRule("additional value", std::move(value)));
        std::vector<std::u32string> names;
        for (const Property& p : props) {
          std::u32string u;
          size_t i = 0;
          const std::string quoted = Json(p.name).dump();
          const std::string_view text(quoted.data() + 1, quoted.size() - 2);
          while (i < text.size()) u += static_cast<char32_t>(DecodeUtf8(text, &i));
          names.push_back(std::move(u));
        }
        ASSIGN_OR_RETURN(int key_rule,
                         NewRule("additional key", Seq({Lit("\""), KeyNotIn(names), Lit("\"")})));
        extra = Seq({Ref(key_rule), Lit(":"), Space(), Ref(value_rule)});
      }
    }
    // rest(i, first): the members from property i on; `first`: none written yet (no comma).
    // Rules per (i, first) keep optional properties from doubling the grammar.
    std::map<std::pair<size_t, bool>, int> rest_rules;
    const size_t n = props.size();
    std::function<Result<Expr>(size_t, bool)> rest = [&](size_t i, bool first) -> Result<Expr> {
      auto member = [&](const Expr& m) { return first ? m : Seq({Lit(","), Space(), m}); };
      if (i == n) {
        if (!extra) return Empty();
        const Expr more = Star(Seq({Lit(","), Space(), *extra}));
        return first ? Opt(Seq({*extra, more})) : more;
      }
      if (props[i].required) {
        ASSIGN_OR_RETURN(Expr tail, rest(i + 1, false));
        return Seq({member(props[i].member), std::move(tail)});
      }
      auto key = std::make_pair(i, first);
      if (auto it = rest_rules.find(key); it != rest_rules.end()) return Ref(it->second);
      ASSIGN_OR_RETURN(const int rule,
                       NewRule(fmt::format("{} members from {}", path, i), Empty()));
      rest_rules[key] = rule;
      ASSIGN_OR_RETURN(Expr with_tail, rest(i + 1, false));
      ASSIGN_OR_RETURN(Expr without, rest(i + 1, first));
      RETURN_IF_ERROR(SetBody(
          rule, Alt({Seq({member(props[i].member), std::move(with_tail)}), std::move(without)})));
      return Ref(rule);
    };
    ASSIGN_OR_RETURN(Expr members, rest(0, true));
    return Seq({Lit("{"), std::move(members), Lit("}")});
  }

  Result<Expr> ArraySchema(const Json& s, int depth, int ref_depth, const std::string& path) {
    int min = 0, max = Expr::kUnbounded;
    if (s.contains("minItems")) {
      ASSIGN_OR_RETURN(min, Count(s, "minItems", path));
    }
    if (s.contains("maxItems")) {
      ASSIGN_OR_RETURN(max, Count(s, "maxItems", path));
      if (max < min) return Error(path, "maxItems below minItems");
    }
    std::vector<Expr> prefix;
    if (s.contains("prefixItems")) {
      const Json& p = s["prefixItems"];
      if (!p.is_array()) return Error(path, "prefixItems must be a list");
      for (size_t i = 0; i < p.size(); ++i) {
        ASSIGN_OR_RETURN(
            Expr e, Schema(p[i], depth + 1, ref_depth, fmt::format("{}/prefixItems/{}", path, i)));
        ASSIGN_OR_RETURN(int rule, NewRule(fmt::format("{} item {}", path, i), std::move(e)));
        prefix.push_back(Ref(rule));
      }
    }
    const int k = static_cast<int>(prefix.size());
    if (max != Expr::kUnbounded && max < k) {
      return Error(path, "maxItems below the number of prefixItems");
    }
    // The items after the prefix: `items`, or any value without prefixItems, or none.
    std::optional<Expr> item;
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (!(it.is_boolean() && !it.get<bool>())) {
        ASSIGN_OR_RETURN(Expr e, Schema(it, depth + 1, ref_depth, path + "/items"));
        ASSIGN_OR_RETURN(int rule, NewRule(path + " items", std::move(e)));
        item = Ref(rule);
      }
    } else if (k == 0) {
      item = Ref(ValueRule());
    }
    const int more_min = std::max(0, min - k);
    const int more_max = max == Expr::kUnbounded ? max : max - k;
    if (!item && more_min > 0) return Error(path, "minItems needs more items than allowed");
    std::vector<Expr> parts = {Lit("[")};
    if (k > 0) {
      for (int i = 0; i < k; ++i)
        parts.push_back(i == 0 ? prefix[0] : Seq({Lit(","), Space(), prefix[i]}));
      if (item && more_max != 0)
        parts.push_back(Repeat(Seq({Lit(","), Space(), *item}), more_min, more_max));
    } else if (item && more_max != 0) {
      Expr list = Seq({*item, Repeat(Seq({Lit(","), Space(), *item}), std::max(0, more_min - 1),
                                     more_max == Expr::kUnbounded ? more_max : more_max - 1)});
      parts.push_back(more_min == 0 ? Opt(std::move(list)) : std::move(list));
    }
    parts.push_back(Lit("]"));
    return Seq(std::move(parts));
  }

  // The schema a "#..." reference names.
  Result<const Json*> Resolve(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Error(path, "$ref must be a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#') {
      return Error(path, fmt::format("$ref '{}': only references inside the schema (#...)", r));
    }
    try {
      const Json& target = root_.at(Json::json_pointer(r.substr(1)));
      return &target;
    } catch (const nlohmann::json::exception&) {
      return Error(path, fmt::format("$ref '{}' names nothing in the schema", r));
    }
  }

  Result<Expr> RefRule(const Json& ref, int depth, int ref_depth, const std::string& path) {
    if (ref_depth >= limits_.max_ref_depth) {
      return Error(path,
                   fmt::format("$ref chain deeper than {} (max_ref_depth)", limits_.max_ref_depth));
    }
    ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
    const std::string key = ref.get<std::string>();
    if (auto it = ref_rules_.find(key); it != ref_rules_.end()) return Ref(it->second);
    // The rule exists before its body, so a recursive reference finds it.
    ASSIGN_OR_RETURN(const int rule, NewRule(key, Empty()));
    ref_rules_[key] = rule;
    ASSIGN_OR_RETURN(Expr body, Schema(*target, depth + 1, ref_depth + 1, key));
    RETURN_IF_ERROR(SetBody(rule, std::move(body)));
    return Ref(rule);
  }

  // allOf's schemas as one: one schema, or object schemas (after their $refs) whose properties
  // and required lists are merged.
  Result<Json> MergeAllOf(const Json& list, int ref_depth, const std::string& path) {
    if (!list.is_array() || list.empty()) return Error(path, "allOf must be a non-empty list");
    if (list.size() == 1) return list[0];
    Json merged = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
    for (size_t i = 0; i < list.size(); ++i) {
      const Json* part = &list[i];
      for (int hops = 0; part->is_object() && part->contains("$ref"); ++hops) {
        if (hops + ref_depth >= limits_.max_ref_depth) {
          return Error(path, fmt::format("$ref chain deeper than {} (max_ref_depth)",
                                         limits_.max_ref_depth));
        }
        ASSIGN_OR_RETURN(part, Resolve((*part)["$ref"], path));
      }
      if (!part->is_object()) return Error(path, "allOf of non-object schemas is not supported");
      for (auto it = part->begin(); it != part->end(); ++it) {
        const std::string& k = it.key();
        if (k == "type") {
          if (it.value() != "object") return Error(path, "allOf: only object schemas combine");
        } else if (k == "properties") {
          if (!it.value().is_object()) return Error(path, "properties must be an object");
          for (auto p = it.value().begin(); p != it.value().end(); ++p) {
            if (merged["properties"].contains(p.key())) {
              return Error(path, fmt::format("allOf: property '{}' in two schemas", p.key()));
            }
            merged["properties"][p.key()] = p.value();
          }
        } else if (k == "required") {
          for (const Json& r : it.value()) merged["required"].push_back(r);
        } else if (k == "additionalProperties") {
          merged["additionalProperties"] = it.value();
        } else if (k != "title" && k != "description") {
          return Error(path, fmt::format("allOf: keyword '{}' cannot be combined", k));
        }
      }
    }
    return merged;
  }

  const Json& root_;
  const Limits& limits_;
  Grammar g_;
  int value_ = -1, object_ = -1, string_ = -1, number_ = -1, integer_ = -1;
  size_t nodes_ = 0;
  std::map<std::string, int> ref_rules_;
};

}  // namespace

Result<Grammar> JsonSchemaGrammar(std::string_view schema_json, const Limits& limits) {
  if (schema_json.size() > limits.max_spec_bytes) {
    return InvalidArgument("JSON schema of {} bytes: more than {} (max_spec_bytes)",
                           schema_json.size(), limits.max_spec_bytes);
  }
  ASSIGN_OR_RETURN(Json schema, ParseJson<Json>(schema_json, "JSON schema", limits.max_nesting));
  return SchemaCompiler(schema, limits).Compile();
}

Grammar JsonObjectGrammar() {
  return JsonSchemaGrammar(R"({"type": "object", "additionalProperties": true})").value();
}

}  // namespace moeserve::structured
