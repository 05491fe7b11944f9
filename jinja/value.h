// The dynamic value of the Jinja interpreter: Python's None, bool, int, float, str, list, tuple,
// dict, plus Jinja's Undefined, namespace(), loop and callables (macros, builtins, bound methods).
// Containers are immutable and shared (transformers renders in an ImmutableSandboxedEnvironment,
// where lists and dicts cannot be changed), so copying a Value is cheap; only a namespace is
// mutable, through `set ns.attr = ...`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace moeserve::jinja {

class Evaluator;
class Value;
class Dict;
struct Callable;
struct CallArgs;
struct List;
struct LoopInfo;
struct Namespace;

using NativeFunction = std::function<Result<Value>(Evaluator&, CallArgs&)>;

// What Python type a list-like value stands for; it changes repr(), equality, whether indexing
// works (dict views are not subscriptable in Python), and for kIterator the semantics: the lazy
// results of select, map, unique, reverse, ... are single-pass iterators in Jinja, always truthy
// (`{% if xs|select(...) %}` is true even when nothing is selected), without len().
enum class ListKind : uint8_t {
  kList,
  kTuple,
  kDictKeys,
  kDictValues,
  kDictItems,
  kRange,
  kIterator,
};

enum class CallableKind : uint8_t { kFunction, kMacro, kMethod };

// Deepest list/dict nesting a value may have: far beyond any chat message or tool schema, low
// enough that recursive walks over a value cannot exhaust the stack.
inline constexpr int kMaxValueDepth = 200;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable,
    kNamespace,
    kLoop,
  };

  Value() = default;  // Undefined, with no message
  // An Undefined that explains itself when used ("'x' is undefined", "'dict object' has no
  // attribute 'y'").
  static Value Undefined(std::string message);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  // `markup` marks markupsafe.Markup strings (results of |safe and |escape), which escape what is
  // added to them.
  static Value String(std::string s, bool markup = false);
  static Value MakeList(std::vector<Value> items, ListKind kind = ListKind::kList);
  // A list built in place (range(), slices); its depth is recomputed.
  static Value WrapList(std::shared_ptr<List> list);
  static Value MakeDict(Dict dict);
  static Value MakeCallable(CallableKind kind, std::string name, NativeFunction fn);
  static Value MakeNamespace(std::shared_ptr<Namespace> ns);
  static Value MakeLoop(LoopInfo loop);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's numbers.Number: bool, int, float.
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  // Python int including bool (bool subclasses int).
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && flag_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_loop() const { return kind_ == Kind::kLoop; }

  bool AsBool() const { return flag_; }
  int64_t AsInt() const;    // bool or int
  double AsDouble() const;  // bool, int or float
  const std::string& AsString() const;
  const List& AsList() const;
  const Dict& AsDict() const;
  const Callable& AsCallable() const;
  const std::shared_ptr<Namespace>& AsNamespace() const;
  const LoopInfo& AsLoop() const;
  const std::string& UndefinedMessage() const;

  // Identity of the shared payload (Python `is` for containers).
  const void* Identity() const;
  // Nesting depth of lists and dicts (0 for everything else). Recursive algorithms (repr, JSON,
  // equality) are bounded by it; the interpreter refuses to build values deeper than
  // kMaxValueDepth.
  int Depth() const;

 private:
  using Payload = std::variant<std::monostate, int64_t, double, std::shared_ptr<const std::string>,
                               std::shared_ptr<const List>, std::shared_ptr<const Dict>,
                               std::shared_ptr<const Callable>, std::shared_ptr<Namespace>,
                               std::shared_ptr<const LoopInfo>>;
  Kind kind_ = Kind::kUndefined;
  bool flag_ = false;  // bool value; Markup flag of a string
  Payload payload_;
};

struct List {
  ListKind kind = ListKind::kList;
  std::vector<Value> items;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // repr of range() only
  int depth = 1;  // nesting depth, maintained by Value::MakeList and Value::WrapList
  // kIterator: the Python type name ("generator", "list_reverseiterator") and how many items
  // have been consumed. Iterators only exist within one render, which runs on one thread.
  const char* iterator_type = "generator";
  mutable size_t position = 0;
};

// The lazy result of a filter: an iterator over `items`.
Value MakeIterator(std::vector<Value> items, const char* type_name = "generator");
bool IsIterator(const Value& v);
// Fails for values Python would print as "<generator object ... at 0x7f...>": that text is not
// reproducible, so rendering it is an error rather than silently different output.
Status CheckPrintable(const Value& v);

// An insertion-ordered dict with Python key equality (1, 1.0 and True are one key).
class Dict {
 public:
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Inserts or replaces (keeping the first key and its position, as Python does).
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const;
  // Nesting depth of the dict's values (a dict of scalars has depth 1).
  int depth() const { return depth_; }

 private:
  std::vector<std::pair<Value, Value>> entries_;
  // Position of each str key in entries_, so that dicts built from large JSON objects stay
  // linear to build; other keys (rare: int, tuple) are found by a scan.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> string_keys_;
  int depth_ = 1;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  CallableKind kind = CallableKind::kFunction;
  std::string name;  // for messages and repr: "raise_exception", "m", "str.startswith"
  NativeFunction fn;
};

// namespace(): the one mutable object, so `set ns.x = ...` inside a loop survives the loop.
struct Namespace {
  Dict attrs;
  bool tracked = false;  // the interpreter has registered it for cycle breaking
};

// The `loop` variable of one for-loop iteration.
struct LoopInfo {
  std::shared_ptr<const List> items;
  int64_t index0 = 0;
  // loop.changed(...)'s memory of the previous call, shared by all iterations of one loop.
  std::shared_ptr<std::optional<Value>> changed_state;
};

// Python type names for messages: "str", "int", "dict", "NoneType", "Undefined", ...
std::string TypeName(const Value& v);
// Jinja's object_type_repr for Undefined messages: "dict object", "None", "str object".
std::string ObjectTypeRepr(const Value& v);

// Python truthiness.
bool Truthy(const Value& v);
// Python ==, with Jinja's Undefined equal only to Undefined.
bool Equals(const Value& a, const Value& b);
// Python <, <=, >, >= ordering; an error for unorderable types.
Result<int> Compare(const Value& a, const Value& b, std::string_view op);
// Python's hashability: dict keys must be hashable.
bool IsHashable(const Value& v);

// str(v) as Jinja prints it ({{ v }}): Undefined is empty, None is "None", floats as Python's
// repr, containers as Python's repr.
std::string ToStr(const Value& v);
// repr(v).
std::string Repr(const Value& v);
// Python's float repr: shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string FormatPyFloat(double d);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // absent = one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// Python json.dumps(v, ...). Fails for values JSON cannot hold (Undefined, callables, ...).
Result<std::string> ToJson(const Value& v, const JsonOptions& options);

}  // namespace moeserve::jinja
