// Jinja's built-in filters (jinja2/filters.py) with transformers' tojson override, each matching
// the Python original's output for the same input, including Markup propagation. This file has
// the string, number and formatting filters and the filter table; sequence_filters.cc the rest.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/filter_helpers.h"
#include "jinja/operators.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace internal {

Value SoftStr(const Value& v) {
  if (v.is_string()) return v;
  return Value::String(ToStr(v));
}

bool OptBool(const std::optional<Value>& v, bool fallback) {
  return v.has_value() ? Truthy(*v) : fallback;
}

Result<int64_t> OptInt(const std::optional<Value>& v, int64_t fallback, std::string_view what) {
  if (!v.has_value() || v->is_none()) return fallback;
  if (!v->is_integral()) {
    return InvalidArgument("{} must be an integer, not '{}'", what, TypeName(*v));
  }
  return v->AsInt();
}

Result<Value> GetAttributePath(Evaluator& in, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return in.GetItem(item, attribute);
  Value current = item;
  for (const std::string& part : PySplit(attribute.AsString(), std::string("."), -1, false)) {
    Value key = Value::String(part);
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      key = Value::Int(std::strtoll(part.c_str(), nullptr, 10));
    }
    ASSIGN_OR_RETURN(current, in.GetItem(current, key));
  }
  return current;
}

Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PyLower(v.AsString()));
  return v;
}

}  // namespace internal

namespace {

using internal::FilterArgs;
using internal::OptBool;
using internal::OptInt;
using internal::SoftStr;

Result<Value> FilterAbs(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("abs", args, {}, 0));
  if (v.is_integral()) {
    if (v.AsInt() == INT64_MIN) return InvalidArgument("integer overflow in abs()");
    return Value::Int(std::llabs(v.AsInt()));
  }
  if (v.is_float()) return Value::Float(std::fabs(v.AsDouble()));
  if (v.is_undefined()) return UndefinedError(v);
  return InvalidArgument("bad operand type for abs(): '{}'", TypeName(v));
}

Result<Value> FilterAttr(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("attr", args, {"name"}, 1));
  if (v.is_undefined()) return UndefinedError(v);
  const std::string name = ToStr(*a[0]);
  // Attribute only, no item fallback (jinja2's do_attr).
  if (v.is_namespace() || v.is_loop()) return in.GetAttr(v, name);
  if (std::optional<Value> method = FindMethod(v, name)) return *method;
  return Value::Undefined(fmt::format("'{}' has no attribute '{}'", ObjectTypeRepr(v), name));
}

Result<Value> FilterCapitalize(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("capitalize", args, {}, 0));
  const Value s = SoftStr(v);
  return Value::String(PyCapitalize(s.AsString()), s.is_markup());
}

// CPython's str.center padding split.
std::string Center(const std::string& s, int64_t width, std::string_view fill) {
  const int64_t len = CodePointCount(s);
  if (width <= len) return s;
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

Result<Value> FilterCenter(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("center", args, {"width"}, 0));
  ASSIGN_OR_RETURN(int64_t width, OptInt(a[0], 80, "center width"));
  if (width > static_cast<int64_t>(kMaxStringBytes)) return InvalidArgument("width too large");
  const Value s = SoftStr(v);
  return Value::String(Center(s.AsString(), width, " "), s.is_markup());
}

Result<Value> FilterDefault(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("default", args, {"default_value", "boolean"}, 0));
  if (v.is_undefined() || (OptBool(a[1], false) && !Truthy(v))) {
    return a[0].has_value() ? *a[0] : Value::String("");
  }
  return v;
}

Result<Value> FilterEscape(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("escape", args, {}, 0));
  if (v.is_markup()) return v;
  return Value::String(HtmlEscape(ToStr(v)), true);
}

Result<Value> FilterForceEscape(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("forceescape", args, {}, 0));
  return Value::String(HtmlEscape(ToStr(v)), true);
}

Result<Value> FilterFloat(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("float", args, {"default"}, 0));
  const Value fallback = a[0].has_value() ? *a[0] : Value::Float(0.0);
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_number()) return Value::Float(v.AsDouble());
  if (v.is_string()) {
    if (std::optional<double> d = PyParseFloat(v.AsString())) return Value::Float(*d);
  }
  return fallback;
}

Result<Value> FilterInt(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("int", args, {"default", "base"}, 0));
  const Value fallback = a[0].has_value() ? *a[0] : Value::Int(0);
  ASSIGN_OR_RETURN(int64_t base, OptInt(a[1], 10, "int base"));
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value::Int(v.AsInt());
  if (v.is_float()) {
    if (std::isnan(v.AsDouble())) return fallback;  // ValueError, caught by do_int
    ASSIGN_OR_RETURN(int64_t i, ToInteger(v));
    return Value::Int(i);
  }
  if (v.is_string()) {
    if (base != 0 && (base < 2 || base > 36))
      return InvalidArgument("int() base must be >= 2 and <= 36, or 0");
    if (std::optional<int64_t> i = PyParseInt(v.AsString(), base)) return Value::Int(*i);
    // "42.23"|int is 42: do_int retries through float().
    if (std::optional<double> d = PyParseFloat(v.AsString())) {
      if (std::isnan(*d)) return fallback;
      ASSIGN_OR_RETURN(int64_t i, ToInteger(Value::Float(*d)));
      return Value::Int(i);
    }
  }
  return fallback;
}

Result<Value> FilterIndent(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("indent", args, {"width", "first", "blank"}, 0));
  std::string indention = "    ";
  if (a[0].has_value()) {
    if (a[0]->is_string()) {
      indention = a[0]->AsString();
    } else if (a[0]->is_integral()) {
      const int64_t w = a[0]->AsInt();
      if (w > 4096) return InvalidArgument("indent width too large");
      indention = std::string(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
    } else {
      return InvalidArgument("indent width must be an integer or a string");
    }
  }
  const bool first = OptBool(a[1], false), blank = OptBool(a[2], false);
  // do_indent appends "\n" to its input without converting it to str first.
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string()) {
    return InvalidArgument("unsupported operand type(s) for +=: '{}' and 'str'", TypeName(v));
  }
  const Value& s = v;
  // do_indent appends "\n" before splitlines(), which drops one trailing line break.
  const std::vector<std::string> lines = PySplitLines(s.AsString() + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) {
        rv += "\n";
        if (!lines[i].empty()) rv += indention;
      }
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  if (rv.size() > kMaxStringBytes) return InvalidArgument("indent result too large");
  return Value::String(std::move(rv), s.is_markup());
}

Result<Value> FilterLower(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("lower", args, {}, 0));
  const Value s = SoftStr(v);
  return Value::String(PyLower(s.AsString()), s.is_markup());
}

Result<Value> FilterUpper(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("upper", args, {}, 0));
  const Value s = SoftStr(v);
  return Value::String(PyUpper(s.AsString()), s.is_markup());
}

Result<Value> FilterFormat(Evaluator&, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return InvalidArgument("can't handle positional and keyword arguments at the same time");
  }
  Value format_args;
  if (!args.keyword.empty()) {
    Dict d;
    for (auto& [name, value] : args.keyword) d.Set(Value::String(name), value);
    format_args = Value::MakeDict(std::move(d));
  } else {
    format_args = Value::MakeList(args.positional, ListKind::kTuple);
  }
  const Value s = SoftStr(v);
  ASSIGN_OR_RETURN(std::string out, PercentFormat(s.AsString(), format_args, s.is_markup()));
  return Value::String(std::move(out), s.is_markup());
}

Result<Value> FilterReplace(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("replace", args, {"old", "new", "count"}, 2));
  ASSIGN_OR_RETURN(int64_t count, OptInt(a[2], -1, "replace count"));
  const std::string s = ToStr(v), old_sub = ToStr(*a[0]), new_sub = ToStr(*a[1]);
  if (!old_sub.empty() && new_sub.size() > old_sub.size() &&
      s.size() / old_sub.size() * (new_sub.size() - old_sub.size()) + s.size() > kMaxStringBytes) {
    return InvalidArgument("replace result too large");
  }
  return Value::String(PyReplace(s, old_sub, new_sub, count));
}

// Python's round(x, ndigits) for floats: correctly rounded (glibc's printf rounds the exact
// binary value half-to-even, as CPython's dtoa does).
double RoundHalfEven(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0) {
    if (ndigits > 320) return x;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  if (ndigits < -308) return std::copysign(0.0, x);
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

Result<Value> FilterRound(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("round", args, {"precision", "method"}, 0));
  ASSIGN_OR_RETURN(int64_t precision, OptInt(a[0], 0, "round precision"));
  const std::string method = a[1].has_value() ? ToStr(*a[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return InvalidArgument("method must be common, ceil or floor");
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) {
    return InvalidArgument("type {} doesn't define __round__ method", TypeName(v));
  }
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value::Int(v.AsInt());
      // round(int, -n): half-to-even on a power of ten.
      if (precision < -18) return Value::Int(0);
      int64_t p = 1;
      for (int64_t i = 0; i < -precision; ++i) p *= 10;
      const int64_t x = v.AsInt();
      int64_t q = x / p, r = x % p;
      if (r < 0) {
        r += p;
        --q;
      }
      if (2 * r > p || (2 * r == p && (q & 1))) ++q;
      int64_t out;
      if (__builtin_mul_overflow(q, p, &out)) return InvalidArgument("integer overflow in round()");
      return Value::Int(out);
    }
    return Value::Float(RoundHalfEven(v.AsDouble(), precision));
  }
  // math.ceil / math.floor of value * 10**precision, divided back: always a float.
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double scaled = v.AsDouble() * p;
  const double r = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::Float(r / p);
}

Result<Value> FilterSafe(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("safe", args, {}, 0));
  return Value::String(ToStr(v), true);
}

Result<Value> FilterString(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("string", args, {}, 0));
  RETURN_IF_ERROR(CheckPrintable(v));
  return SoftStr(v);
}

// jinja2's do_title: split on runs of `-`, whitespace and opening brackets; each piece gets its
// first character upper-cased and the rest lower-cased.
Result<Value> FilterTitle(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("title", args, {}, 0));
  const Value s = SoftStr(v);
  const std::vector<char32_t> cps = ToCodePoints(s.AsString());
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
  };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    const bool sep = is_sep(cps[i]);
    size_t j = i;
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    out += PyUpper(FromCodePoints(cps, i, i + 1));
    out += PyLower(FromCodePoints(cps, i + 1, j));
    i = j;
  }
  return Value::String(std::move(out), s.is_markup());
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), not Jinja's HTML-safe one.
Result<Value> FilterToJson(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(
      FilterArgs a,
      BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}, 0));
  JsonOptions options;
  options.ensure_ascii = OptBool(a[0], false);
  if (a[1].has_value() && !a[1]->is_none()) {
    if (a[1]->is_integral()) {
      const int64_t n = a[1]->AsInt();
      if (n > 4096) return InvalidArgument("tojson indent too large");
      options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
    } else if (a[1]->is_string()) {
      options.indent = a[1]->AsString();
    } else {
      return InvalidArgument("tojson indent must be an integer or a string");
    }
    options.item_separator = std::string(1, ',');  // json.dumps default with an indent
  }
  if (a[2].has_value() && !a[2]->is_none()) {
    ASSIGN_OR_RETURN(std::vector<Value> seps, Iterate(*a[2]));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      return InvalidArgument("tojson separators must be a pair of strings");
    }
    options.item_separator = seps[0].AsString();
    options.key_separator = seps[1].AsString();
  }
  options.sort_keys = OptBool(a[3], false);
  ASSIGN_OR_RETURN(std::string json, ToJson(v, options));
  return Value::String(std::move(json));
}

Result<Value> FilterTrim(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("trim", args, {"chars"}, 0));
  std::optional<std::string> chars;
  if (a[0].has_value() && !a[0]->is_none()) chars = ToStr(*a[0]);
  const Value s = SoftStr(v);
  return Value::String(PyStrip(s.AsString(), chars, true, true), s.is_markup());
}

Result<Value> FilterTruncate(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a,
                   BindArgs("truncate", args, {"length", "killwords", "end", "leeway"}, 0));
  ASSIGN_OR_RETURN(int64_t length, OptInt(a[0], 255, "truncate length"));
  const std::string end = a[2].has_value() ? ToStr(*a[2]) : "...";
  ASSIGN_OR_RETURN(int64_t leeway, OptInt(a[3], 5, "truncate leeway"));
  const int64_t end_len = CodePointCount(end);
  if (length < end_len) return InvalidArgument("expected length >= {}, got {}", end_len, length);
  if (leeway < 0) return InvalidArgument("expected leeway >= 0, got {}", leeway);
  // do_truncate takes len() of its input as is: short lists come back unchanged, numbers fail.
  if (!v.is_string()) {
    if ((v.is_list() && !IsIterator(v)) || v.is_dict()) {
      const auto n =
          static_cast<int64_t>(v.is_list() ? v.AsList().items.size() : v.AsDict().size());
      if (n <= length + leeway) return v;
      return InvalidArgument("'{}' object has no attribute 'rsplit'", TypeName(v));
    }
    if (v.is_undefined()) return Value::String("");
    return InvalidArgument("object of type '{}' has no len()", TypeName(v));
  }
  const std::string& s = v.AsString();
  if (CodePointCount(s) <= length + leeway) return v;
  std::string head = s.substr(0, ByteOffsetOfCodePoint(s, length - end_len));
  if (!OptBool(a[1], false)) head = PySplit(head, std::string(" "), 1, true)[0];
  return Value::String(head + end);
}

Result<Value> FilterWordCount(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("wordcount", args, {}, 0));
  // Runs of \w: letters, digits and underscore.
  int64_t words = 0;
  bool in_word = false;
  for (char32_t cp : ToCodePoints(ToStr(v))) {
    std::string one;
    AppendUtf8(cp, &one);
    const bool word_char = cp == '_' || PyIsAlnum(one);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

const internal::FilterTable& Filters() {
  static const internal::FilterTable* table = [] {
    auto* t = new internal::FilterTable{
        {"abs", FilterAbs},
        {"attr", FilterAttr},
        {"capitalize", FilterCapitalize},
        {"center", FilterCenter},
        {"d", FilterDefault},
        {"default", FilterDefault},
        {"e", FilterEscape},
        {"escape", FilterEscape},
        {"float", FilterFloat},
        {"forceescape", FilterForceEscape},
        {"format", FilterFormat},
        {"indent", FilterIndent},
        {"int", FilterInt},
        {"lower", FilterLower},
        {"replace", FilterReplace},
        {"round", FilterRound},
        {"safe", FilterSafe},
        {"string", FilterString},
        {"title", FilterTitle},
        {"tojson", FilterToJson},
        {"trim", FilterTrim},
        {"truncate", FilterTruncate},
        {"upper", FilterUpper},
        {"wordcount", FilterWordCount},
    };
    internal::AddSequenceFilters(t);
    return t;
  }();
  return *table;
}

}  // namespace

bool IsUnsupportedJinjaFilter(std::string_view name) {
  static constexpr std::string_view kNames[] = {"filesizeformat", "groupby",   "pprint",
                                                "random",         "striptags", "urlencode",
                                                "urlize",         "wordwrap",  "xmlattr"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

FilterFn FindFilter(std::string_view name) {
  const auto& filters = Filters();
  const auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

}  // namespace moeserve::jinja
