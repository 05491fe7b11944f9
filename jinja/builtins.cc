// Argument binding, iteration and membership helpers, Jinja's tests, and the global functions.
// Filters are in filters.cc, str/dict/list methods in methods.cc.
#include "jinja/builtins.h"

#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <string>
#include <unordered_map>

#include "jinja/evaluator.h"
#include "jinja/operators.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

// jinja2.sandbox.MAX_RANGE: the sandbox refuses larger ranges.
constexpr int64_t kMaxRange = 100000;

// ---- tests ---------------------------------------------------------------------------------

Result<bool> NoArgs(std::string_view name, CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs(name, args, {}, 0));
  (void)bound;
  return true;
}

#define SIMPLE_TEST(fn_name, test_name, expr)                        \
  Result<bool> fn_name(Evaluator&, const Value& v, CallArgs& args) { \
    RETURN_IF_ERROR(NoArgs(test_name, args).status());               \
    return (expr);                                                   \
  }

SIMPLE_TEST(TestDefined, "defined", !v.is_undefined())
SIMPLE_TEST(TestUndefined, "undefined", v.is_undefined())
SIMPLE_TEST(TestNone, "none", v.is_none())
SIMPLE_TEST(TestBoolean, "boolean", v.is_bool())
SIMPLE_TEST(TestFalse, "false", v.is_bool() && !v.AsBool())
SIMPLE_TEST(TestTrue, "true", v.is_bool() && v.AsBool())
SIMPLE_TEST(TestInteger, "integer", v.is_int())
SIMPLE_TEST(TestFloat, "float", v.is_float())
SIMPLE_TEST(TestNumber, "number", v.is_number())
SIMPLE_TEST(TestString, "string", v.is_string())
SIMPLE_TEST(TestMapping, "mapping", v.is_dict())
SIMPLE_TEST(TestEscaped, "escaped", v.is_markup())
// Python's iter() succeeds for these (Jinja's Undefined iterates as empty).
SIMPLE_TEST(TestIterable, "iterable",
            v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
// len() and __getitem__ both exist: str, list, tuple, range, dict, and Undefined (whose
// __getitem__ raises but exists); dict views have no __getitem__.
SIMPLE_TEST(TestSequence, "sequence",
            v.is_string() || v.is_dict() || v.is_undefined() ||
                (v.is_list() &&
                 (v.AsList().kind == ListKind::kList || v.AsList().kind == ListKind::kTuple ||
                  v.AsList().kind == ListKind::kRange)))
// Undefined and LoopContext define __call__ in Jinja.
SIMPLE_TEST(TestCallable, "callable", v.is_callable() || v.is_undefined() || v.is_loop())
SIMPLE_TEST(TestLower, "lower", PyIsLower(ToStr(v)))
SIMPLE_TEST(TestUpper, "upper", PyIsUpper(ToStr(v)))

#undef SIMPLE_TEST

Result<bool> TestParity(const Value& v, CallArgs& args, std::string_view name, int64_t want) {
  RETURN_IF_ERROR(NoArgs(name, args).status());
  ASSIGN_OR_RETURN(Value m, BinaryOperation(BinaryOp::kMod, v, Value::Int(2)));
  return Equals(m, Value::Int(want));
}
Result<bool> TestOdd(Evaluator&, const Value& v, CallArgs& args) {
  return TestParity(v, args, "odd", 1);
}
Result<bool> TestEven(Evaluator&, const Value& v, CallArgs& args) {
  return TestParity(v, args, "even", 0);
}

Result<bool> TestDivisibleBy(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("divisibleby", args, {"num"}, 1));
  ASSIGN_OR_RETURN(Value m, BinaryOperation(BinaryOp::kMod, v, *a[0]));
  return Equals(m, Value::Int(0));
}

Result<bool> TestIn(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("in", args, {"seq"}, 1));
  return Contains(*a[0], v);
}

Result<bool> TestSameAs(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("sameas", args, {"other"}, 1));
  const Value& other = *a[0];
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      return Equals(v, other);
    default:
      return v.Identity() == other.Identity();
  }
}

template <CompareOp kOp>
Result<bool> TestCompare(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("comparison test", args, {"other"}, 1));
  return CompareOperation(kOp, v, *a[0]);
}

Result<bool> TestFilterExists(Evaluator&, const Value& v, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("filter", args).status());
  return v.is_string() && FindFilter(v.AsString()) != nullptr;
}

Result<bool> TestTestExists(Evaluator&, const Value& v, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("test", args).status());
  return v.is_string() && FindTest(v.AsString()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& Tests() {
  static const auto* tests = new std::unordered_map<std::string_view, TestFn>{
      {"defined", TestDefined},
      {"undefined", TestUndefined},
      {"none", TestNone},
      {"boolean", TestBoolean},
      {"false", TestFalse},
      {"true", TestTrue},
      {"integer", TestInteger},
      {"float", TestFloat},
      {"number", TestNumber},
      {"string", TestString},
      {"mapping", TestMapping},
      {"iterable", TestIterable},
      {"sequence", TestSequence},
      {"callable", TestCallable},
      {"escaped", TestEscaped},
      {"lower", TestLower},
      {"upper", TestUpper},
      {"odd", TestOdd},
      {"even", TestEven},
      {"divisibleby", TestDivisibleBy},
      {"in", TestIn},
      {"sameas", TestSameAs},
      {"eq", TestCompare<CompareOp::kEq>},
      {"equalto", TestCompare<CompareOp::kEq>},
      {"==", TestCompare<CompareOp::kEq>},
      {"ne", TestCompare<CompareOp::kNe>},
      {"!=", TestCompare<CompareOp::kNe>},
      {"lt", TestCompare<CompareOp::kLt>},
      {"lessthan", TestCompare<CompareOp::kLt>},
      {"<", TestCompare<CompareOp::kLt>},
      {"le", TestCompare<CompareOp::kLe>},
      {"<=", TestCompare<CompareOp::kLe>},
      {"gt", TestCompare<CompareOp::kGt>},
      {"greaterthan", TestCompare<CompareOp::kGt>},
      {">", TestCompare<CompareOp::kGt>},
      {"ge", TestCompare<CompareOp::kGe>},
      {">=", TestCompare<CompareOp::kGe>},
      {"filter", TestFilterExists},
      {"test", TestTestExists},
  };
  return *tests;
}

// ---- globals -------------------------------------------------------------------------------

Result<Value> GlobalRange(Evaluator&, CallArgs& args) {
  if (!args.keyword.empty()) return InvalidArgument("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return InvalidArgument("range expected 1 to 3 arguments, got {}", n);
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < n; ++i) {
    const Value& a = args.positional[i];
    if (a.is_undefined()) return UndefinedError(a);
    if (!a.is_integral()) {
      return InvalidArgument("'{}' object cannot be interpreted as an integer", TypeName(a));
    }
  }
  if (n == 1) {
    v[1] = args.positional[0].AsInt();
  } else {
    v[0] = args.positional[0].AsInt();
    v[1] = args.positional[1].AsInt();
    if (n == 3) v[2] = args.positional[2].AsInt();
  }
  if (v[2] == 0) return InvalidArgument("range() arg 3 must not be zero");
  int64_t count = 0;
  if (v[2] > 0 && v[0] < v[1]) {
    count = static_cast<int64_t>((static_cast<__int128>(v[1]) - v[0] - 1) / v[2] + 1);
  } else if (v[2] < 0 && v[0] > v[1]) {
    count = static_cast<int64_t>((static_cast<__int128>(v[0]) - v[1] - 1) / -v[2] + 1);
  }
  if (count > kMaxRange) {
    return InvalidArgument("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
                           kMaxRange);
  }
  auto list = std::make_shared<List>();
  list->kind = ListKind::kRange;
  list->range_start = v[0];
  list->range_stop = v[1];
  list->range_step = v[2];
  for (int64_t i = 0; i < count; ++i) list->items.push_back(Value::Int(v[0] + i * v[2]));
  return Value::WrapList(std::move(list));
}

// Python's dict(*args, **kwargs): one mapping or iterable of pairs, then keywords.
Result<Dict> BuildDict(std::string_view function, CallArgs& args) {
  if (args.positional.size() > 1) {
    return InvalidArgument("{} expected at most 1 positional argument, got {}", function,
                           args.positional.size());
  }
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      dict = source.AsDict();
    } else {
      ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(source));
      for (const Value& pair : pairs) {
        ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(pair));
        if (kv.size() != 2) {
          return InvalidArgument("{} update sequence element has length {}; 2 is required",
                                 function, kv.size());
        }
        if (!IsHashable(kv[0])) return InvalidArgument("unhashable type: '{}'", TypeName(kv[0]));
        dict.Set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [name, value] : args.keyword) dict.Set(Value::String(name), value);
  return dict;
}

Result<Value> GlobalDict(Evaluator&, CallArgs& args) {
  ASSIGN_OR_RETURN(Dict dict, BuildDict("dict", args));
  return Value::MakeDict(std::move(dict));
}

Result<Value> GlobalNamespace(Evaluator&, CallArgs& args) {
  ASSIGN_OR_RETURN(Dict dict, BuildDict("namespace", args));
  auto ns = std::make_shared<Namespace>();
  ns->attrs = std::move(dict);
  return Value::MakeNamespace(std::move(ns));
}

// transformers' raise_exception: the template aborts with its own message.
Result<Value> GlobalRaiseException(Evaluator&, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("raise_exception", args, {"message"}, 1));
  return InvalidArgument("{}", ToStr(*a[0]));
}

// transformers' strftime_now: datetime.now().strftime(format), local time.
Result<Value> GlobalStrftimeNow(Evaluator&, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("strftime_now", args, {"format"}, 1));
  if (!a[0]->is_string()) return InvalidArgument("strftime() argument 1 must be str");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const std::string& format = a[0]->AsString();
  if (format.empty()) return Value::String("");
  std::string buf(format.size() * 4 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  if (n == 0) return InvalidArgument("strftime format too long: {}", PyStrRepr(format));
  buf.resize(n);
  return Value::String(std::move(buf));
}

}  // namespace

Result<std::vector<std::optional<Value>>> BindArgs(std::string_view function, CallArgs& args,
                                                   std::initializer_list<std::string_view> params,
                                                   size_t required) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size()) {
    return InvalidArgument("{}() takes at most {} argument(s) ({} given)", function, params.size(),
                           args.positional.size());
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = std::move(args.positional[i]);
  for (auto& [name, value] : args.keyword) {
    size_t i = 0;
    for (std::string_view p : params) {
      if (p == name) break;
      ++i;
    }
    if (i == params.size()) {
      return InvalidArgument("{}() got an unexpected keyword argument '{}'", function, name);
    }
    if (bound[i].has_value()) {
      return InvalidArgument("{}() got multiple values for argument '{}'", function, name);
    }
    bound[i] = std::move(value);
  }
  size_t i = 0;
  for (std::string_view p : params) {
    if (i < required && !bound[i].has_value()) {
      return InvalidArgument("{}() missing required argument '{}'", function, p);
    }
    ++i;
  }
  return bound;
}

TestFn FindTest(std::string_view name) {
  const auto& tests = Tests();
  const auto it = tests.find(name);
  return it == tests.end() ? nullptr : it->second;
}

std::optional<Value> FindGlobal(std::string_view name) {
  struct Global {
    std::string_view name;
    Result<Value> (*fn)(Evaluator&, CallArgs&);
  };
  static constexpr Global kGlobals[] = {
      {"range", GlobalRange},
      {"dict", GlobalDict},
      {"namespace", GlobalNamespace},
      {"raise_exception", GlobalRaiseException},
      {"strftime_now", GlobalStrftimeNow},
  };
  for (const Global& g : kGlobals) {
    if (g.name == name) {
      return Value::MakeCallable(CallableKind::kFunction, std::string(name), g.fn);
    }
  }
  return std::nullopt;
}

}  // namespace moeserve::jinja
