// Tree-walking evaluator of a parsed template. One Interpreter renders one template once; it
// holds the variable scopes, the output buffer and the limits that keep a hostile template from
// exhausting the stack, the CPU or the memory.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/evaluator.h"
#include "jinja/value.h"

namespace moeserve::jinja {

class Interpreter final : public Evaluator {
 public:
  Interpreter() = default;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `body` with the template variables `context` (in order; later entries win).
  // Errors name the template line: "template error at line 7: 'dict object' has no attribute
  // 'x'".
  Result<std::string> Render(const Body& body,
                             const std::vector<std::pair<std::string, Value>>& context);

  // The services of Evaluator (evaluator.h) for filters, tests and methods.
  Result<Value> Call(const Value& callee, CallArgs args) override;
  Result<Value> GetAttr(const Value& object, std::string_view name) override;
  Result<Value> GetItem(const Value& object, const Value& key) override;
  Result<Value> ApplyFilter(std::string_view name, const Value& input, CallArgs args) override;
  Result<bool> ApplyTest(std::string_view name, const Value& input, CallArgs args) override;

 private:
  struct Scope;
  using ScopePtr = std::shared_ptr<Scope>;
  enum class Flow { kNormal, kBreak, kContinue };
  class DepthGuard;

  Status ExecBody(const Body& body, const ScopePtr& scope);
  Status Exec(const Stmt& stmt, const ScopePtr& scope);
  Status ExecFor(const ForStmt& stmt, const ScopePtr& scope);
  Status ExecCallBlock(const CallBlockStmt& stmt, const ScopePtr& scope);
  // Renders `body` into a string instead of the output.
  Result<std::string> Capture(const Body& body, const ScopePtr& scope);
  Status Assign(const Target& target, const Value& value, const ScopePtr& scope);
  Status Append(std::string_view text);

  Result<Value> Eval(const Expr& expr, const ScopePtr& scope);
  Result<Value> EvalBinary(const BinaryExpr& expr, const ScopePtr& scope);
  Result<Value> EvalCompare(const CompareExpr& expr, const ScopePtr& scope);
  Result<Value> EvalCall(const CallExpr& expr, const ScopePtr& scope, const Value* caller);
  Result<Value> EvalFilter(const FilterExpr& expr, const ScopePtr& scope, const Value* input);
  Result<Value> EvalSlice(const Value& object, const SliceExpr& slice, const ScopePtr& scope);
  Result<CallArgs> EvalArgs(const Arguments& args, const ScopePtr& scope);
  Value Lookup(std::string_view name, const ScopePtr& scope) const;

  Value MakeMacro(const MacroStmt& macro, const ScopePtr& scope);
  void TrackClosureScope(const ScopePtr& scope);
  Result<Value> CallMacro(const MacroStmt& macro, const ScopePtr& closure, CallArgs& args);
  Value LoopAttribute(const Value& loop, std::string_view name);

  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  int line_ = 0;       // line of the node being evaluated, for error messages
  int depth_ = 0;      // nested Exec/Eval/macro calls
  int64_t steps_ = 0;  // loop iterations and macro calls so far
  // Scopes captured by macros and namespaces assigned to. A macro stored in its own defining
  // scope, or a namespace stored in itself, is a reference cycle; Render clears these at the end
  // to break every cycle (values are immutable otherwise, so no other cycle can form).
  std::vector<std::weak_ptr<Scope>> closure_scopes_;
  size_t closure_scopes_pruned_size_ = 0;
  std::vector<std::weak_ptr<Namespace>> assigned_namespaces_;
};

}  // namespace moeserve::jinja
