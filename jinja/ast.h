// Syntax tree of a parsed template. Expressions and statements are small structs tagged with a
// kind; the interpreter switches on the kind. Filters and tests are resolved to their functions at
// parse time, so an unknown name is a parse error, not a surprise halfway through a render.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace moeserve::jinja {

using FilterFn = Result<Value> (*)(Evaluator&, const Value& input, CallArgs& args);
using TestFn = Result<bool> (*)(Evaluator&, const Value& input, CallArgs& args);

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kCompare,
  kCondExpr,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  // Records a child for `depth`.
  void Include(const ExprPtr& child) {
    if (child && child->depth + 1 > depth) depth = child->depth + 1;
  }
  ExprKind kind;
  int line;
  // Height of the subtree. The parser rejects expressions deeper than a limit, because
  // evaluating and destroying the tree recurses (`1+1+1+...` is one level per operator).
  int depth = 1;
};

struct LiteralExpr : Expr {
  LiteralExpr(int l, Value v) : Expr(ExprKind::kLiteral, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(int l, std::string n) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

// kList and kTuple.
struct SequenceExpr : Expr {
  SequenceExpr(ExprKind k, int l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(int l, ExprPtr o, std::string n)
      : Expr(ExprKind::kGetAttr, l), object(std::move(o)), name(std::move(n)) {
    Include(object);
  }
  ExprPtr object;
  std::string name;
};

// obj[index]; index may be a SliceExpr.
struct GetItemExpr : Expr {
  GetItemExpr(int l, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::kGetItem, l), object(std::move(o)), index(std::move(i)) {
    Include(object);
    Include(index);
  }
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(ExprKind::kSlice, l) {}
  ExprPtr start, stop, step;  // each may be null
};

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct CallExpr : Expr {
  CallExpr(int l, ExprPtr c) : Expr(ExprKind::kCall, l), callee(std::move(c)) { Include(callee); }
  ExprPtr callee;
  Arguments args;
};

// operand|name(args). In {% filter %} blocks and {% set x | f %} the innermost operand is null
// and stands for the captured block output.
struct FilterExpr : Expr {
  FilterExpr(int l, ExprPtr o, std::string n, FilterFn f)
      : Expr(ExprKind::kFilter, l), operand(std::move(o)), name(std::move(n)), fn(f) {
    Include(operand);
  }
  ExprPtr operand;
  std::string name;
  FilterFn fn;
  Arguments args;
};

struct TestExpr : Expr {
  TestExpr(int l, ExprPtr o, std::string n, TestFn f, bool neg)
      : Expr(ExprKind::kTest, l), operand(std::move(o)), name(std::move(n)), fn(f), negated(neg) {
    Include(operand);
  }
  ExprPtr operand;
  std::string name;
  TestFn fn;
  bool negated;
  Arguments args;
};

enum class UnaryOp { kNot, kNeg, kPos };

struct UnaryExpr : Expr {
  UnaryExpr(int l, UnaryOp o, ExprPtr e) : Expr(ExprKind::kUnary, l), op(o), operand(std::move(e)) {
    Include(operand);
  }
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat, kAnd, kOr };

struct BinaryExpr : Expr {
  BinaryExpr(int l, BinaryOp o, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {
    Include(left);
    Include(right);
  }
  BinaryOp op;
  ExprPtr left, right;
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// a < b <= c: Python's chained comparison.
struct CompareExpr : Expr {
  CompareExpr(int l, ExprPtr f) : Expr(ExprKind::kCompare, l), first(std::move(f)) {
    Include(first);
  }
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

// then_expr if test else else_expr; else_expr may be null (the result is then Undefined).
struct CondExpr : Expr {
  CondExpr(int l, ExprPtr t, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::kCondExpr, l),
        test(std::move(t)),
        then_expr(std::move(a)),
        else_expr(std::move(b)) {
    Include(test);
    Include(then_expr);
    Include(else_expr);
  }
  ExprPtr test, then_expr, else_expr;
};

// Assignment targets of set, for and with: a name, a (nested) tuple of names, or ns.attr.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;           // kName; the namespace variable for kNamespaceAttr
  std::string attr;           // kNamespaceAttr
  std::vector<Target> items;  // kTuple
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kGeneration,
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
  std::string text;
};

// {{ expr }} and {% print expr %}.
struct OutputStmt : Stmt {
  OutputStmt(int l, ExprPtr e) : Stmt(StmtKind::kOutput, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // {% for x in xs if cond %}; may be null
  Body body;
  Body else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::kSet, l) {}
  Target target;
  ExprPtr value;
};

// {% set x %}...{% endset %}, optionally {% set x | filter %}.
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(StmtKind::kSetBlock, l) {}
  Target target;
  ExprPtr filter;  // a FilterExpr chain with a null innermost operand, or null
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l) {}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default expression or null
  Body body;
  // Whether the body mentions varargs / kwargs / caller: as in Jinja, only then does the macro
  // accept extra positional or keyword arguments or a call block.
  bool catch_varargs = false;
  bool catch_kwargs = false;
  bool uses_caller = false;
};

// {% call(params) macro(args) %}body{% endcall %}: `caller` is a macro made of the body.
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(StmtKind::kCallBlock, l), caller(l) {}
  ExprPtr call;  // a CallExpr
  MacroStmt caller;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::kFilterBlock, l) {}
  ExprPtr filter;  // FilterExpr chain with a null innermost operand
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

struct LoopControlStmt : Stmt {
  LoopControlStmt(StmtKind k, int l) : Stmt(k, l) {}
};

// {% generation %}...{% endgeneration %} (transformers' AssistantTracker extension): renders its
// body unchanged; transformers only uses it to record assistant-token masks.
struct GenerationStmt : Stmt {
  explicit GenerationStmt(int l) : Stmt(StmtKind::kGeneration, l) {}
  Body body;
};

}  // namespace moeserve::jinja
