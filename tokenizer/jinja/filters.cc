// Jinja's built-in filters (jinja2/filters.py) with transformers' tojson override, each matching
// the Python original's output for the same input, including Markup propagation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace moeserve::tokenizer::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

// Jinja's soft_str: Markup stays Markup, everything else becomes str(). Returns the text and
// whether it is Markup.
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

// jinja2.filters.make_attrgetter: "a.b.0" walks getitem (item first, then attribute), integer
// parts index.
Result<Value> GetAttributePath(Interpreter& in, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return in.GetItem(item, attribute);
  Value current = item;
  for (const std::string& part : PySplit(attribute.AsString(), std::string("."), -1, false)) {
    Value key = Value::String(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
          return c >= '0' && c <= '9';
        })) {
      key = Value::Int(std::strtoll(part.c_str(), nullptr, 10));
    }
    ASSIGN_OR_RETURN(current, in.GetItem(current, key));
  }
  return current;
}

// Sort key of sort/dictsort/unique/min/max: strings lower-cased unless case_sensitive.
Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PyLower(v.AsString()));
  return v;
}

// Stable sort of `items` by `keys` with Python ordering; an unorderable pair is an error.
Status SortByKeys(std::vector<Value>* items, std::vector<Value>* keys, bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    // Python's sort with reverse=True keeps equal elements in their original order too.
    Result<int> c = reverse ? Compare((*keys)[b], (*keys)[a], "<") : Compare((*keys)[a], (*keys)[b], "<");
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return *c < 0;
  });
  RETURN_IF_ERROR(error);
  std::vector<Value> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return OkStatus();
}

Result<Value> FilterAbs(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("abs", args, {}, 0));
  if (v.is_integral()) {
    if (v.AsInt() == INT64_MIN) return InvalidArgument("integer overflow in abs()");
    return Value::Int(std::llabs(v.AsInt()));
  }
  if (v.is_float()) return Value::Float(std::fabs(v.AsDouble()));
  if (v.is_undefined()) return UndefinedError(v);
  return InvalidArgument("bad operand type for abs(): '{}'", TypeName(v));
}

Result<Value> FilterAttr(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("attr", args, {"name"}, 1));
  if (v.is_undefined()) return UndefinedError(v);
  const std::string name = ToStr(*a[0]);
  // Attribute only, no item fallback (jinja2's do_attr).
  if (v.is_namespace() || v.is_loop()) return in.GetAttr(v, name);
  if (std::optional<Value> method = FindMethod(v, name)) return *method;
  return Value::Undefined(fmt::format("'{}' has no attribute '{}'", ObjectTypeRepr(v), name));
}

Result<Value> FilterBatch(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("batch", args, {"linecount", "fill_with"}, 1));
  ASSIGN_OR_RETURN(int64_t n, OptInt(a[0], 1, "batch linecount"));
  if (n <= 0) return InvalidArgument("batch linecount must be positive");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> batches, current;
  for (Value& item : items) {
    if (static_cast<int64_t>(current.size()) == n) {
      batches.push_back(Value::MakeList(std::move(current)));
      current.clear();
    }
    current.push_back(std::move(item));
  }
  if (!current.empty()) {
    if (a[1].has_value() && !a[1]->is_none()) {
      while (static_cast<int64_t>(current.size()) < n) current.push_back(*a[1]);
    }
    batches.push_back(Value::MakeList(std::move(current)));
  }
  return MakeIterator(std::move(batches));
}

Result<Value> FilterCapitalize(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("capitalize", args, {}, 0));
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

Result<Value> FilterCenter(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("center", args, {"width"}, 0));
  ASSIGN_OR_RETURN(int64_t width, OptInt(a[0], 80, "center width"));
  if (width > static_cast<int64_t>(kMaxStringBytes)) return InvalidArgument("width too large");
  const Value s = SoftStr(v);
  return Value::String(Center(s.AsString(), width, " "), s.is_markup());
}

Result<Value> FilterDefault(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("default", args, {"default_value", "boolean"}, 0));
  if (v.is_undefined() || (OptBool(a[1], false) && !Truthy(v))) {
    return a[0].has_value() ? *a[0] : Value::String("");
  }
  return v;
}

Result<Value> FilterDictSort(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a,
                   BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"}, 0));
  if (!v.is_dict()) {
    if (v.is_undefined()) return UndefinedError(v);
    return InvalidArgument("dictsort requires a mapping, not '{}'", TypeName(v));
  }
  const bool case_sensitive = OptBool(a[0], false);
  const std::string by = a[1].has_value() ? ToStr(*a[1]) : "key";
  if (by != "key" && by != "value") {
    return InvalidArgument("You can only sort by either 'key' or 'value'");
  }
  std::vector<Value> items, keys;
  for (const auto& [k, value] : v.AsDict().entries()) {
    items.push_back(Value::MakeList({k, value}, ListKind::kTuple));
    keys.push_back(IgnoreCase(by == "key" ? k : value, case_sensitive));
  }
  RETURN_IF_ERROR(SortByKeys(&items, &keys, OptBool(a[2], false)));
  return Value::MakeList(std::move(items));
}

Result<Value> FilterEscape(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("escape", args, {}, 0));
  if (v.is_markup()) return v;
  return Value::String(HtmlEscape(ToStr(v)), true);
}

Result<Value> FilterForceEscape(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("forceescape", args, {}, 0));
  return Value::String(HtmlEscape(ToStr(v)), true);
}

Result<Value> FilterFirst(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("first", args, {}, 0));
  if (IsIterator(v)) {  // next(iter(x)) takes one item off an iterator
    const List& it = v.AsList();
    if (it.position >= it.items.size()) return Value::Undefined("No first item, sequence was empty.");
    return it.items[it.position++];
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> FilterLast(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("last", args, {}, 0));
  if (IsIterator(v)) return InvalidArgument("'{}' object is not reversible", TypeName(v));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): optional whitespace and sign, decimal digits with single underscores, an
// optional exponent, or inf/infinity/nan.
std::optional<double> ParsePyFloat(std::string_view text) {
  const std::string s = PyStrip(text, std::nullopt, true, true);
  std::string clean;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
  const std::string rest = PyLower(s.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    return std::strtod((clean + rest).c_str(), nullptr);
  }
  bool digits = false, prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      prev_digit = true;
      clean.push_back(c);
    } else if (c == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
      prev_digit = false;
      clean.push_back(c);
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python int(str, base): whitespace, sign, digits with single underscores, a 0x/0o/0b prefix
// matching the base (any for base 0).
std::optional<int64_t> ParsePyInt(std::string_view text, int64_t base) {
  std::string s = PyStrip(text, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  unsigned __int128 value = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    value = value * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (value > static_cast<unsigned __int128>(INT64_MAX) + 1) return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  if (!negative && value > static_cast<unsigned __int128>(INT64_MAX)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - static_cast<uint64_t>(value))
                  : static_cast<int64_t>(value);
}

Result<Value> FilterFloat(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("float", args, {"default"}, 0));
  const Value fallback = a[0].has_value() ? *a[0] : Value::Float(0.0);
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_number()) return Value::Float(v.AsDouble());
  if (v.is_string()) {
    if (std::optional<double> d = ParsePyFloat(v.AsString())) return Value::Float(*d);
  }
  return fallback;
}

Result<Value> FilterInt(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("int", args, {"default", "base"}, 0));
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
    if (base != 0 && (base < 2 || base > 36)) return InvalidArgument("int() base must be >= 2 and <= 36, or 0");
    if (std::optional<int64_t> i = ParsePyInt(v.AsString(), base)) return Value::Int(*i);
    // "42.23"|int is 42: do_int retries through float().
    if (std::optional<double> d = ParsePyFloat(v.AsString())) {
      if (std::isnan(*d)) return fallback;
      ASSIGN_OR_RETURN(int64_t i, ToInteger(Value::Float(*d)));
      return Value::Int(i);
    }
  }
  return fallback;
}

Result<Value> FilterIndent(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("indent", args, {"width", "first", "blank"}, 0));
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

Result<Value> FilterItems(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("items", args, {}, 0));
  if (v.is_undefined()) return MakeIterator({});
  if (!v.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, value] : v.AsDict().entries()) {
    items.push_back(Value::MakeList({k, value}, ListKind::kTuple));
  }
  return MakeIterator(std::move(items));
}

Result<Value> FilterJoin(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("join", args, {"d", "attribute"}, 0));
  const std::string sep = a[0].has_value() ? ToStr(*a[0]) : "";
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (a[1].has_value() && !a[1]->is_none()) {
      ASSIGN_OR_RETURN(item, GetAttributePath(in, item, *a[1]));
    }
    if (i) out += sep;
    RETURN_IF_ERROR(CheckPrintable(item));
    out += ToStr(item);
    if (out.size() > kMaxStringBytes) return InvalidArgument("join result too large");
  }
  return Value::String(std::move(out));
}

Result<Value> FilterLength(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("length", args, {}, 0));
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Value::Int(0);
    case Value::Kind::kString: return Value::Int(CodePointCount(v.AsString()));
    case Value::Kind::kList:
      if (IsIterator(v)) return InvalidArgument("object of type '{}' has no len()", TypeName(v));
      return Value::Int(static_cast<int64_t>(v.AsList().items.size()));
    case Value::Kind::kDict: return Value::Int(static_cast<int64_t>(v.AsDict().size()));
    case Value::Kind::kLoop:
      return Value::Int(static_cast<int64_t>(v.AsLoop().items->items.size()));
    default: return InvalidArgument("object of type '{}' has no len()", TypeName(v));
  }
}

Result<Value> FilterList(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("list", args, {}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  return Value::MakeList(std::move(items));
}

Result<Value> FilterLower(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("lower", args, {}, 0));
  const Value s = SoftStr(v);
  return Value::String(PyLower(s.AsString()), s.is_markup());
}

Result<Value> FilterUpper(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("upper", args, {}, 0));
  const Value s = SoftStr(v);
  return Value::String(PyUpper(s.AsString()), s.is_markup());
}

// map(attribute='x', default=...) or map('filter', args...).
// jinja2's map/select/reject iterate only `if value:`, so a falsy non-iterable (0, None, False)
// gives an empty result instead of an error.
Result<std::vector<Value>> IterateIfTruthy(const Value& v) {
  if (!Truthy(v)) return std::vector<Value>{};
  return Iterate(v);
}

Result<Value> FilterMap(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, IterateIfTruthy(v));
  std::vector<Value> out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    std::optional<Value> attribute, fallback;
    for (auto& [name, value] : args.keyword) {
      if (name == "attribute") attribute = value;
      else if (name == "default") fallback = value;
      else return InvalidArgument("map() got an unexpected keyword argument '{}'", name);
    }
    if (!attribute.has_value()) return InvalidArgument("map requires a filter name or attribute=");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value mapped, GetAttributePath(in, item, *attribute));
      if (mapped.is_undefined() && fallback.has_value()) mapped = *fallback;
      out.push_back(std::move(mapped));
    }
    return MakeIterator(std::move(out));
  }
  if (!args.positional[0].is_string()) return InvalidArgument("map filter name must be a string");
  const std::string name = args.positional[0].AsString();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value mapped, in.ApplyFilter(name, item, rest));
    out.push_back(std::move(mapped));
  }
  return MakeIterator(std::move(out));
}

// select / reject / selectattr / rejectattr.
Result<Value> SelectOrReject(Interpreter& in, const Value& v, CallArgs& args, bool select,
                             bool by_attribute) {
  ASSIGN_OR_RETURN(std::vector<Value> items, IterateIfTruthy(v));
  std::vector<Value> positional = args.positional;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (positional.empty()) return InvalidArgument("Missing parameter for attribute name");
    attribute = positional.front();
    positional.erase(positional.begin());
  }
  std::optional<std::string> test;
  if (!positional.empty()) {
    if (!positional.front().is_string()) return InvalidArgument("test name must be a string");
    test = positional.front().AsString();
    positional.erase(positional.begin());
  }
  CallArgs test_args;
  test_args.positional = std::move(positional);
  test_args.keyword = args.keyword;
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (attribute) {
      ASSIGN_OR_RETURN(subject, GetAttributePath(in, item, *attribute));
    }
    bool pass;
    if (test) {
      ASSIGN_OR_RETURN(pass, in.ApplyTest(*test, subject, test_args));
    } else {
      pass = Truthy(subject);
    }
    if (pass == select) out.push_back(item);
  }
  return MakeIterator(std::move(out));
}

Result<Value> FilterSelect(Interpreter& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, false);
}
Result<Value> FilterReject(Interpreter& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, false);
}
Result<Value> FilterSelectAttr(Interpreter& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, true);
}
Result<Value> FilterRejectAttr(Interpreter& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, true);
}

Result<Value> MinOrMax(Interpreter& in, const Value& v, CallArgs& args, bool max) {
  ASSIGN_OR_RETURN(Args a, BindArgs(max ? "max" : "min", args, {"case_sensitive", "attribute"}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const bool case_sensitive = OptBool(a[0], false);
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = items[i];
    if (a[1].has_value() && !a[1]->is_none()) {
      ASSIGN_OR_RETURN(key, GetAttributePath(in, items[i], *a[1]));
    }
    key = IgnoreCase(key, case_sensitive);
    if (i == 0) {
      best_key = key;
      continue;
    }
    ASSIGN_OR_RETURN(int c, Compare(key, best_key, max ? ">" : "<"));
    if (max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Result<Value> FilterMax(Interpreter& in, const Value& v, CallArgs& args) {
  return MinOrMax(in, v, args, true);
}
Result<Value> FilterMin(Interpreter& in, const Value& v, CallArgs& args) {
  return MinOrMax(in, v, args, false);
}

Result<Value> FilterFormat(Interpreter&, const Value& v, CallArgs& args) {
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

Result<Value> FilterReplace(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("replace", args, {"old", "new", "count"}, 2));
  ASSIGN_OR_RETURN(int64_t count, OptInt(a[2], -1, "replace count"));
  const std::string s = ToStr(v), old_sub = ToStr(*a[0]), new_sub = ToStr(*a[1]);
  if (!old_sub.empty() && new_sub.size() > old_sub.size() &&
      s.size() / old_sub.size() * (new_sub.size() - old_sub.size()) + s.size() > kMaxStringBytes) {
    return InvalidArgument("replace result too large");
  }
  return Value::String(PyReplace(s, old_sub, new_sub, count));
}

Result<Value> FilterReverse(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("reverse", args, {}, 0));
  if (v.is_string()) {
    std::vector<char32_t> cps = ToCodePoints(v.AsString());
    std::reverse(cps.begin(), cps.end());
    return Value::String(FromCodePoints(cps, 0, cps.size()), v.is_markup());
  }
  if (v.is_undefined()) return UndefinedError(v);
  const bool reversible = !IsIterator(v) && (v.is_list() || v.is_dict());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::reverse(items.begin(), items.end());
  // reversed(x) is a lazy iterator; what reversed() rejects (an iterator) do_reverse turns into
  // a list.
  if (!reversible) return Value::MakeList(std::move(items));
  const char* type = "list_reverseiterator";
  if (v.is_dict()) {
    type = "dict_reversekeyiterator";
  } else {
    switch (v.AsList().kind) {
      case ListKind::kTuple: type = "reversed"; break;
      case ListKind::kRange: type = "range_iterator"; break;
      case ListKind::kDictKeys: type = "dict_reversekeyiterator"; break;
      case ListKind::kDictValues: type = "dict_reversevalueiterator"; break;
      case ListKind::kDictItems: type = "dict_reverseitemiterator"; break;
      default: break;
    }
  }
  return MakeIterator(std::move(items), type);
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

Result<Value> FilterRound(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("round", args, {"precision", "method"}, 0));
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

Result<Value> FilterSafe(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("safe", args, {}, 0));
  return Value::String(ToStr(v), true);
}

Result<Value> FilterSlice(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("slice", args, {"slices", "fill_with"}, 1));
  ASSIGN_OR_RETURN(int64_t slices, OptInt(a[0], 1, "slice count"));
  if (slices <= 0) return InvalidArgument("slice count must be positive");
  if (slices > 100000) return InvalidArgument("slice count too large");
  ASSIGN_OR_RETURN(std::vector<Value> seq, Iterate(v));
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per_slice = length / slices, with_extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    const int64_t start = offset + n * per_slice;
    if (n < with_extra) ++offset;
    const int64_t end = offset + (n + 1) * per_slice;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (a[1].has_value() && !a[1]->is_none() && n >= with_extra) part.push_back(*a[1]);
    out.push_back(Value::MakeList(std::move(part)));
  }
  return MakeIterator(std::move(out));
}

Result<Value> FilterSort(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a,
                   BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const bool case_sensitive = OptBool(a[1], false);
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value key = item;
    if (a[2].has_value() && !a[2]->is_none()) {
      ASSIGN_OR_RETURN(key, GetAttributePath(in, item, *a[2]));
    }
    keys.push_back(IgnoreCase(key, case_sensitive));
  }
  RETURN_IF_ERROR(SortByKeys(&items, &keys, OptBool(a[0], false)));
  return Value::MakeList(std::move(items));
}

Result<Value> FilterString(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("string", args, {}, 0));
  RETURN_IF_ERROR(CheckPrintable(v));
  return SoftStr(v);
}

Result<Value> FilterSum(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("sum", args, {"attribute", "start"}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  Value total = a[1].has_value() ? *a[1] : Value::Int(0);
  if (total.is_string()) return InvalidArgument("sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& item : items) {
    Value x = item;
    if (a[0].has_value() && !a[0]->is_none()) {
      ASSIGN_OR_RETURN(x, GetAttributePath(in, item, *a[0]));
    }
    ASSIGN_OR_RETURN(total, BinaryOperation(BinaryOp::kAdd, total, x));
  }
  return total;
}

// jinja2's do_title: split on runs of `-`, whitespace and opening brackets; each piece gets its
// first character upper-cased and the rest lower-cased.
Result<Value> FilterTitle(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("title", args, {}, 0));
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
Result<Value> FilterToJson(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("tojson", args,
                                    {"ensure_ascii", "indent", "separators", "sort_keys"}, 0));
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

Result<Value> FilterTrim(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("trim", args, {"chars"}, 0));
  std::optional<std::string> chars;
  if (a[0].has_value() && !a[0]->is_none()) chars = ToStr(*a[0]);
  const Value s = SoftStr(v);
  return Value::String(PyStrip(s.AsString(), chars, true, true), s.is_markup());
}

Result<Value> FilterTruncate(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a,
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
      const auto n = static_cast<int64_t>(v.is_list() ? v.AsList().items.size() : v.AsDict().size());
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

Result<Value> FilterUnique(Interpreter& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("unique", args, {"case_sensitive", "attribute"}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const bool case_sensitive = OptBool(a[0], false);
  std::vector<Value> out, seen;
  for (const Value& item : items) {
    Value key = item;
    if (a[1].has_value() && !a[1]->is_none()) {
      ASSIGN_OR_RETURN(key, GetAttributePath(in, item, *a[1]));
    }
    key = IgnoreCase(key, case_sensitive);
    if (!IsHashable(key)) return InvalidArgument("unhashable type: '{}'", TypeName(key));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return MakeIterator(std::move(out));
}

Result<Value> FilterWordCount(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("wordcount", args, {}, 0));
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

const std::unordered_map<std::string_view, FilterFn>& Filters() {
  static const auto* filters = new std::unordered_map<std::string_view, FilterFn>{
      {"abs", FilterAbs},
      {"attr", FilterAttr},
      {"batch", FilterBatch},
      {"capitalize", FilterCapitalize},
      {"center", FilterCenter},
      {"count", FilterLength},
      {"d", FilterDefault},
      {"default", FilterDefault},
      {"dictsort", FilterDictSort},
      {"e", FilterEscape},
      {"escape", FilterEscape},
      {"first", FilterFirst},
      {"float", FilterFloat},
      {"forceescape", FilterForceEscape},
      {"format", FilterFormat},
      {"indent", FilterIndent},
      {"int", FilterInt},
      {"items", FilterItems},
      {"join", FilterJoin},
      {"last", FilterLast},
      {"length", FilterLength},
      {"list", FilterList},
      {"lower", FilterLower},
      {"map", FilterMap},
      {"max", FilterMax},
      {"min", FilterMin},
      {"reject", FilterReject},
      {"rejectattr", FilterRejectAttr},
      {"replace", FilterReplace},
      {"reverse", FilterReverse},
      {"round", FilterRound},
      {"safe", FilterSafe},
      {"select", FilterSelect},
      {"selectattr", FilterSelectAttr},
      {"slice", FilterSlice},
      {"sort", FilterSort},
      {"string", FilterString},
      {"sum", FilterSum},
      {"title", FilterTitle},
      {"tojson", FilterToJson},
      {"trim", FilterTrim},
      {"truncate", FilterTruncate},
      {"unique", FilterUnique},
      {"upper", FilterUpper},
      {"wordcount", FilterWordCount},
  };
  return *filters;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  const auto& filters = Filters();
  const auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

}  // namespace moeserve::tokenizer::jinja
