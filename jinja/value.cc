#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/check.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

// Exact int/float comparison: x86-64 long double holds every int64 and every double exactly.
int CompareNumbers(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.AsInt(), y = b.AsInt();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  const long double x = a.is_float() ? a.AsDouble() : static_cast<long double>(a.AsInt());
  const long double y = b.is_float() ? b.AsDouble() : static_cast<long double>(b.AsInt());
  return x < y ? -1 : (x > y ? 1 : 0);
}

bool SameListClass(const List& a, const List& b) { return a.kind == b.kind; }

bool ContainsIterator(const Value& v) {
  if (v.is_list()) {
    if (v.AsList().kind == ListKind::kIterator) return true;
    for (const Value& item : v.AsList().items) {
      if (ContainsIterator(item)) return true;
    }
  } else if (v.is_dict()) {
    for (const auto& [k, item] : v.AsDict().entries()) {
      if (ContainsIterator(k) || ContainsIterator(item)) return true;
    }
  }
  return false;
}

std::string ReprItems(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += Repr(items[i]);
  }
  return out;
}

std::string ReprDict(const Dict& dict) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : dict.entries()) {
    if (!first) out += ", ";
    first = false;
    out += Repr(k);
    out += ": ";
    out += Repr(v);
  }
  out += "}";
  return out;
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8(s, &pos);
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        *out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<uint32_t>(0xD800 | (v >> 10)),
                            static_cast<uint32_t>(0xDC00 | (v & 0x3FF)));
      } else {
        *out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
      }
    } else {
      AppendUtf8(cp, out);
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return FormatPyFloat(d);
}

Status NotSerializable(const Value& v) {
  return InvalidArgument("Object of type {} is not JSON serializable", TypeName(v));
}

// Python's json encoder, recursively (bounded by kMaxValueDepth).
Status DumpJson(const Value& v, const JsonOptions& o, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) *out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return OkStatus();
    case Value::Kind::kBool:
      *out += v.AsBool() ? "true" : "false";
      return OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.AsInt());
      return OkStatus();
    case Value::Kind::kFloat:
      *out += JsonFloat(v.AsDouble());
      return OkStatus();
    case Value::Kind::kString:
      AppendJsonString(v.AsString(), o.ensure_ascii, out);
      return OkStatus();
    case Value::Kind::kList: {
      const List& list = v.AsList();
      if (list.kind != ListKind::kList && list.kind != ListKind::kTuple) return NotSerializable(v);
      if (list.items.empty()) {
        *out += "[]";
        return OkStatus();
      }
      out->push_back('[');
      if (o.indent) newline(level + 1);
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i) {
          *out += o.item_separator;
          if (o.indent) newline(level + 1);
        }
        RETURN_IF_ERROR(DumpJson(list.items[i], o, level + 1, out));
      }
      if (o.indent) newline(level);
      out->push_back(']');
      return OkStatus();
    }
    case Value::Kind::kDict: {
      const Dict& dict = v.AsDict();
      if (dict.size() == 0) {
        *out += "{}";
        return OkStatus();
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : dict.entries()) entries.push_back(&e);
      if (o.sort_keys) {
        Status sort_error;
        std::stable_sort(entries.begin(), entries.end(), [&](const auto* a, const auto* b) {
          Result<int> c = Compare(a->first, b->first, "<");
          if (!c.ok()) {
            sort_error = c.status();
            return false;
          }
          return *c < 0;
        });
        RETURN_IF_ERROR(sort_error);
      }
      out->push_back('{');
      if (o.indent) newline(level + 1);
      bool first = true;
      for (const auto* e : entries) {
        if (!first) {
          *out += o.item_separator;
          if (o.indent) newline(level + 1);
        }
        first = false;
        const Value& key = e->first;
        switch (key.kind()) {
          case Value::Kind::kString:
            AppendJsonString(key.AsString(), o.ensure_ascii, out);
            break;
          case Value::Kind::kNone:
            *out += "\"null\"";
            break;
          case Value::Kind::kBool:
            *out += key.AsBool() ? "\"true\"" : "\"false\"";
            break;
          case Value::Kind::kInt:
            *out += "\"" + std::to_string(key.AsInt()) + "\"";
            break;
          case Value::Kind::kFloat:
            *out += "\"" + JsonFloat(key.AsDouble()) + "\"";
            break;
          default:
            return InvalidArgument("keys must be str, int, float, bool or None, not {}",
                                   TypeName(key));
        }
        *out += o.key_separator;
        RETURN_IF_ERROR(DumpJson(e->second, o, level + 1, out));
      }
      if (o.indent) newline(level);
      out->push_back('}');
      return OkStatus();
    }
    default:
      return NotSerializable(v);
  }
}

}  // namespace

Value Value::Undefined(std::string message) {
  Value v;
  if (!message.empty()) v.payload_ = std::make_shared<const std::string>(std::move(message));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.flag_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.payload_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.payload_ = d;
  return v;
}

Value Value::String(std::string s, bool markup) {
  Value v;
  v.kind_ = Kind::kString;
  v.flag_ = markup;
  v.payload_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::MakeList(std::vector<Value> items, ListKind kind) {
  auto list = std::make_shared<List>();
  list->kind = kind;
  list->items = std::move(items);
  return WrapList(std::move(list));
}

Value Value::WrapList(std::shared_ptr<List> list) {
  int depth = 0;
  for (const Value& item : list->items) depth = std::max(depth, item.Depth());
  list->depth = depth + 1;
  Value v;
  v.kind_ = Kind::kList;
  v.payload_ = std::shared_ptr<const List>(std::move(list));
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.payload_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::MakeCallable(CallableKind kind, std::string name, NativeFunction fn) {
  auto callable = std::make_shared<Callable>();
  callable->kind = kind;
  callable->name = std::move(name);
  callable->fn = std::move(fn);
  Value v;
  v.kind_ = Kind::kCallable;
  v.payload_ = std::shared_ptr<const Callable>(std::move(callable));
  return v;
}

Value Value::MakeNamespace(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.payload_ = std::move(ns);
  return v;
}

Value Value::MakeLoop(LoopInfo loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.payload_ = std::make_shared<const LoopInfo>(std::move(loop));
  return v;
}

Value MakeIterator(std::vector<Value> items, const char* type_name) {
  auto list = std::make_shared<List>();
  list->kind = ListKind::kIterator;
  list->items = std::move(items);
  list->iterator_type = type_name;
  return Value::WrapList(std::move(list));
}

bool IsIterator(const Value& v) { return v.is_list() && v.AsList().kind == ListKind::kIterator; }

Status CheckPrintable(const Value& v) {
  if (ContainsIterator(v)) {
    return InvalidArgument(
        "cannot print a lazy iterator (Python prints \"<generator object ... at "
        "0x...>\"); convert it with |list first");
  }
  return OkStatus();
}

int64_t Value::AsInt() const {
  if (kind_ == Kind::kBool) return flag_ ? 1 : 0;
  CHECK(kind_ == Kind::kInt);
  return std::get<int64_t>(payload_);
}

double Value::AsDouble() const {
  if (kind_ == Kind::kFloat) return std::get<double>(payload_);
  return static_cast<double>(AsInt());
}

const std::string& Value::AsString() const {
  CHECK(kind_ == Kind::kString);
  return *std::get<std::shared_ptr<const std::string>>(payload_);
}

const List& Value::AsList() const {
  CHECK(kind_ == Kind::kList);
  return *std::get<std::shared_ptr<const List>>(payload_);
}

const Dict& Value::AsDict() const {
  CHECK(kind_ == Kind::kDict);
  return *std::get<std::shared_ptr<const Dict>>(payload_);
}

const Callable& Value::AsCallable() const {
  CHECK(kind_ == Kind::kCallable);
  return *std::get<std::shared_ptr<const Callable>>(payload_);
}

const std::shared_ptr<Namespace>& Value::AsNamespace() const {
  CHECK(kind_ == Kind::kNamespace);
  return std::get<std::shared_ptr<Namespace>>(payload_);
}

const LoopInfo& Value::AsLoop() const {
  CHECK(kind_ == Kind::kLoop);
  return *std::get<std::shared_ptr<const LoopInfo>>(payload_);
}

const std::string& Value::UndefinedMessage() const {
  static const std::string kEmpty;
  CHECK(kind_ == Kind::kUndefined);
  if (const auto* s = std::get_if<std::shared_ptr<const std::string>>(&payload_)) return **s;
  return kEmpty;
}

const void* Value::Identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::monostate> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, double>) {
          return nullptr;
        } else {
          return p.get();
        }
      },
      payload_);
}

int Value::Depth() const {
  if (kind_ == Kind::kList) return AsList().depth;
  if (kind_ == Kind::kDict) return AsDict().depth();
  return 0;
}

const Value* Dict::Find(const Value& key) const {
  if (key.is_string()) return Find(key.AsString());
  for (const auto& [k, v] : entries_) {
    if (!k.is_string() && Equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  const auto it = string_keys_.find(key);
  return it == string_keys_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::Set(Value key, Value value) {
  depth_ = std::max(depth_, value.Depth() + 1);
  if (key.is_string()) {
    const auto [it, inserted] = string_keys_.emplace(key.AsString(), entries_.size());
    if (!inserted) {
      entries_[it->second].second = std::move(value);
      return;
    }
  } else {
    for (auto& [k, v] : entries_) {
      if (!k.is_string() && Equals(k, key)) {
        v = std::move(value);
        return;
      }
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

size_t Dict::size() const { return entries_.size(); }

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return v.is_markup() ? "Markup" : "str";
    case Value::Kind::kList:
      switch (v.AsList().kind) {
        case ListKind::kList:
          return "list";
        case ListKind::kTuple:
          return "tuple";
        case ListKind::kDictKeys:
          return "dict_keys";
        case ListKind::kDictValues:
          return "dict_values";
        case ListKind::kDictItems:
          return "dict_items";
        case ListKind::kRange:
          return "range";
        case ListKind::kIterator:
          return v.AsList().iterator_type;
      }
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kCallable:
      switch (v.AsCallable().kind) {
        case CallableKind::kMacro:
          return "Macro";
        case CallableKind::kMethod:
          return "builtin_function_or_method";
        case CallableKind::kFunction:
          return "function";
      }
      return "function";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_markup()) return "markupsafe.Markup object";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  if (v.is_loop()) return "jinja2.runtime.LoopContext object";
  if (v.is_callable() && v.AsCallable().kind == CallableKind::kMacro) {
    return "jinja2.runtime.Macro object";
  }
  return TypeName(v) + " object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.AsBool();
    case Value::Kind::kInt:
      return v.AsInt() != 0;
    case Value::Kind::kFloat:
      return v.AsDouble() != 0.0;
    case Value::Kind::kString:
      return !v.AsString().empty();
    case Value::Kind::kList:
      return v.AsList().kind == ListKind::kIterator || !v.AsList().items.empty();
    case Value::Kind::kDict:
      return v.AsDict().size() != 0;
    default:
      return true;
  }
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if ((a.is_float() && std::isnan(a.AsDouble())) || (b.is_float() && std::isnan(b.AsDouble())))
      return false;
    return CompareNumbers(a, b) == 0;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.AsString() == b.AsString();
    case Value::Kind::kList: {
      const List& x = a.AsList();
      const List& y = b.AsList();
      if (x.kind == ListKind::kIterator || y.kind == ListKind::kIterator) return &x == &y;
      if (!SameListClass(x, y) || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!Equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.AsDict();
      const Dict& y = b.AsDict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.Identity() == b.Identity();
  }
}

Result<int> Compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) return CompareNumbers(a, b);
  if (a.is_string() && b.is_string()) {
    const int c = a.AsString().compare(b.AsString());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && SameListClass(a.AsList(), b.AsList()) &&
      (a.AsList().kind == ListKind::kList || a.AsList().kind == ListKind::kTuple)) {
    const auto& x = a.AsList().items;
    const auto& y = b.AsList().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return InvalidArgument("'{}' not supported between instances of '{}' and '{}'", op, TypeName(a),
                         TypeName(b));
}

bool IsHashable(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return false;
    case Value::Kind::kList: {
      const List& list = v.AsList();
      if (list.kind == ListKind::kIterator) return true;  // hashed by identity
      if (list.kind != ListKind::kTuple && list.kind != ListKind::kRange) return false;
      return std::all_of(list.items.begin(), list.items.end(), IsHashable);
    }
    default:
      return true;
  }
}

std::string FormatPyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out by repr()'s rule: positional
  // notation for decimal exponents in [-4, 16), scientific otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  std::string out;
  if (!sci.empty() && sci[0] == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exp = std::stoi(std::string(sci.substr(e_pos + 1)));
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else {
      const size_t int_digits = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_digits);
        out.push_back('.');
        out += digits.substr(int_digits);
      }
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out += digits.substr(1);
  }
  out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  return out;
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.AsBool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.AsInt());
    case Value::Kind::kFloat:
      return FormatPyFloat(v.AsDouble());
    case Value::Kind::kString:
      return v.is_markup() ? "Markup(" + PyStrRepr(v.AsString()) + ")" : PyStrRepr(v.AsString());
    case Value::Kind::kList: {
      const List& list = v.AsList();
      switch (list.kind) {
        case ListKind::kList:
          return "[" + ReprItems(list.items) + "]";
        case ListKind::kTuple:
          return list.items.size() == 1 ? "(" + Repr(list.items[0]) + ",)"
                                        : "(" + ReprItems(list.items) + ")";
        case ListKind::kDictKeys:
          return "dict_keys([" + ReprItems(list.items) + "])";
        case ListKind::kDictValues:
          return "dict_values([" + ReprItems(list.items) + "])";
        case ListKind::kDictItems:
          return "dict_items([" + ReprItems(list.items) + "])";
        case ListKind::kIterator:
          return fmt::format("<{} object>", list.iterator_type);
        case ListKind::kRange:
          return list.range_step == 1
                     ? fmt::format("range({}, {})", list.range_start, list.range_stop)
                     : fmt::format("range({}, {}, {})", list.range_start, list.range_stop,
                                   list.range_step);
      }
      return "[]";
    }
    case Value::Kind::kDict:
      return ReprDict(v.AsDict());
    case Value::Kind::kCallable: {
      const Callable& c = v.AsCallable();
      switch (c.kind) {
        case CallableKind::kMacro:
          return "<Macro " + PyStrRepr(c.name) + ">";
        case CallableKind::kMethod:
          return "<built-in method " + c.name + ">";
        case CallableKind::kFunction:
          return "<function " + c.name + ">";
      }
      return "<function>";
    }
    case Value::Kind::kNamespace:
      return "<Namespace " + ReprDict(v.AsNamespace()->attrs) + ">";
    case Value::Kind::kLoop: {
      const LoopInfo& loop = v.AsLoop();
      return fmt::format("<LoopContext {}/{}>", loop.index0 + 1, loop.items->items.size());
    }
  }
  return "";
}

std::string ToStr(const Value& v) {
  if (v.is_string()) return v.AsString();
  if (v.is_undefined()) return "";
  return Repr(v);
}

Result<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  RETURN_IF_ERROR(DumpJson(v, options, 0, &out));
  return out;
}

}  // namespace moeserve::jinja
