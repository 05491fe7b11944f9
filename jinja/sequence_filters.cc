// Jinja's filters over sequences and mappings: selection, mapping, sorting, aggregation. Like
// jinja2, select/reject/map/unique/items/batch/slice/reverse return lazy iterators.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "jinja/builtins.h"
#include "jinja/evaluator.h"
#include "jinja/filter_helpers.h"
#include "jinja/operators.h"
#include "jinja/py_string.h"

namespace moeserve::jinja::internal {
namespace {

// Stable sort of `items` by `keys` with Python ordering; an unorderable pair is an error.
Status SortByKeys(std::vector<Value>* items, std::vector<Value>* keys, bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    // Python's sort with reverse=True keeps equal elements in their original order too.
    Result<int> c =
        reverse ? Compare((*keys)[b], (*keys)[a], "<") : Compare((*keys)[a], (*keys)[b], "<");
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

Result<Value> FilterBatch(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("batch", args, {"linecount", "fill_with"}, 1));
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

Result<Value> FilterDictSort(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a,
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

Result<Value> FilterFirst(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("first", args, {}, 0));
  if (IsIterator(v)) {  // next(iter(x)) takes one item off an iterator
    const List& it = v.AsList();
    if (it.position >= it.items.size())
      return Value::Undefined("No first item, sequence was empty.");
    return it.items[it.position++];
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> FilterLast(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("last", args, {}, 0));
  if (IsIterator(v)) return InvalidArgument("'{}' object is not reversible", TypeName(v));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Result<Value> FilterItems(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("items", args, {}, 0));
  if (v.is_undefined()) return MakeIterator({});
  if (!v.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, value] : v.AsDict().entries()) {
    items.push_back(Value::MakeList({k, value}, ListKind::kTuple));
  }
  return MakeIterator(std::move(items));
}

Result<Value> FilterJoin(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("join", args, {"d", "attribute"}, 0));
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

Result<Value> FilterLength(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("length", args, {}, 0));
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(CodePointCount(v.AsString()));
    case Value::Kind::kList:
      if (IsIterator(v)) return InvalidArgument("object of type '{}' has no len()", TypeName(v));
      return Value::Int(static_cast<int64_t>(v.AsList().items.size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.AsDict().size()));
    case Value::Kind::kLoop:
      return Value::Int(static_cast<int64_t>(v.AsLoop().items->items.size()));
    default:
      return InvalidArgument("object of type '{}' has no len()", TypeName(v));
  }
}

Result<Value> FilterList(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("list", args, {}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  return Value::MakeList(std::move(items));
}

// jinja2's map/select/reject iterate only `if value:`, so a falsy non-iterable (0, None, False)
// gives an empty result instead of an error.
Result<std::vector<Value>> IterateIfTruthy(const Value& v) {
  if (!Truthy(v)) return std::vector<Value>{};
  return Iterate(v);
}

// map(attribute='x', default=...) or map('filter', args...).
Result<Value> FilterMap(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, IterateIfTruthy(v));
  std::vector<Value> out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    std::optional<Value> attribute, fallback;
    for (auto& [name, value] : args.keyword) {
      if (name == "attribute")
        attribute = value;
      else if (name == "default")
        fallback = value;
      else
        return InvalidArgument("map() got an unexpected keyword argument '{}'", name);
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
Result<Value> SelectOrReject(Evaluator& in, const Value& v, CallArgs& args, bool select,
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

Result<Value> FilterSelect(Evaluator& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, false);
}
Result<Value> FilterReject(Evaluator& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, false);
}
Result<Value> FilterSelectAttr(Evaluator& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, true);
}
Result<Value> FilterRejectAttr(Evaluator& in, const Value& v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, true);
}

Result<Value> MinOrMax(Evaluator& in, const Value& v, CallArgs& args, bool max) {
  ASSIGN_OR_RETURN(FilterArgs a,
                   BindArgs(max ? "max" : "min", args, {"case_sensitive", "attribute"}, 0));
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

Result<Value> FilterMax(Evaluator& in, const Value& v, CallArgs& args) {
  return MinOrMax(in, v, args, true);
}
Result<Value> FilterMin(Evaluator& in, const Value& v, CallArgs& args) {
  return MinOrMax(in, v, args, false);
}

Result<Value> FilterReverse(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("reverse", args, {}, 0));
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
      case ListKind::kTuple:
        type = "reversed";
        break;
      case ListKind::kRange:
        type = "range_iterator";
        break;
      case ListKind::kDictKeys:
        type = "dict_reversekeyiterator";
        break;
      case ListKind::kDictValues:
        type = "dict_reversevalueiterator";
        break;
      case ListKind::kDictItems:
        type = "dict_reverseitemiterator";
        break;
      default:
        break;
    }
  }
  return MakeIterator(std::move(items), type);
}

Result<Value> FilterSlice(Evaluator&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("slice", args, {"slices", "fill_with"}, 1));
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

Result<Value> FilterSort(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a,
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

Result<Value> FilterSum(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("sum", args, {"attribute", "start"}, 0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  Value total = a[1].has_value() ? *a[1] : Value::Int(0);
  if (total.is_string())
    return InvalidArgument("sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& item : items) {
    Value x = item;
    if (a[0].has_value() && !a[0]->is_none()) {
      ASSIGN_OR_RETURN(x, GetAttributePath(in, item, *a[0]));
    }
    ASSIGN_OR_RETURN(total, BinaryOperation(BinaryOp::kAdd, total, x));
  }
  return total;
}

Result<Value> FilterUnique(Evaluator& in, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(FilterArgs a, BindArgs("unique", args, {"case_sensitive", "attribute"}, 0));
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

}  // namespace

void AddSequenceFilters(FilterTable* table) {
  table->emplace("batch", FilterBatch);
  table->emplace("count", FilterLength);
  table->emplace("dictsort", FilterDictSort);
  table->emplace("first", FilterFirst);
  table->emplace("items", FilterItems);
  table->emplace("join", FilterJoin);
  table->emplace("last", FilterLast);
  table->emplace("length", FilterLength);
  table->emplace("list", FilterList);
  table->emplace("map", FilterMap);
  table->emplace("max", FilterMax);
  table->emplace("min", FilterMin);
  table->emplace("reject", FilterReject);
  table->emplace("rejectattr", FilterRejectAttr);
  table->emplace("reverse", FilterReverse);
  table->emplace("select", FilterSelect);
  table->emplace("selectattr", FilterSelectAttr);
  table->emplace("slice", FilterSlice);
  table->emplace("sort", FilterSort);
  table->emplace("sum", FilterSum);
  table->emplace("unique", FilterUnique);
}

}  // namespace moeserve::jinja::internal
