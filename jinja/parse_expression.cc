// Expression parsing: jinja2.parser's precedence climbing, from conditional expressions down to
// primaries, postfix subscripts and calls, filters and tests.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "jinja/builtins.h"
#include "jinja/parser_internal.h"

namespace moeserve::jinja::internal {

template <typename Sub>
Result<ExprPtr> Parser::ParseBinaryLevel(
    Sub sub, std::initializer_list<std::pair<std::string_view, BinaryOp>> ops) {
  ASSIGN_OR_RETURN(ExprPtr left, (this->*sub)());
  while (true) {
    const auto* match =
        std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return IsOp(o.first); });
    if (match == ops.end()) return left;
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, (this->*sub)());
    left = std::make_unique<BinaryExpr>(line, match->second, std::move(left), std::move(right));
    RETURN_IF_ERROR(CheckDepth(*left));
  }
}

// jinja2's parse_tuple: one expression, or a comma-separated tuple without parentheses.
Result<ExprPtr> Parser::ParseTuple(bool simplified, bool with_condexpr,
                                   std::initializer_list<std::string_view> extra_end,
                                   bool explicit_parens) {
  const int line = Cur().line;
  auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
  bool is_tuple = false;
  while (true) {
    if (!tuple->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsTupleEnd(extra_end)) break;
    ExprPtr item;
    if (simplified) {
      ASSIGN_OR_RETURN(item, ParsePrimary());
    } else {
      ASSIGN_OR_RETURN(item, ParseExpression(with_condexpr));
    }
    tuple->Include(item);
    tuple->items.push_back(std::move(item));
    if (IsOp(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (tuple->items.size() == 1) return std::move(tuple->items[0]);
    if (!explicit_parens) return Unexpected("an expression");
  }
  RETURN_IF_ERROR(CheckDepth(*tuple));
  return ExprPtr(std::move(tuple));
}

Result<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  if (with_condexpr) return ParseCondExpr();
  return ParseOr();
}

Result<ExprPtr> Parser::ParseCondExpr() {
  ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    ExprPtr else_expr;
    if (SkipName("else")) {
      NestingGuard guard(this);
      if (guard.exceeded()) return Fail(Cur().line, "conditional expressions nested too deeply");
      ASSIGN_OR_RETURN(else_expr, ParseCondExpr());
    }
    expr = std::make_unique<CondExpr>(line, std::move(test), std::move(expr), std::move(else_expr));
    RETURN_IF_ERROR(CheckDepth(*expr));
  }
  return expr;
}

Result<ExprPtr> Parser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName("or")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    left = std::make_unique<BinaryExpr>(line, BinaryOp::kOr, std::move(left), std::move(right));
    RETURN_IF_ERROR(CheckDepth(*left));
  }
  return left;
}

Result<ExprPtr> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName("and")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    left = std::make_unique<BinaryExpr>(line, BinaryOp::kAnd, std::move(left), std::move(right));
    RETURN_IF_ERROR(CheckDepth(*left));
  }
  return left;
}

Result<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    NestingGuard guard(this);
    if (guard.exceeded()) return Fail(Cur().line, "too many nested 'not' operators");
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    return ExprPtr(std::make_unique<UnaryExpr>(line, UnaryOp::kNot, std::move(operand)));
  }
  return ParseCompare();
}

Result<ExprPtr> Parser::ParseCompare() {
  const int line = Cur().line;
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    CompareOp op;
    if (IsOp("==")) {
      op = CompareOp::kEq;
    } else if (IsOp("!=")) {
      op = CompareOp::kNe;
    } else if (IsOp("<")) {
      op = CompareOp::kLt;
    } else if (IsOp("<=")) {
      op = CompareOp::kLe;
    } else if (IsOp(">")) {
      op = CompareOp::kGt;
    } else if (IsOp(">=")) {
      op = CompareOp::kGe;
    } else if (IsName("in")) {
      op = CompareOp::kIn;
    } else if (IsName("not") && Look().type == TokenType::kName && Look().value == "in") {
      Next();
      op = CompareOp::kNotIn;
    } else {
      break;
    }
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    if (!cmp) cmp = std::make_unique<CompareExpr>(line, std::move(first));
    cmp->Include(operand);
    cmp->rest.emplace_back(op, std::move(operand));
    RETURN_IF_ERROR(CheckDepth(*cmp));
  }
  if (!cmp) return first;
  return ExprPtr(std::move(cmp));
}

Result<ExprPtr> Parser::ParseMath1() {
  return ParseBinaryLevel(&Parser::ParseConcat, {{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}});
}

Result<ExprPtr> Parser::ParseConcat() {
  return ParseBinaryLevel(&Parser::ParseMath2, {{"~", BinaryOp::kConcat}});
}

Result<ExprPtr> Parser::ParseMath2() {
  return ParseBinaryLevel(&Parser::ParsePow, {{"*", BinaryOp::kMul},
                                              {"/", BinaryOp::kDiv},
                                              {"//", BinaryOp::kFloorDiv},
                                              {"%", BinaryOp::kMod}});
}

Result<ExprPtr> Parser::ParsePow() {
  return ParseBinaryLevel(&Parser::ParseUnaryWithFilter, {{"**", BinaryOp::kPow}});
}

Result<ExprPtr> Parser::ParseUnary(bool with_filter) {
  const int line = Cur().line;
  ExprPtr node;
  const bool neg = IsOp("-");
  if (neg || IsOp("+")) {
    Next();
    NestingGuard guard(this);
    if (guard.exceeded()) return Fail(line, "too many chained unary operators");
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    node =
        std::make_unique<UnaryExpr>(line, neg ? UnaryOp::kNeg : UnaryOp::kPos, std::move(operand));
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) {
    ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
  }
  return node;
}

Result<ExprPtr> Parser::ParsePrimary() {
  const Token& t = Cur();
  const int line = t.line;
  switch (t.type) {
    case TokenType::kName: {
      const std::string name = t.value;
      Next();
      if (name == "true" || name == "True") {
        return ExprPtr(std::make_unique<LiteralExpr>(line, Value::Bool(true)));
      }
      if (name == "false" || name == "False") {
        return ExprPtr(std::make_unique<LiteralExpr>(line, Value::Bool(false)));
      }
      if (name == "none" || name == "None") {
        return ExprPtr(std::make_unique<LiteralExpr>(line, Value::None()));
      }
      if (!macro_usage_.empty()) {
        if (name == "varargs") macro_usage_.back().varargs = true;
        if (name == "kwargs") macro_usage_.back().kwargs = true;
        if (name == "caller") macro_usage_.back().caller = true;
      }
      return ExprPtr(std::make_unique<NameExpr>(line, name));
    }
    case TokenType::kString: {
      // Adjacent string literals concatenate, as in Python.
      std::string s;
      while (Cur().type == TokenType::kString) {
        s += Cur().value;
        Next();
      }
      return ExprPtr(std::make_unique<LiteralExpr>(line, Value::String(std::move(s))));
    }
    case TokenType::kInteger: {
      const int64_t v = t.int_value;
      Next();
      return ExprPtr(std::make_unique<LiteralExpr>(line, Value::Int(v)));
    }
    case TokenType::kFloat: {
      const double v = t.float_value;
      Next();
      return ExprPtr(std::make_unique<LiteralExpr>(line, Value::Float(v)));
    }
    case TokenType::kOperator: {
      if (t.value != "(" && t.value != "[" && t.value != "{") break;
      NestingGuard guard(this);
      if (guard.exceeded()) {
        return Fail(line, fmt::format("brackets nested more than {} levels deep", kMaxNesting));
      }
      if (t.value == "(") {
        Next();
        ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
        RETURN_IF_ERROR(ExpectOp(")"));
        return e;
      }
      if (t.value == "[") return ParseList();
      return ParseDict();
    }
    default:
      break;
  }
  return Fail(line, fmt::format("unexpected {}", DescribeToken(t)));
}

Result<ExprPtr> Parser::ParseList() {
  auto list = std::make_unique<SequenceExpr>(ExprKind::kList, Cur().line);
  Next();
  while (!IsOp("]")) {
    if (!list->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("]")) break;
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
    list->Include(item);
    list->items.push_back(std::move(item));
  }
  Next();
  RETURN_IF_ERROR(CheckDepth(*list));
  return ExprPtr(std::move(list));
}

Result<ExprPtr> Parser::ParseDict() {
  auto dict = std::make_unique<DictExpr>(Cur().line);
  Next();
  while (!IsOp("}")) {
    if (!dict->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("}")) break;
    ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
    RETURN_IF_ERROR(ExpectOp(":"));
    ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
    dict->Include(key);
    dict->Include(value);
    dict->items.emplace_back(std::move(key), std::move(value));
  }
  Next();
  RETURN_IF_ERROR(CheckDepth(*dict));
  return ExprPtr(std::move(dict));
}

Result<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(".") || IsOp("[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
    RETURN_IF_ERROR(CheckDepth(*node));
  }
}

Result<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
    } else if (IsName("is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
    RETURN_IF_ERROR(CheckDepth(*node));
  }
}

Result<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  const int line = Cur().line;
  if (SkipOp(".")) {
    if (Cur().type == TokenType::kName) {
      std::string name = Cur().value;
      Next();
      return ExprPtr(std::make_unique<GetAttrExpr>(line, std::move(node), std::move(name)));
    }
    if (Cur().type == TokenType::kInteger) {
      auto index = std::make_unique<LiteralExpr>(line, Value::Int(Cur().int_value));
      Next();
      return ExprPtr(std::make_unique<GetItemExpr>(line, std::move(node), std::move(index)));
    }
    return Unexpected("a name or number after '.'");
  }
  Next();  // [
  NestingGuard guard(this);
  if (guard.exceeded()) {
    return Fail(line, fmt::format("brackets nested more than {} levels deep", kMaxNesting));
  }
  std::vector<ExprPtr> args;
  while (!IsOp("]")) {
    if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
    ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
    args.push_back(std::move(arg));
  }
  Next();
  if (args.empty()) return Fail(line, "empty subscript '[]'");
  ExprPtr index;
  if (args.size() == 1) {
    index = std::move(args[0]);
  } else {
    auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
    for (auto& a : args) {
      tuple->Include(a);
      tuple->items.push_back(std::move(a));
    }
    index = std::move(tuple);
  }
  return ExprPtr(std::make_unique<GetItemExpr>(line, std::move(node), std::move(index)));
}

Result<ExprPtr> Parser::ParseSubscribed() {
  const int line = Cur().line;
  ExprPtr start;
  if (!IsOp(":")) {
    ASSIGN_OR_RETURN(start, ParseExpression(true));
    if (!IsOp(":")) return start;
  }
  Next();  // first ':'
  auto slice = std::make_unique<SliceExpr>(line);
  slice->start = std::move(start);
  if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
    ASSIGN_OR_RETURN(slice->stop, ParseExpression(true));
  }
  if (SkipOp(":")) {
    if (!IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(slice->step, ParseExpression(true));
    }
  }
  slice->Include(slice->start);
  slice->Include(slice->stop);
  slice->Include(slice->step);
  return ExprPtr(std::move(slice));
}

Status Parser::ParseCallArgs(Arguments* args, Expr* owner) {
  const int line = Cur().line;
  NestingGuard guard(this);
  if (guard.exceeded()) {
    return Fail(line, fmt::format("brackets nested more than {} levels deep", kMaxNesting));
  }
  RETURN_IF_ERROR(ExpectOp("("));
  bool first = true;
  while (!IsOp(")")) {
    if (!first) {
      RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;  // trailing comma
    }
    first = false;
    if (IsOp("*") || IsOp("**")) {
      return Fail(line,
                  "*args and **kwargs in calls are not supported by this Jinja "
                  "interpreter");
    }
    if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().value == "=") {
      std::string key = Cur().value;
      Next();
      Next();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      owner->Include(value);
      args->keyword.emplace_back(std::move(key), std::move(value));
    } else {
      if (!args->keyword.empty()) {
        return Fail(line, "positional argument follows keyword argument");
      }
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      owner->Include(value);
      args->positional.push_back(std::move(value));
    }
  }
  Next();
  return OkStatus();
}

Result<ExprPtr> Parser::ParseCall(ExprPtr callee) {
  auto call = std::make_unique<CallExpr>(Cur().line, std::move(callee));
  RETURN_IF_ERROR(ParseCallArgs(&call->args, call.get()));
  return ExprPtr(std::move(call));
}

Result<std::string> Parser::ParseDottedName() {
  ASSIGN_OR_RETURN(std::string name, ExpectName());
  while (SkipOp(".")) {
    ASSIGN_OR_RETURN(std::string part, ExpectName());
    name += "." + part;
  }
  return name;
}

// `|name(args)|name2...`; with start_inline the first `|` is absent ({% filter name %}).
Result<ExprPtr> Parser::ParseFilter(ExprPtr node, bool start_inline) {
  while (IsOp("|") || start_inline) {
    if (!start_inline) Next();
    start_inline = false;
    const int line = Cur().line;
    ASSIGN_OR_RETURN(std::string name, ParseDottedName());
    const FilterFn fn = FindFilter(name);
    if (fn == nullptr && IsUnsupportedJinjaFilter(name)) {
      return Fail(line,
                  fmt::format("the '{}' filter is not supported by this Jinja interpreter", name));
    }
    if (fn == nullptr) return Fail(line, fmt::format("no filter named '{}'", name));
    auto filter = std::make_unique<FilterExpr>(line, std::move(node), std::move(name), fn);
    if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(&filter->args, filter.get()));
    node = std::move(filter);
    RETURN_IF_ERROR(CheckDepth(*node));
  }
  return node;
}

Result<ExprPtr> Parser::ParseTest(ExprPtr node) {
  Next();  // is
  const bool negated = SkipName("not");
  const int line = Cur().line;
  ASSIGN_OR_RETURN(std::string name, ParseDottedName());
  const TestFn fn = FindTest(name);
  if (fn == nullptr) return Fail(line, fmt::format("no test named '{}'", name));
  auto test = std::make_unique<TestExpr>(line, std::move(node), std::move(name), fn, negated);
  const Token& t = Cur();
  if (IsOp("(")) {
    RETURN_IF_ERROR(ParseCallArgs(&test->args, test.get()));
  } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
              t.type == TokenType::kInteger || t.type == TokenType::kFloat || IsOp("[") ||
              IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and")) {
    // `x is divisibleby 3`, `x is sameas false`: one argument without parentheses.
    if (IsName("is")) return Fail(t.line, "you cannot chain multiple tests with 'is'");
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    test->Include(arg);
    test->args.positional.push_back(std::move(arg));
  }
  return ExprPtr(std::move(test));
}

}  // namespace moeserve::jinja::internal
