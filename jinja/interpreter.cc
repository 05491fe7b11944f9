#include "jinja/interpreter.h"

#include <fmt/format.h>

#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/operators.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

// Nested evaluations (statements, expressions, macro calls) before a render is refused. Real
// templates stay below ~100; this keeps recursion, e.g. a macro calling itself, within well under
// a megabyte of stack.
constexpr int kMaxDepth = 600;
// Loop iterations plus macro calls per render: a chat template does thousands at most, so this
// only stops runaway templates (nested range(100000) loops).
constexpr int64_t kMaxSteps = 20'000'000;

Status TooDeep() { return InvalidArgument("template recursion deeper than {} levels", kMaxDepth); }

}  // namespace

// Variables of one frame: the template's top level, one for-loop iteration, one macro call or a
// with block. Frames are few and small, so a vector beats a hash map.
struct Interpreter::Scope {
  explicit Scope(ScopePtr p) : parent(std::move(p)) {}
  const Value* Find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void Set(std::string_view name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(value));
  }
  ScopePtr parent;
  std::vector<std::pair<std::string, Value>> vars;
};

class Interpreter::DepthGuard {
 public:
  explicit DepthGuard(Interpreter* in) : in_(in) { ++in_->depth_; }
  ~DepthGuard() { --in_->depth_; }
  bool exceeded() const { return in_->depth_ > kMaxDepth; }

 private:
  Interpreter* in_;
};

Result<std::string> Interpreter::Render(const Body& body,
                                        const std::vector<std::pair<std::string, Value>>& context) {
  auto root = std::make_shared<Scope>(nullptr);
  for (const auto& [name, value] : context) root->Set(name, value);
  std::string out;
  out_ = &out;
  flow_ = Flow::kNormal;
  depth_ = 0;
  steps_ = 0;
  line_ = 1;
  const Status status = ExecBody(body, root);
  for (const auto& weak : closure_scopes_) {
    if (ScopePtr scope = weak.lock()) scope->vars.clear();
  }
  closure_scopes_.clear();
  closure_scopes_pruned_size_ = 0;
  for (const auto& weak : assigned_namespaces_) {
    if (std::shared_ptr<Namespace> ns = weak.lock()) ns->attrs = Dict();
  }
  assigned_namespaces_.clear();
  root->vars.clear();
  out_ = nullptr;
  if (!status.ok()) {
    return Status(status.code(),
                  fmt::format("template error at line {}: {}", line_, status.message()));
  }
  return out;
}

Status Interpreter::Append(std::string_view text) {
  if (out_->size() + text.size() > kMaxStringBytes) {
    return InvalidArgument("rendered output larger than {} bytes", kMaxStringBytes);
  }
  out_->append(text);
  return OkStatus();
}

Status Interpreter::ExecBody(const Body& body, const ScopePtr& scope) {
  for (const StmtPtr& stmt : body) {
    RETURN_IF_ERROR(Exec(*stmt, scope));
    if (flow_ != Flow::kNormal) break;
  }
  return OkStatus();
}

Result<std::string> Interpreter::Capture(const Body& body, const ScopePtr& scope) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  const Status status = ExecBody(body, scope);
  out_ = saved;
  RETURN_IF_ERROR(status);
  return buffer;
}

Status Interpreter::Exec(const Stmt& stmt, const ScopePtr& scope) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep();
  line_ = stmt.line;
  switch (stmt.kind) {
    case StmtKind::kText:
      return Append(static_cast<const TextStmt&>(stmt).text);
    case StmtKind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*static_cast<const OutputStmt&>(stmt).expr, scope));
      RETURN_IF_ERROR(CheckPrintable(v));
      return Append(ToStr(v));
    }
    case StmtKind::kIf: {
      const auto& s = static_cast<const IfStmt&>(stmt);
      for (const auto& [test, body] : s.branches) {
        ASSIGN_OR_RETURN(Value v, Eval(*test, scope));
        if (Truthy(v)) return ExecBody(body, scope);
      }
      return ExecBody(s.else_body, scope);
    }
    case StmtKind::kFor:
      return ExecFor(static_cast<const ForStmt&>(stmt), scope);
    case StmtKind::kSet: {
      const auto& s = static_cast<const SetStmt&>(stmt);
      ASSIGN_OR_RETURN(Value v, Eval(*s.value, scope));
      return Assign(s.target, v, scope);
    }
    case StmtKind::kSetBlock: {
      const auto& s = static_cast<const SetBlockStmt&>(stmt);
      // The block body is its own frame: assignments inside it do not leak (as in jinja2).
      ASSIGN_OR_RETURN(std::string text, Capture(s.body, std::make_shared<Scope>(scope)));
      Value v = Value::String(std::move(text));
      if (s.filter) {
        ASSIGN_OR_RETURN(v, EvalFilter(static_cast<const FilterExpr&>(*s.filter), scope, &v));
      }
      return Assign(s.target, v, scope);
    }
    case StmtKind::kMacro: {
      const auto& s = static_cast<const MacroStmt&>(stmt);
      scope->Set(s.name, MakeMacro(s, scope));
      return OkStatus();
    }
    case StmtKind::kCallBlock:
      return ExecCallBlock(static_cast<const CallBlockStmt&>(stmt), scope);
    case StmtKind::kFilterBlock: {
      const auto& s = static_cast<const FilterBlockStmt&>(stmt);
      ASSIGN_OR_RETURN(std::string text, Capture(s.body, std::make_shared<Scope>(scope)));
      const Value input = Value::String(std::move(text));
      ASSIGN_OR_RETURN(Value v,
                       EvalFilter(static_cast<const FilterExpr&>(*s.filter), scope, &input));
      RETURN_IF_ERROR(CheckPrintable(v));
      return Append(ToStr(v));
    }
    case StmtKind::kWith: {
      const auto& s = static_cast<const WithStmt&>(stmt);
      auto inner = std::make_shared<Scope>(scope);
      // Values are evaluated in the enclosing scope, as jinja2 compiles them.
      for (const auto& [target, expr] : s.assignments) {
        ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
        RETURN_IF_ERROR(Assign(target, v, inner));
      }
      return ExecBody(s.body, inner);
    }
    case StmtKind::kBreak:
      flow_ = Flow::kBreak;
      return OkStatus();
    case StmtKind::kContinue:
      flow_ = Flow::kContinue;
      return OkStatus();
    case StmtKind::kGeneration:
      return ExecBody(static_cast<const GenerationStmt&>(stmt).body, scope);
  }
  return Internal("unknown statement kind");
}

Status Interpreter::ExecFor(const ForStmt& stmt, const ScopePtr& scope) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.iter, scope));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
  if (stmt.filter) {
    // {% for x in xs if cond %}: the condition sees the loop variables but not `loop`.
    std::vector<Value> kept;
    for (Value& item : items) {
      auto frame = std::make_shared<Scope>(scope);
      RETURN_IF_ERROR(Assign(stmt.target, item, frame));
      ASSIGN_OR_RETURN(Value keep, Eval(*stmt.filter, frame));
      if (Truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    return ExecBody(stmt.else_body, std::make_shared<Scope>(scope));
  }
  auto list = std::make_shared<List>();
  list->items = std::move(items);
  const std::shared_ptr<const List> shared_items = list;
  auto changed_state = std::make_shared<std::optional<Value>>();
  for (size_t i = 0; i < shared_items->items.size(); ++i) {
    if (++steps_ > kMaxSteps) {
      return InvalidArgument("template exceeded {} loop iterations and macro calls", kMaxSteps);
    }
    // Each iteration gets a fresh frame: `set` inside a loop body does not outlive the
    // iteration, exactly as in Jinja (hence namespace()).
    auto frame = std::make_shared<Scope>(scope);
    RETURN_IF_ERROR(Assign(stmt.target, shared_items->items[i], frame));
    LoopInfo info;
    info.items = shared_items;
    info.index0 = static_cast<int64_t>(i);
    info.changed_state = changed_state;
    frame->Set("loop", Value::MakeLoop(std::move(info)));
    const Status status = ExecBody(stmt.body, frame);
    if (!status.ok() || flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      changed_state->reset();
      return status;
    }
    flow_ = Flow::kNormal;
  }
  // loop.changed(loop) would keep the loop's state alive through itself.
  changed_state->reset();
  return OkStatus();
}

Status Interpreter::ExecCallBlock(const CallBlockStmt& stmt, const ScopePtr& scope) {
  const Value caller = MakeMacro(stmt.caller, scope);
  ASSIGN_OR_RETURN(Value v, EvalCall(static_cast<const CallExpr&>(*stmt.call), scope, &caller));
  return Append(ToStr(v));
}

Status Interpreter::Assign(const Target& target, const Value& value, const ScopePtr& scope) {
  switch (target.kind) {
    case Target::Kind::kName:
      scope->Set(target.name, value);
      return OkStatus();
    case Target::Kind::kNamespaceAttr: {
      const Value ns = Lookup(target.name, scope);
      if (!ns.is_namespace()) {
        return InvalidArgument("cannot assign attribute '{}' on '{}', which is not a namespace",
                               target.attr, target.name);
      }
      // A namespace is the only place a value can grow across loop iterations
      // ({% set ns.x = [ns.x] %}), so this is where nesting is bounded.
      if (value.Depth() > kMaxValueDepth) {
        return InvalidArgument("value nested more than {} levels deep", kMaxValueDepth);
      }
      if (!ns.AsNamespace()->tracked) {
        ns.AsNamespace()->tracked = true;
        assigned_namespaces_.push_back(ns.AsNamespace());
      }
      ns.AsNamespace()->attrs.Set(Value::String(target.attr), value);
      return OkStatus();
    }
    case Target::Kind::kTuple: {
      ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
      if (items.size() < target.items.size()) {
        return InvalidArgument("not enough values to unpack (expected {}, got {})",
                               target.items.size(), items.size());
      }
      if (items.size() > target.items.size()) {
        return InvalidArgument("too many values to unpack (expected {})", target.items.size());
      }
      for (size_t i = 0; i < items.size(); ++i) {
        RETURN_IF_ERROR(Assign(target.items[i], items[i], scope));
      }
      return OkStatus();
    }
  }
  return Internal("unknown assignment target");
}

Value Interpreter::Lookup(std::string_view name, const ScopePtr& scope) const {
  if (const Value* v = scope->Find(name)) return *v;
  if (std::optional<Value> global = FindGlobal(name)) return *global;
  return Value::Undefined(fmt::format("'{}' is undefined", name));
}

Result<Value> Interpreter::Eval(const Expr& expr, const ScopePtr& scope) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep();
  line_ = expr.line;
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return static_cast<const LiteralExpr&>(expr).value;
    case ExprKind::kName:
      return Lookup(static_cast<const NameExpr&>(expr).name, scope);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      const auto& e = static_cast<const SequenceExpr&>(expr);
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) {
        ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
        items.push_back(std::move(v));
      }
      Value list = Value::MakeList(
          std::move(items), expr.kind == ExprKind::kList ? ListKind::kList : ListKind::kTuple);
      if (list.Depth() > kMaxValueDepth) {
        return InvalidArgument("value nested more than {} levels deep", kMaxValueDepth);
      }
      return list;
    }
    case ExprKind::kDict: {
      const auto& e = static_cast<const DictExpr&>(expr);
      Dict dict;
      for (const auto& [key_expr, value_expr] : e.items) {
        ASSIGN_OR_RETURN(Value key, Eval(*key_expr, scope));
        ASSIGN_OR_RETURN(Value value, Eval(*value_expr, scope));
        if (key.is_undefined()) return UndefinedError(key);
        if (!IsHashable(key)) return InvalidArgument("unhashable type: '{}'", TypeName(key));
        dict.Set(std::move(key), std::move(value));
      }
      if (dict.depth() > kMaxValueDepth) {
        return InvalidArgument("value nested more than {} levels deep", kMaxValueDepth);
      }
      return Value::MakeDict(std::move(dict));
    }
    case ExprKind::kGetAttr: {
      const auto& e = static_cast<const GetAttrExpr&>(expr);
      ASSIGN_OR_RETURN(Value object, Eval(*e.object, scope));
      return GetAttr(object, e.name);
    }
    case ExprKind::kGetItem: {
      const auto& e = static_cast<const GetItemExpr&>(expr);
      ASSIGN_OR_RETURN(Value object, Eval(*e.object, scope));
      if (e.index->kind == ExprKind::kSlice) {
        return EvalSlice(object, static_cast<const SliceExpr&>(*e.index), scope);
      }
      ASSIGN_OR_RETURN(Value key, Eval(*e.index, scope));
      return GetItem(object, key);
    }
    case ExprKind::kSlice:
      return InvalidArgument("a slice is only valid inside [ ]");
    case ExprKind::kCall:
      return EvalCall(static_cast<const CallExpr&>(expr), scope, nullptr);
    case ExprKind::kFilter:
      return EvalFilter(static_cast<const FilterExpr&>(expr), scope, nullptr);
    case ExprKind::kTest: {
      const auto& e = static_cast<const TestExpr&>(expr);
      ASSIGN_OR_RETURN(Value operand, Eval(*e.operand, scope));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
      line_ = e.line;
      ASSIGN_OR_RETURN(bool result, e.fn(*this, operand, args));
      return Value::Bool(result != e.negated);
    }
    case ExprKind::kUnary: {
      const auto& e = static_cast<const UnaryExpr&>(expr);
      ASSIGN_OR_RETURN(Value operand, Eval(*e.operand, scope));
      return UnaryOperation(e.op, operand);
    }
    case ExprKind::kBinary:
      return EvalBinary(static_cast<const BinaryExpr&>(expr), scope);
    case ExprKind::kCompare:
      return EvalCompare(static_cast<const CompareExpr&>(expr), scope);
    case ExprKind::kCondExpr: {
      const auto& e = static_cast<const CondExpr&>(expr);
      ASSIGN_OR_RETURN(Value test, Eval(*e.test, scope));
      if (Truthy(test)) return Eval(*e.then_expr, scope);
      if (e.else_expr) return Eval(*e.else_expr, scope);
      return Value::Undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was "
          "defined.",
          e.line));
    }
  }
  return Internal("unknown expression kind");
}

Result<Value> Interpreter::EvalBinary(const BinaryExpr& expr, const ScopePtr& scope) {
  ASSIGN_OR_RETURN(Value left, Eval(*expr.left, scope));
  // `and` / `or` return an operand, as in Python.
  if (expr.op == BinaryOp::kAnd) {
    if (!Truthy(left)) return left;
    return Eval(*expr.right, scope);
  }
  if (expr.op == BinaryOp::kOr) {
    if (Truthy(left)) return left;
    return Eval(*expr.right, scope);
  }
  ASSIGN_OR_RETURN(Value right, Eval(*expr.right, scope));
  line_ = expr.line;
  return BinaryOperation(expr.op, left, right);
}

Result<Value> Interpreter::EvalCompare(const CompareExpr& expr, const ScopePtr& scope) {
  ASSIGN_OR_RETURN(Value left, Eval(*expr.first, scope));
  for (const auto& [op, operand] : expr.rest) {
    ASSIGN_OR_RETURN(Value right, Eval(*operand, scope));
    line_ = expr.line;
    ASSIGN_OR_RETURN(bool result, CompareOperation(op, left, right));
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Result<CallArgs> Interpreter::EvalArgs(const Arguments& args, const ScopePtr& scope) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& e : args.positional) {
    ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
    out.positional.push_back(std::move(v));
  }
  for (const auto& [name, e] : args.keyword) {
    ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
    out.keyword.emplace_back(name, std::move(v));
  }
  return out;
}

Result<Value> Interpreter::EvalCall(const CallExpr& expr, const ScopePtr& scope,
                                    const Value* caller) {
  ASSIGN_OR_RETURN(Value callee, Eval(*expr.callee, scope));
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args, scope));
  if (caller != nullptr) args.keyword.emplace_back("caller", *caller);
  line_ = expr.line;
  return Call(callee, std::move(args));
}

Result<Value> Interpreter::EvalFilter(const FilterExpr& expr, const ScopePtr& scope,
                                      const Value* input) {
  Value operand;
  if (expr.operand == nullptr) {
    operand = *input;
  } else if (expr.operand->kind == ExprKind::kFilter && input != nullptr) {
    ASSIGN_OR_RETURN(operand,
                     EvalFilter(static_cast<const FilterExpr&>(*expr.operand), scope, input));
  } else {
    ASSIGN_OR_RETURN(operand, Eval(*expr.operand, scope));
  }
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args, scope));
  line_ = expr.line;
  return expr.fn(*this, operand, args);
}

Result<Value> Interpreter::EvalSlice(const Value& object, const SliceExpr& slice,
                                     const ScopePtr& scope) {
  std::optional<int64_t> bounds[3];
  bool valid = true;  // all bounds are integers or None
  const ExprPtr* exprs[3] = {&slice.start, &slice.stop, &slice.step};
  for (int i = 0; i < 3; ++i) {
    if (*exprs[i] == nullptr) continue;
    ASSIGN_OR_RETURN(Value v, Eval(**exprs[i], scope));
    if (v.is_integral()) {
      bounds[i] = v.AsInt();
    } else if (!v.is_none()) {
      valid = false;
    }
  }
  line_ = slice.line;
  // jinja2 compiles slices to plain Python subscription (no getitem fallback to Undefined), so
  // slicing anything but a sequence is an error.
  if (object.is_undefined()) return UndefinedError(object);
  const bool sliceable =
      object.is_string() || (object.is_list() && (object.AsList().kind == ListKind::kList ||
                                                  object.AsList().kind == ListKind::kTuple ||
                                                  object.AsList().kind == ListKind::kRange));
  if (object.is_dict()) return InvalidArgument("unhashable type: 'slice'");
  if (!sliceable) return InvalidArgument("'{}' object is not subscriptable", TypeName(object));
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return InvalidArgument("slice step cannot be zero");
  if (!valid) {
    return InvalidArgument("slice indices must be integers or None or have an __index__ method");
  }
  if (object.is_string()) {
    const std::vector<char32_t> cps = ToCodePoints(object.AsString());
    int64_t start, stop;
    const int64_t n =
        AdjustSlice(static_cast<int64_t>(cps.size()), bounds[0], bounds[1], step, &start, &stop);
    std::string out;
    for (int64_t i = 0, at = start; i < n; ++i, at += step) AppendUtf8(cps[at], &out);
    return Value::String(std::move(out), object.is_markup());
  }
  const List& list = object.AsList();
  int64_t start, stop;
  const int64_t n = AdjustSlice(static_cast<int64_t>(list.items.size()), bounds[0], bounds[1], step,
                                &start, &stop);
  auto result = std::make_shared<List>();
  result->kind = list.kind;
  result->items.reserve(static_cast<size_t>(n));
  for (int64_t i = 0, at = start; i < n; ++i, at += step) result->items.push_back(list.items[at]);
  if (list.kind == ListKind::kRange) {
    result->range_start = list.range_start + start * list.range_step;
    result->range_step = list.range_step * step;
    result->range_stop = list.range_start + stop * list.range_step;
  }
  return Value::WrapList(std::move(result));
}

Result<Value> Interpreter::Call(const Value& callee, CallArgs args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return InvalidArgument("'{}' object is not callable", TypeName(callee));
  }
  return callee.AsCallable().fn(*this, args);
}

Result<Value> Interpreter::GetAttr(const Value& object, std::string_view name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(object);
    case Value::Kind::kDict: {
      if (std::optional<Value> method = FindMethod(object, name)) return *method;
      if (const Value* v = object.AsDict().Find(name)) return *v;
      break;
    }
    case Value::Kind::kString:
    case Value::Kind::kList:
      if (std::optional<Value> method = FindMethod(object, name)) return *method;
      break;
    case Value::Kind::kNamespace:
      if (const Value* v = object.AsNamespace()->attrs.Find(name)) return *v;
      break;
    case Value::Kind::kLoop:
      return LoopAttribute(object, name);
    default:
      break;
  }
  return Value::Undefined(fmt::format("'{}' has no attribute '{}'", ObjectTypeRepr(object), name));
}

Result<Value> Interpreter::GetItem(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(object);
    case Value::Kind::kList: {
      const List& list = object.AsList();
      const bool indexable = list.kind == ListKind::kList || list.kind == ListKind::kTuple ||
                             list.kind == ListKind::kRange;
      if (indexable && key.is_integral()) {
        int64_t i = key.AsInt();
        const auto n = static_cast<int64_t>(list.items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return list.items[static_cast<size_t>(i)];
      }
      break;
    }
    case Value::Kind::kDict:
      if (IsHashable(key)) {
        if (const Value* v = object.AsDict().Find(key)) return *v;
      }
      break;
    case Value::Kind::kString:
      if (key.is_integral()) {
        int64_t i = key.AsInt();
        const int64_t n = CodePointCount(object.AsString());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          const std::string& s = object.AsString();
          const size_t begin = ByteOffsetOfCodePoint(s, i);
          size_t end = begin;
          DecodeUtf8(s, &end);
          return Value::String(s.substr(begin, end - begin), object.is_markup());
        }
      }
      break;
    default:
      break;
  }
  // Item lookup failed: Jinja falls back to the attribute of that name.
  if (key.is_string()) {
    if (object.is_namespace() || object.is_loop()) return GetAttr(object, key.AsString());
    if (object.is_string() || object.is_list() || object.is_dict()) {
      if (std::optional<Value> method = FindMethod(object, key.AsString())) return *method;
    }
    return Value::Undefined(
        fmt::format("'{}' has no attribute '{}'", ObjectTypeRepr(object), key.AsString()));
  }
  return Value::Undefined(fmt::format("{} has no element {}", ObjectTypeRepr(object), Repr(key)));
}

Value Interpreter::LoopAttribute(const Value& loop, std::string_view name) {
  const LoopInfo& info = loop.AsLoop();
  const auto length = static_cast<int64_t>(info.items->items.size());
  const int64_t i = info.index0;
  if (name == "index") return Value::Int(i + 1);
  if (name == "index0") return Value::Int(i);
  if (name == "revindex") return Value::Int(length - i);
  if (name == "revindex0") return Value::Int(length - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == length - 1);
  if (name == "length") return Value::Int(length);
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  if (name == "previtem") {
    if (i == 0) return Value::Undefined("there is no previous item");
    return info.items->items[static_cast<size_t>(i - 1)];
  }
  if (name == "nextitem") {
    if (i + 1 >= length) return Value::Undefined("there is no next item");
    return info.items->items[static_cast<size_t>(i + 1)];
  }
  if (name == "cycle") {
    return Value::MakeCallable(
        CallableKind::kMethod, "LoopContext.cycle",
        [i](Evaluator&, CallArgs& args) -> Result<Value> {
          if (!args.keyword.empty())
            return InvalidArgument("loop.cycle() takes no keyword arguments");
          if (args.positional.empty()) return InvalidArgument("no items for cycling given");
          return args.positional[static_cast<size_t>(i) % args.positional.size()];
        });
  }
  if (name == "changed") {
    std::shared_ptr<std::optional<Value>> state = info.changed_state;
    return Value::MakeCallable(CallableKind::kMethod, "LoopContext.changed",
                               [state](Evaluator&, CallArgs& args) -> Result<Value> {
                                 Value current = Value::MakeList(args.positional, ListKind::kTuple);
                                 if (state->has_value() && Equals(**state, current))
                                   return Value::Bool(false);
                                 *state = std::move(current);
                                 return Value::Bool(true);
                               });
  }
  return Value::Undefined(fmt::format("'{}' has no attribute '{}'", ObjectTypeRepr(loop), name));
}

void Interpreter::TrackClosureScope(const ScopePtr& scope) {
  // Macros defined in a loop body register one frame per iteration; most frames are gone by the
  // next registration, so dropping expired entries keeps the list as small as the live frames.
  if (closure_scopes_.size() >= 2 * closure_scopes_pruned_size_ + 64) {
    std::erase_if(closure_scopes_, [](const std::weak_ptr<Scope>& w) { return w.expired(); });
    closure_scopes_pruned_size_ = closure_scopes_.size();
  }
  if (!closure_scopes_.empty() && closure_scopes_.back().lock() == scope) return;
  closure_scopes_.push_back(scope);
}

Value Interpreter::MakeMacro(const MacroStmt& macro, const ScopePtr& scope) {
  TrackClosureScope(scope);
  const MacroStmt* m = &macro;
  return Value::MakeCallable(
      CallableKind::kMacro, macro.name,
      // Callables are only ever called by the interpreter rendering the template (Call).
      [m, scope](Evaluator& in, CallArgs& args) {
        return static_cast<Interpreter&>(in).CallMacro(*m, scope, args);
      });
}

Result<Value> Interpreter::CallMacro(const MacroStmt& macro, const ScopePtr& closure,
                                     CallArgs& args) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep();
  if (++steps_ > kMaxSteps) {
    return InvalidArgument("template exceeded {} loop iterations and macro calls", kMaxSteps);
  }
  auto frame = std::make_shared<Scope>(closure);
  const size_t n = macro.params.size();
  std::vector<std::optional<Value>> bound(n);
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < n) {
      bound[i] = args.positional[i];
    } else if (macro.catch_varargs) {
      varargs.push_back(args.positional[i]);
    } else {
      return InvalidArgument("macro '{}' takes not more than {} argument(s)", macro.name, n);
    }
  }
  Dict kwargs;
  std::optional<Value> caller;
  for (auto& [name, value] : args.keyword) {
    size_t p = 0;
    while (p < n && macro.params[p].first != name) ++p;
    if (p < n) {
      if (bound[p].has_value()) {
        return InvalidArgument("macro '{}' got multiple values for argument '{}'", macro.name,
                               name);
      }
      bound[p] = value;
    } else if (name == "caller" && macro.uses_caller) {
      caller = value;
    } else if (macro.catch_kwargs) {
      kwargs.Set(Value::String(name), value);
    } else {
      return InvalidArgument("macro '{}' takes no keyword argument '{}'", macro.name, name);
    }
  }
  for (size_t p = 0; p < n; ++p) {
    const auto& [name, default_expr] = macro.params[p];
    Value v;
    if (bound[p].has_value()) {
      v = std::move(*bound[p]);
    } else if (default_expr) {
      // Defaults are evaluated per call in the macro's frame, so they may use earlier
      // parameters (jinja2 does the same).
      ASSIGN_OR_RETURN(v, Eval(*default_expr, frame));
    } else {
      v = Value::Undefined(fmt::format("parameter '{}' was not provided", name));
    }
    frame->Set(name, std::move(v));
  }
  if (macro.catch_varargs)
    frame->Set("varargs", Value::MakeList(std::move(varargs), ListKind::kTuple));
  if (macro.catch_kwargs) frame->Set("kwargs", Value::MakeDict(std::move(kwargs)));
  if (macro.uses_caller) {
    frame->Set("caller", caller.has_value() ? *caller : Value::Undefined("No caller defined"));
  }
  const Flow saved_flow = flow_;
  flow_ = Flow::kNormal;
  Result<std::string> text = Capture(macro.body, frame);
  flow_ = saved_flow;
  if (!text.ok()) return text.status();
  // With autoescaping off (as in transformers), a macro returns a plain str.
  return Value::String(std::move(text).value());
}

Result<Value> Interpreter::ApplyFilter(std::string_view name, const Value& input, CallArgs args) {
  const FilterFn fn = FindFilter(name);
  if (fn == nullptr) return InvalidArgument("no filter named '{}'", name);
  return fn(*this, input, args);
}

Result<bool> Interpreter::ApplyTest(std::string_view name, const Value& input, CallArgs args) {
  const TestFn fn = FindTest(name);
  if (fn == nullptr) return InvalidArgument("no test named '{}'", name);
  return fn(*this, input, args);
}

}  // namespace moeserve::jinja
