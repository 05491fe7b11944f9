// Methods of str, dict and list values as Python defines them, restricted like transformers'
// ImmutableSandboxedEnvironment: methods that would mutate a list or dict are refused. Methods of
// Markup strings return Markup, escaping inserted text the way markupsafe 3 does.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "jinja/builtins.h"
#include "jinja/operators.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;
using Method = Result<Value> (*)(const Value& self, CallArgs& args);

Result<std::string> StrArg(const Value& v, std::string_view what) {
  if (v.is_string()) return v.AsString();
  if (v.is_undefined()) return UndefinedError(v);
  return InvalidArgument("{} must be str, not {}", what, TypeName(v));
}

Result<std::optional<std::string>> OptStrArg(const std::optional<Value>& v, std::string_view what) {
  if (!v.has_value() || v->is_none()) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string s, StrArg(*v, what));
  return std::optional<std::string>(std::move(s));
}

Result<int64_t> IntArg(const std::optional<Value>& v, int64_t fallback, std::string_view what) {
  if (!v.has_value() || v->is_none()) return fallback;
  if (v->is_undefined()) return UndefinedError(*v);
  if (!v->is_integral()) {
    return InvalidArgument("'{}' object cannot be interpreted as an integer ({})", TypeName(*v),
                           what);
  }
  return v->AsInt();
}

// The result of a str method on `self`: Markup in, Markup out.
Value Str(const Value& self, std::string s) {
  return Value::String(std::move(s), self.is_markup());
}

// markupsafe escapes text a Markup method inserts (replacement, fill characters, joined items).
std::string EscapeFor(const Value& self, const Value& inserted) {
  if (!self.is_markup() || inserted.is_markup()) return ToStr(inserted);
  return HtmlEscape(ToStr(inserted));
}

Value StrList(const Value& self, const std::vector<std::string>& parts,
              ListKind kind = ListKind::kList) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const std::string& p : parts) items.push_back(Str(self, p));
  return Value::MakeList(std::move(items), kind);
}

// Code-point range [start, end) of s selected by Python's optional start/end arguments.
std::string SubRange(const std::string& s, const Args& a, size_t first) {
  if (!a[first].has_value() && !a[first + 1].has_value()) return s;
  const int64_t n = CodePointCount(s);
  int64_t start = a[first].has_value() && a[first]->is_integral() ? a[first]->AsInt() : 0;
  int64_t end = a[first + 1].has_value() && a[first + 1]->is_integral() ? a[first + 1]->AsInt() : n;
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (end < 0) end = std::max<int64_t>(0, end + n);
  start = std::min(start, n);
  end = std::min(end, n);
  if (end <= start) return std::string();
  const size_t b = ByteOffsetOfCodePoint(s, start), e = ByteOffsetOfCodePoint(s, end);
  return s.substr(b, e - b);
}

Result<Value> StartsOrEndsWith(const Value& self, CallArgs& args, bool starts) {
  ASSIGN_OR_RETURN(Args a, BindArgs(starts ? "str.startswith" : "str.endswith", args,
                                    {"prefix", "start", "end"}, 1));
  const std::string s = SubRange(self.AsString(), a, 1);
  if (a[1].has_value() && a[1]->is_integral() && a[1]->AsInt() > CodePointCount(self.AsString())) {
    return Value::Bool(false);
  }
  std::vector<Value> candidates;
  if (a[0]->is_list() && a[0]->AsList().kind == ListKind::kTuple) {
    candidates = a[0]->AsList().items;
  } else if (a[0]->is_string()) {
    candidates.push_back(*a[0]);
  } else {
    return InvalidArgument("{} first arg must be str or a tuple of str, not {}",
                           starts ? "startswith" : "endswith", TypeName(*a[0]));
  }
  for (const Value& c : candidates) {
    ASSIGN_OR_RETURN(std::string affix, StrArg(c, "tuple item"));
    const bool match = s.size() >= affix.size() &&
                       (starts ? s.compare(0, affix.size(), affix) == 0
                               : s.compare(s.size() - affix.size(), affix.size(), affix) == 0);
    if (match) return Value::Bool(true);
  }
  return Value::Bool(false);
}

Result<Value> StrStartsWith(const Value& self, CallArgs& args) {
  return StartsOrEndsWith(self, args, true);
}
Result<Value> StrEndsWith(const Value& self, CallArgs& args) {
  return StartsOrEndsWith(self, args, false);
}

Result<Value> StripImpl(const Value& self, CallArgs& args, const char* name, bool left,
                        bool right) {
  ASSIGN_OR_RETURN(Args a, BindArgs(name, args, {"chars"}, 0));
  ASSIGN_OR_RETURN(std::optional<std::string> chars, OptStrArg(a[0], "strip chars"));
  return Str(self, PyStrip(self.AsString(), chars, left, right));
}
Result<Value> StrStrip(const Value& self, CallArgs& args) {
  return StripImpl(self, args, "str.strip", true, true);
}
Result<Value> StrLStrip(const Value& self, CallArgs& args) {
  return StripImpl(self, args, "str.lstrip", true, false);
}
Result<Value> StrRStrip(const Value& self, CallArgs& args) {
  return StripImpl(self, args, "str.rstrip", false, true);
}

Result<Value> SplitImpl(const Value& self, CallArgs& args, bool from_right) {
  ASSIGN_OR_RETURN(Args a,
                   BindArgs(from_right ? "str.rsplit" : "str.split", args, {"sep", "maxsplit"}, 0));
  ASSIGN_OR_RETURN(std::optional<std::string> sep, OptStrArg(a[0], "split separator"));
  if (sep && sep->empty()) return InvalidArgument("empty separator");
  ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(a[1], -1, "maxsplit"));
  return StrList(self, PySplit(self.AsString(), sep, maxsplit, from_right));
}
Result<Value> StrSplit(const Value& self, CallArgs& args) { return SplitImpl(self, args, false); }
Result<Value> StrRSplit(const Value& self, CallArgs& args) { return SplitImpl(self, args, true); }

Result<Value> StrSplitLines(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str.splitlines", args, {"keepends"}, 0));
  return StrList(self, PySplitLines(self.AsString(), a[0].has_value() && Truthy(*a[0])));
}

Result<Value> StrReplace(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str.replace", args, {"old", "new", "count"}, 2));
  ASSIGN_OR_RETURN(std::string old_sub, StrArg(*a[0], "replace() argument 1"));
  ASSIGN_OR_RETURN(std::string new_sub, StrArg(*a[1], "replace() argument 2"));
  new_sub = EscapeFor(self, *a[1]);
  ASSIGN_OR_RETURN(int64_t count, IntArg(a[2], -1, "count"));
  const std::string& s = self.AsString();
  if (!old_sub.empty() && new_sub.size() > old_sub.size() &&
      s.size() / old_sub.size() * (new_sub.size() - old_sub.size()) + s.size() > kMaxStringBytes) {
    return InvalidArgument("replace result too large");
  }
  if (old_sub.empty() &&
      (static_cast<size_t>(CodePointCount(s)) + 1) * new_sub.size() > kMaxStringBytes) {
    return InvalidArgument("replace result too large");
  }
  return Str(self, PyReplace(s, old_sub, new_sub, count));
}

Result<Value> FindImpl(const Value& self, CallArgs& args, const char* name, bool reverse,
                       bool raise) {
  ASSIGN_OR_RETURN(Args a, BindArgs(name, args, {"sub", "start", "end"}, 1));
  ASSIGN_OR_RETURN(std::string sub, StrArg(*a[0], "substring"));
  ASSIGN_OR_RETURN(int64_t start, IntArg(a[1], 0, "start"));
  ASSIGN_OR_RETURN(int64_t end, IntArg(a[2], INT64_MAX, "end"));
  const int64_t at = PyFind(self.AsString(), sub, start, end, reverse);
  if (at < 0 && raise) return InvalidArgument("substring not found");
  return Value::Int(at);
}
Result<Value> StrFind(const Value& self, CallArgs& args) {
  return FindImpl(self, args, "str.find", false, false);
}
Result<Value> StrRFind(const Value& self, CallArgs& args) {
  return FindImpl(self, args, "str.rfind", true, false);
}
Result<Value> StrIndex(const Value& self, CallArgs& args) {
  return FindImpl(self, args, "str.index", false, true);
}
Result<Value> StrRIndex(const Value& self, CallArgs& args) {
  return FindImpl(self, args, "str.rindex", true, true);
}

Result<Value> StrCount(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str.count", args, {"sub", "start", "end"}, 1));
  ASSIGN_OR_RETURN(std::string sub, StrArg(*a[0], "substring"));
  ASSIGN_OR_RETURN(int64_t start, IntArg(a[1], 0, "start"));
  ASSIGN_OR_RETURN(int64_t end, IntArg(a[2], INT64_MAX, "end"));
  return Value::Int(PyCount(self.AsString(), sub, start, end));
}

Result<Value> StrJoin(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str.join", args, {"iterable"}, 1));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return InvalidArgument("sequence item {}: expected str instance, {} found", i,
                             TypeName(items[i]));
    }
    if (i) out += self.AsString();
    out += EscapeFor(self, items[i]);
    if (out.size() > kMaxStringBytes) return InvalidArgument("join result too large");
  }
  return Str(self, std::move(out));
}

template <std::string (*kFn)(std::string_view)>
Result<Value> CaseMethod(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str case method", args, {}, 0));
  return Str(self, kFn(self.AsString()));
}

template <bool (*kFn)(std::string_view)>
Result<Value> PredicateMethod(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str predicate method", args, {}, 0));
  return Value::Bool(kFn(self.AsString()));
}

Result<Value> PadImpl(const Value& self, CallArgs& args, const char* name, int mode) {
  ASSIGN_OR_RETURN(Args a, BindArgs(name, args, {"width", "fillchar"}, 1));
  ASSIGN_OR_RETURN(int64_t width, IntArg(a[0], 0, "width"));
  if (width > static_cast<int64_t>(kMaxStringBytes)) return InvalidArgument("width too large");
  std::string fill = " ";
  if (a[1].has_value()) {
    ASSIGN_OR_RETURN(fill, StrArg(*a[1], "fillchar"));
    if (CodePointCount(fill) != 1) {
      return InvalidArgument("The fill character must be exactly one character long");
    }
    fill = EscapeFor(self, *a[1]);
  }
  const std::string& s = self.AsString();
  const int64_t len = CodePointCount(s);
  if (width <= len) return Str(self, s);
  const int64_t marg = width - len;
  // CPython's pad(): center puts the odd character left when width is odd.
  const int64_t left = mode == 0 ? marg / 2 + (marg & width & 1) : mode < 0 ? 0 : marg;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return Str(self, std::move(out));
}
Result<Value> StrCenter(const Value& self, CallArgs& args) {
  return PadImpl(self, args, "str.center", 0);
}
Result<Value> StrLJust(const Value& self, CallArgs& args) {
  return PadImpl(self, args, "str.ljust", -1);
}
Result<Value> StrRJust(const Value& self, CallArgs& args) {
  return PadImpl(self, args, "str.rjust", 1);
}

Result<Value> StrZFill(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("str.zfill", args, {"width"}, 1));
  ASSIGN_OR_RETURN(int64_t width, IntArg(a[0], 0, "width"));
  if (width > static_cast<int64_t>(kMaxStringBytes)) return InvalidArgument("width too large");
  const std::string& s = self.AsString();
  const int64_t len = CodePointCount(s);
  if (width <= len) return Str(self, s);
  const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  return Str(self, s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') +
                       s.substr(sign));
}

Result<Value> PartitionImpl(const Value& self, CallArgs& args, bool reverse) {
  ASSIGN_OR_RETURN(Args a,
                   BindArgs(reverse ? "str.rpartition" : "str.partition", args, {"sep"}, 1));
  ASSIGN_OR_RETURN(std::string sep, StrArg(*a[0], "separator"));
  if (sep.empty()) return InvalidArgument("empty separator");
  const std::string& s = self.AsString();
  const size_t at = reverse ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos) {
    return StrList(
        self, reverse ? std::vector<std::string>{"", "", s} : std::vector<std::string>{s, "", ""},
        ListKind::kTuple);
  }
  return StrList(self, {s.substr(0, at), sep, s.substr(at + sep.size())}, ListKind::kTuple);
}
Result<Value> StrPartition(const Value& self, CallArgs& args) {
  return PartitionImpl(self, args, false);
}
Result<Value> StrRPartition(const Value& self, CallArgs& args) {
  return PartitionImpl(self, args, true);
}

Result<Value> RemoveAffix(const Value& self, CallArgs& args, bool prefix) {
  ASSIGN_OR_RETURN(Args a,
                   BindArgs(prefix ? "str.removeprefix" : "str.removesuffix", args, {"affix"}, 1));
  ASSIGN_OR_RETURN(std::string affix, StrArg(*a[0], "affix"));
  const std::string& s = self.AsString();
  if (s.size() >= affix.size()) {
    if (prefix && s.compare(0, affix.size(), affix) == 0) return Str(self, s.substr(affix.size()));
    if (!prefix && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Str(self, s.substr(0, s.size() - affix.size()));
    }
  }
  return Str(self, s);
}
Result<Value> StrRemovePrefix(const Value& self, CallArgs& args) {
  return RemoveAffix(self, args, true);
}
Result<Value> StrRemoveSuffix(const Value& self, CallArgs& args) {
  return RemoveAffix(self, args, false);
}

// ---- dict ----------------------------------------------------------------------------------

Result<Value> DictView(const Value& self, CallArgs& args, ListKind kind) {
  ASSIGN_OR_RETURN(Args a, BindArgs("dict view", args, {}, 0));
  std::vector<Value> items;
  for (const auto& [k, v] : self.AsDict().entries()) {
    switch (kind) {
      case ListKind::kDictKeys:
        items.push_back(k);
        break;
      case ListKind::kDictValues:
        items.push_back(v);
        break;
      default:
        items.push_back(Value::MakeList({k, v}, ListKind::kTuple));
    }
  }
  return Value::MakeList(std::move(items), kind);
}
Result<Value> DictItems(const Value& self, CallArgs& args) {
  return DictView(self, args, ListKind::kDictItems);
}
Result<Value> DictKeys(const Value& self, CallArgs& args) {
  return DictView(self, args, ListKind::kDictKeys);
}
Result<Value> DictValues(const Value& self, CallArgs& args) {
  return DictView(self, args, ListKind::kDictValues);
}

Result<Value> DictGet(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("dict.get", args, {"key", "default"}, 1));
  if (!IsHashable(*a[0])) return InvalidArgument("unhashable type: '{}'", TypeName(*a[0]));
  if (const Value* v = self.AsDict().Find(*a[0])) return *v;
  return a[1].has_value() ? *a[1] : Value::None();
}

Result<Value> CopyMethod(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("copy", args, {}, 0));
  if (self.is_dict()) return Value::MakeDict(self.AsDict());
  return Value::MakeList(self.AsList().items, ListKind::kList);
}

// ---- list and tuple ------------------------------------------------------------------------

Result<Value> ListCount(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("list.count", args, {"value"}, 1));
  const auto& items = self.AsList().items;
  return Value::Int(
      std::count_if(items.begin(), items.end(), [&](const Value& v) { return Equals(v, *a[0]); }));
}

Result<Value> ListIndex(const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("list.index", args, {"value", "start", "stop"}, 1));
  const auto& items = self.AsList().items;
  const auto n = static_cast<int64_t>(items.size());
  ASSIGN_OR_RETURN(int64_t start, IntArg(a[1], 0, "start"));
  ASSIGN_OR_RETURN(int64_t stop, IntArg(a[2], n, "stop"));
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (stop < 0) stop = std::max<int64_t>(0, stop + n);
  for (int64_t i = start; i < std::min(stop, n); ++i) {
    if (Equals(items[static_cast<size_t>(i)], *a[0])) return Value::Int(i);
  }
  return InvalidArgument("{} is not in list", Repr(*a[0]));
}

struct MethodEntry {
  std::string_view name;
  Method fn;
};

constexpr MethodEntry kStrMethods[] = {
    {"startswith", StrStartsWith},
    {"endswith", StrEndsWith},
    {"strip", StrStrip},
    {"lstrip", StrLStrip},
    {"rstrip", StrRStrip},
    {"split", StrSplit},
    {"rsplit", StrRSplit},
    {"splitlines", StrSplitLines},
    {"replace", StrReplace},
    {"find", StrFind},
    {"rfind", StrRFind},
    {"index", StrIndex},
    {"rindex", StrRIndex},
    {"count", StrCount},
    {"join", StrJoin},
    {"lower", CaseMethod<PyLower>},
    {"casefold", CaseMethod<PyLower>},
    {"upper", CaseMethod<PyUpper>},
    {"title", CaseMethod<PyTitle>},
    {"capitalize", CaseMethod<PyCapitalize>},
    {"swapcase", CaseMethod<PySwapCase>},
    {"isalpha", PredicateMethod<PyIsAlpha>},
    {"isalnum", PredicateMethod<PyIsAlnum>},
    {"isdigit", PredicateMethod<PyIsDigit>},
    {"isdecimal", PredicateMethod<PyIsDigit>},
    {"isspace", PredicateMethod<PyIsSpace>},
    {"islower", PredicateMethod<PyIsLower>},
    {"isupper", PredicateMethod<PyIsUpper>},
    {"center", StrCenter},
    {"ljust", StrLJust},
    {"rjust", StrRJust},
    {"zfill", StrZFill},
    {"partition", StrPartition},
    {"rpartition", StrRPartition},
    {"removeprefix", StrRemovePrefix},
    {"removesuffix", StrRemoveSuffix},
};

// Real Python str methods this interpreter does not implement: using one is an error naming it,
// never a silently different result.
constexpr std::string_view kUnsupportedStrMethods[] = {
    "format",    "format_map",   "encode",      "expandtabs", "translate", "maketrans",
    "isnumeric", "isidentifier", "isprintable", "isascii",    "istitle"};

constexpr MethodEntry kDictMethods[] = {
    {"items", DictItems}, {"keys", DictKeys},   {"values", DictValues},
    {"get", DictGet},     {"copy", CopyMethod},
};
constexpr std::string_view kMutatingDictMethods[] = {"clear", "pop", "popitem", "setdefault",
                                                     "update"};

constexpr MethodEntry kListMethods[] = {
    {"count", ListCount}, {"index", ListIndex}, {"copy", CopyMethod}};
constexpr MethodEntry kTupleMethods[] = {{"count", ListCount}, {"index", ListIndex}};
constexpr std::string_view kMutatingListMethods[] = {"append", "clear",  "extend",  "insert",
                                                     "pop",    "remove", "reverse", "sort"};

template <size_t N>
const MethodEntry* FindEntry(const MethodEntry (&table)[N], std::string_view name) {
  for (const MethodEntry& e : table) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

template <size_t N>
bool Listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value Bind(const Value& self, std::string_view type, const MethodEntry& entry) {
  const Method fn = entry.fn;
  return Value::MakeCallable(CallableKind::kMethod, fmt::format("{}.{}", type, entry.name),
                             [self, fn](Evaluator&, CallArgs& args) { return fn(self, args); });
}

}  // namespace

std::optional<Value> FindMethod(const Value& receiver, std::string_view name) {
  if (receiver.is_string()) {
    if (const MethodEntry* e = FindEntry(kStrMethods, name)) return Bind(receiver, "str", *e);
    if (Listed(kUnsupportedStrMethods, name)) {
      return Value::Undefined(
          fmt::format("str.{}() is not supported by this Jinja interpreter", name));
    }
    return std::nullopt;
  }
  if (receiver.is_dict()) {
    if (const MethodEntry* e = FindEntry(kDictMethods, name)) return Bind(receiver, "dict", *e);
    if (Listed(kMutatingDictMethods, name)) {
      return Value::Undefined(
          fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
    }
    return std::nullopt;
  }
  if (receiver.is_list()) {
    const ListKind kind = receiver.AsList().kind;
    if (kind == ListKind::kList) {
      if (const MethodEntry* e = FindEntry(kListMethods, name)) return Bind(receiver, "list", *e);
      if (Listed(kMutatingListMethods, name)) {
        return Value::Undefined(
            fmt::format("access to attribute '{}' of 'list' object is unsafe.", name));
      }
    } else if (kind == ListKind::kTuple) {
      if (const MethodEntry* e = FindEntry(kTupleMethods, name)) {
        return Bind(receiver, "tuple", *e);
      }
    }
  }
  return std::nullopt;
}

}  // namespace moeserve::jinja
