// The recursive-descent parser of parser.h, shared by parser.cc (statements, assignment targets)
// and parse_expression.cc (expressions). Internal to the interpreter.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace moeserve::jinja::internal {

// Nesting limits, far above any real template, that keep the recursive-descent parser, the
// recursive evaluator and the tree's destructor within a small, fixed amount of stack.
inline constexpr int kMaxNesting = 100;    // brackets, chained unary operators / else-ifs, blocks
inline constexpr int kMaxExprDepth = 256;  // height of one expression tree

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<Body> Run() {
    ASSIGN_OR_RETURN(Body body, Subparse({}));
    return body;
  }

 private:
  // Counts one level of nesting for the lifetime of a parse function.
  class NestingGuard {
   public:
    explicit NestingGuard(Parser* p) : p_(p) { ++p_->nesting_; }
    ~NestingGuard() { --p_->nesting_; }
    bool exceeded() const { return p_->nesting_ > kMaxNesting; }

   private:
    Parser* p_;
  };

  struct MacroUsage {
    bool varargs = false, kwargs = false, caller = false;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  Status Fail(int line, std::string_view message) const {
    return InvalidArgument("template syntax error at line {}: {}", line, message);
  }
  Status Unexpected(std::string_view expected) const {
    return Fail(Cur().line, fmt::format("expected {}, got {}", expected, DescribeToken(Cur())));
  }
  Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Unexpected(fmt::format("'{}'", op));
    return OkStatus();
  }
  Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Unexpected("end of statement block '%}'");
    Next();
    return OkStatus();
  }
  Result<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string name = Cur().value;
    Next();
    return name;
  }
  Status CheckDepth(const Expr& e) const {
    if (e.depth > kMaxExprDepth) {
      return Fail(e.line, fmt::format("expression nested more than {} levels deep", kMaxExprDepth));
    }
    return OkStatus();
  }

  // ---- statements (parser.cc) ------------------------------------------------------------

  // Parses until a block whose tag is one of `end_tags` (left unconsumed, current token is its
  // name) or, with no end tags, until the end of the template.
  Result<Body> Subparse(std::initializer_list<std::string_view> end_tags);

  Status UnclosedBlockError(std::initializer_list<std::string_view> end_tags) const;

  // `%}`, the body up to one of end_tags, and the end tag's name (consumed; its `%}` is not).
  Result<Body> ParseBlockBody(std::initializer_list<std::string_view> end_tags,
                              std::string* end_tag = nullptr);

  Result<StmtPtr> ParseStatement();

  Result<StmtPtr> ParseTag(const std::string& tag, int line);

  Result<StmtPtr> ParseIf(int line);

  Result<StmtPtr> ParseFor(int line);

  Result<StmtPtr> ParseSet(int line);

  // (name, name=default, ...) of a macro or call block.
  Status ParseSignature(MacroStmt* macro);

  // The body of a macro or call block, recording which special names it uses.
  Status ParseMacroBody(MacroStmt* macro, std::string_view end_tag);

  Result<StmtPtr> ParseMacro(int line);

  Result<StmtPtr> ParseCallBlock(int line);

  Result<StmtPtr> ParseFilterBlock(int line);

  Result<StmtPtr> ParseWith(int line);

  Result<Target> ParseTargetPrimary(bool with_namespace);

  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const;

  Result<Target> ParseTargetTuple(bool with_namespace,
                                  std::initializer_list<std::string_view> extra_end,
                                  bool explicit_parens);

  Result<Target> ParseAssignTarget(bool with_namespace,
                                   std::initializer_list<std::string_view> extra_end);

  // ---- expressions (parse_expression.cc) ---------------------------------------------------

  // jinja2's parse_tuple: one expression, or a comma-separated tuple without parentheses.
  Result<ExprPtr> ParseTuple(bool simplified, bool with_condexpr,
                             std::initializer_list<std::string_view> extra_end,
                             bool explicit_parens);

  Result<ExprPtr> ParseExpression(bool with_condexpr);

  Result<ExprPtr> ParseCondExpr();

  Result<ExprPtr> ParseOr();

  Result<ExprPtr> ParseAnd();

  Result<ExprPtr> ParseNot();

  Result<ExprPtr> ParseCompare();

  // One left-associative level of binary operators.
  template <typename Sub>
  Result<ExprPtr> ParseBinaryLevel(
      Sub sub, std::initializer_list<std::pair<std::string_view, BinaryOp>> ops);

  Result<ExprPtr> ParseMath1();
  Result<ExprPtr> ParseConcat();
  Result<ExprPtr> ParseMath2();
  Result<ExprPtr> ParsePow();
  Result<ExprPtr> ParseUnaryWithFilter() { return ParseUnary(true); }

  Result<ExprPtr> ParseUnary(bool with_filter);

  Result<ExprPtr> ParsePrimary();

  Result<ExprPtr> ParseList();

  Result<ExprPtr> ParseDict();

  Result<ExprPtr> ParsePostfix(ExprPtr node);

  Result<ExprPtr> ParseFilterExpr(ExprPtr node);

  Result<ExprPtr> ParseSubscript(ExprPtr node);

  Result<ExprPtr> ParseSubscribed();

  Status ParseCallArgs(Arguments* args, Expr* owner);

  Result<ExprPtr> ParseCall(ExprPtr callee);

  Result<std::string> ParseDottedName();

  // `|name(args)|name2...`; with start_inline the first `|` is absent ({% filter name %}).
  Result<ExprPtr> ParseFilter(ExprPtr node, bool start_inline);

  Result<ExprPtr> ParseTest(ExprPtr node);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
  std::vector<MacroUsage> macro_usage_;
  std::vector<std::pair<std::string, int>> open_blocks_;  // tag and line, innermost last
};

}  // namespace moeserve::jinja::internal
