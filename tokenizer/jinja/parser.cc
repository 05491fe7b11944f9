#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "tokenizer/jinja/builtins.h"

namespace moeserve::tokenizer::jinja {
namespace {

// Nesting limits, far above any real template, that keep the recursive-descent parser, the
// recursive evaluator and the tree's destructor within a small, fixed amount of stack.
constexpr int kMaxNesting = 100;     // brackets, chained unary operators / else-ifs, blocks
constexpr int kMaxExprDepth = 256;   // height of one expression tree

// Names of the tags Jinja knows but this interpreter does not support: chat templates are one
// self-contained string, and transformers enables no extension that would make them useful.
constexpr std::string_view kUnsupportedTags[] = {"block",  "extends", "include", "import",
                                                 "from",   "autoescape", "do", "trans",
                                                 "pluralize", "endblock"};

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

  // ---- statements ------------------------------------------------------------------------

  // Parses until a block whose tag is one of `end_tags` (left unconsumed, current token is its
  // name) or, with no end tags, until the end of the template.
  Result<Body> Subparse(std::initializer_list<std::string_view> end_tags) {
    Body body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kData:
          body.push_back(std::make_unique<TextStmt>(t.line, t.value));
          Next();
          break;
        case TokenType::kVariableBegin: {
          const int line = t.line;
          Next();
          ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, false));
          if (Cur().type != TokenType::kVariableEnd) {
            return Unexpected("end of print statement '}}'");
          }
          Next();
          body.push_back(std::make_unique<OutputStmt>(line, std::move(e)));
          break;
        }
        case TokenType::kBlockBegin: {
          Next();
          if (Cur().type == TokenType::kName &&
              std::find(end_tags.begin(), end_tags.end(), Cur().value) != end_tags.end()) {
            return body;
          }
          ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
          RETURN_IF_ERROR(ExpectBlockEnd());
          if (stmt) body.push_back(std::move(stmt));
          break;
        }
        case TokenType::kEof:
          if (end_tags.size() != 0) return UnclosedBlockError(end_tags);
          return body;
        default:
          return Fail(t.line, fmt::format("unexpected {}", DescribeToken(t)));
      }
    }
  }

  Status UnclosedBlockError(std::initializer_list<std::string_view> end_tags) const {
    std::string wanted;
    for (std::string_view tag : end_tags) {
      wanted += wanted.empty() ? "" : " or ";
      wanted += fmt::format("'{}'", tag);
    }
    const auto& [tag, line] = open_blocks_.back();
    return Fail(Cur().line,
                fmt::format("unexpected end of template: the '{}' block opened at line {} is "
                            "never closed (looking for {})",
                            tag, line, wanted));
  }

  // `%}`, the body up to one of end_tags, and the end tag's name (consumed; its `%}` is not).
  Result<Body> ParseBlockBody(std::initializer_list<std::string_view> end_tags,
                              std::string* end_tag = nullptr) {
    RETURN_IF_ERROR(ExpectBlockEnd());
    ASSIGN_OR_RETURN(Body body, Subparse(end_tags));
    if (end_tag != nullptr) *end_tag = Cur().value;
    Next();
    return body;
  }

  Result<StmtPtr> ParseStatement() {
    NestingGuard guard(this);
    if (guard.exceeded()) {
      return Fail(Cur().line, fmt::format("blocks nested more than {} levels deep", kMaxNesting));
    }
    if (Cur().type != TokenType::kName) return Unexpected("a tag name");
    const std::string tag = Cur().value;
    const int line = Cur().line;
    open_blocks_.emplace_back(tag, line);
    Result<StmtPtr> stmt = ParseTag(tag, line);
    open_blocks_.pop_back();
    return stmt;
  }

  Result<StmtPtr> ParseTag(const std::string& tag, int line) {
    if (tag == "if") return ParseIf(line);
    if (tag == "for") return ParseFor(line);
    if (tag == "set") return ParseSet(line);
    if (tag == "macro") return ParseMacro(line);
    if (tag == "call") return ParseCallBlock(line);
    if (tag == "filter") return ParseFilterBlock(line);
    if (tag == "with") return ParseWith(line);
    if (tag == "print") {
      Next();
      ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, false));
      return StmtPtr(std::make_unique<OutputStmt>(line, std::move(e)));
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Fail(line, fmt::format("'{}' outside of a for loop", tag));
      Next();
      return StmtPtr(std::make_unique<LoopControlStmt>(
          tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line));
    }
    if (tag == "generation") {
      Next();
      auto stmt = std::make_unique<GenerationStmt>(line);
      ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endgeneration"}));
      return StmtPtr(std::move(stmt));
    }
    for (std::string_view unsupported : kUnsupportedTags) {
      if (tag == unsupported) {
        return Fail(line, fmt::format("the '{}' tag is not supported by this Jinja interpreter",
                                      tag));
      }
    }
    // An end tag of an enclosing block here means blocks are closed in the wrong order.
    std::string message = fmt::format("unknown tag '{}'", tag);
    if (open_blocks_.size() >= 2) {
      const auto& [outer, outer_line] = open_blocks_[open_blocks_.size() - 2];
      message += fmt::format(" (the innermost open block is '{}' from line {})", outer,
                             outer_line);
    }
    return Fail(line, message);
  }

  Result<StmtPtr> ParseIf(int line) {
    auto stmt = std::make_unique<IfStmt>(line);
    Next();
    while (true) {
      ASSIGN_OR_RETURN(ExprPtr test, ParseTuple(false, false, {}, false));
      std::string end;
      ASSIGN_OR_RETURN(Body body, ParseBlockBody({"elif", "else", "endif"}, &end));
      stmt->branches.emplace_back(std::move(test), std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        ASSIGN_OR_RETURN(stmt->else_body, ParseBlockBody({"endif"}));
      }
      return StmtPtr(std::move(stmt));
    }
  }

  Result<StmtPtr> ParseFor(int line) {
    auto stmt = std::make_unique<ForStmt>(line);
    Next();
    ASSIGN_OR_RETURN(stmt->target, ParseAssignTarget(/*with_namespace=*/false, {"in"}));
    if (!SkipName("in")) return Unexpected("'in'");
    ASSIGN_OR_RETURN(stmt->iter, ParseTuple(false, false, {"recursive"}, false));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(stmt->filter, ParseExpression(true));
    }
    if (IsName("recursive")) {
      return Fail(Cur().line, "recursive for loops are not supported by this Jinja interpreter");
    }
    ++loop_depth_;
    std::string end;
    Result<Body> body = ParseBlockBody({"endfor", "else"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    stmt->body = std::move(body).value();
    if (end == "else") {
      ASSIGN_OR_RETURN(stmt->else_body, ParseBlockBody({"endfor"}));
    }
    return StmtPtr(std::move(stmt));
  }

  Result<StmtPtr> ParseSet(int line) {
    Next();
    ASSIGN_OR_RETURN(Target target, ParseAssignTarget(/*with_namespace=*/true, {}));
    if (SkipOp("=")) {
      auto stmt = std::make_unique<SetStmt>(line);
      stmt->target = std::move(target);
      ASSIGN_OR_RETURN(stmt->value, ParseTuple(false, true, {}, false));
      return StmtPtr(std::move(stmt));
    }
    auto stmt = std::make_unique<SetBlockStmt>(line);
    stmt->target = std::move(target);
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(stmt->filter, ParseFilter(nullptr, false));
    }
    ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endset"}));
    return StmtPtr(std::move(stmt));
  }

  // (name, name=default, ...) of a macro or call block.
  Status ParseSignature(MacroStmt* macro) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool have_default = false;
    while (!IsOp(")")) {
      if (!macro->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      ExprPtr default_value;
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(default_value, ParseExpression(true));
        have_default = true;
      } else if (have_default) {
        return Fail(Cur().line, "non-default argument follows default argument");
      }
      macro->params.emplace_back(std::move(name), std::move(default_value));
    }
    Next();
    return OkStatus();
  }

  // The body of a macro or call block, recording which special names it uses.
  Status ParseMacroBody(MacroStmt* macro, std::string_view end_tag) {
    macro_usage_.emplace_back();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // `break` in a macro cannot leave a loop around the macro's definition
    Result<Body> body = ParseBlockBody({end_tag});
    loop_depth_ = saved_loop_depth;
    const MacroUsage usage = macro_usage_.back();
    macro_usage_.pop_back();
    if (!body.ok()) return body.status();
    macro->body = std::move(body).value();
    macro->catch_varargs = usage.varargs;
    macro->catch_kwargs = usage.kwargs;
    macro->uses_caller = usage.caller;
    return OkStatus();
  }

  Result<StmtPtr> ParseMacro(int line) {
    auto stmt = std::make_unique<MacroStmt>(line);
    Next();
    ASSIGN_OR_RETURN(stmt->name, ExpectName());
    RETURN_IF_ERROR(ParseSignature(stmt.get()));
    RETURN_IF_ERROR(ParseMacroBody(stmt.get(), "endmacro"));
    return StmtPtr(std::move(stmt));
  }

  Result<StmtPtr> ParseCallBlock(int line) {
    auto stmt = std::make_unique<CallBlockStmt>(line);
    Next();
    stmt->caller.name = "caller";
    if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(&stmt->caller));
    ASSIGN_OR_RETURN(stmt->call, ParseExpression(true));
    if (stmt->call->kind != ExprKind::kCall) return Fail(line, "expected a call after 'call'");
    RETURN_IF_ERROR(ParseMacroBody(&stmt->caller, "endcall"));
    return StmtPtr(std::move(stmt));
  }

  Result<StmtPtr> ParseFilterBlock(int line) {
    auto stmt = std::make_unique<FilterBlockStmt>(line);
    Next();
    ASSIGN_OR_RETURN(stmt->filter, ParseFilter(nullptr, true));
    ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endfilter"}));
    return StmtPtr(std::move(stmt));
  }

  Result<StmtPtr> ParseWith(int line) {
    auto stmt = std::make_unique<WithStmt>(line);
    Next();
    while (Cur().type != TokenType::kBlockEnd) {
      if (!stmt->assignments.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(Target target, ParseAssignTarget(false, {}));
      RETURN_IF_ERROR(ExpectOp("="));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      stmt->assignments.emplace_back(std::move(target), std::move(value));
    }
    ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endwith"}));
    return StmtPtr(std::move(stmt));
  }

  // ---- assignment targets ----------------------------------------------------------------

  Result<Target> ParseTargetPrimary(bool with_namespace) {
    NestingGuard guard(this);
    if (guard.exceeded()) return Fail(Cur().line, "assignment target nested too deeply");
    const int line = Cur().line;
    if (SkipOp("(")) {
      ASSIGN_OR_RETURN(Target t, ParseTargetTuple(with_namespace, {}, true));
      RETURN_IF_ERROR(ExpectOp(")"));
      return t;
    }
    if (Cur().type != TokenType::kName) {
      return Fail(line, fmt::format("can't assign to {}", DescribeToken(Cur())));
    }
    Target t;
    t.name = Cur().value;
    if (t.name == "true" || t.name == "false" || t.name == "none" || t.name == "True" ||
        t.name == "False" || t.name == "None") {
      return Fail(line, fmt::format("can't assign to the constant '{}'", t.name));
    }
    Next();
    if (with_namespace && IsOp(".")) {
      Next();
      t.kind = Target::Kind::kNamespaceAttr;
      ASSIGN_OR_RETURN(t.attr, ExpectName());
    }
    return t;
  }

  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || IsOp(")")) {
      return true;
    }
    if (t.type == TokenType::kName) {
      return std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
    }
    return false;
  }

  Result<Target> ParseTargetTuple(bool with_namespace,
                                  std::initializer_list<std::string_view> extra_end,
                                  bool explicit_parens) {
    Target tuple;
    tuple.kind = Target::Kind::kTuple;
    bool is_tuple = false;
    while (true) {
      if (!tuple.items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      ASSIGN_OR_RETURN(Target item, ParseTargetPrimary(with_namespace));
      tuple.items.push_back(std::move(item));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (tuple.items.size() == 1) return std::move(tuple.items[0]);
      if (!explicit_parens) return Unexpected("an assignment target");
    }
    return tuple;
  }

  Result<Target> ParseAssignTarget(bool with_namespace,
                                   std::initializer_list<std::string_view> extra_end) {
    return ParseTargetTuple(with_namespace, extra_end, false);
  }

  // ---- expressions -----------------------------------------------------------------------

  // jinja2's parse_tuple: one expression, or a comma-separated tuple without parentheses.
  Result<ExprPtr> ParseTuple(bool simplified, bool with_condexpr,
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

  Result<ExprPtr> ParseExpression(bool with_condexpr) {
    if (with_condexpr) return ParseCondExpr();
    return ParseOr();
  }

  Result<ExprPtr> ParseCondExpr() {
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
      expr = std::make_unique<CondExpr>(line, std::move(test), std::move(expr),
                                        std::move(else_expr));
      RETURN_IF_ERROR(CheckDepth(*expr));
    }
    return expr;
  }

  Result<ExprPtr> ParseOr() {
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

  Result<ExprPtr> ParseAnd() {
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

  Result<ExprPtr> ParseNot() {
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

  Result<ExprPtr> ParseCompare() {
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

  // One left-associative level of binary operators.
  template <typename Sub>
  Result<ExprPtr> ParseBinaryLevel(Sub sub,
                                   std::initializer_list<std::pair<std::string_view, BinaryOp>> ops) {
    ASSIGN_OR_RETURN(ExprPtr left, (this->*sub)());
    while (true) {
      const auto* match = std::find_if(ops.begin(), ops.end(),
                                       [&](const auto& o) { return IsOp(o.first); });
      if (match == ops.end()) return left;
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, (this->*sub)());
      left = std::make_unique<BinaryExpr>(line, match->second, std::move(left), std::move(right));
      RETURN_IF_ERROR(CheckDepth(*left));
    }
  }

  Result<ExprPtr> ParseMath1() {
    return ParseBinaryLevel(&Parser::ParseConcat,
                            {{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}});
  }
  Result<ExprPtr> ParseConcat() {
    return ParseBinaryLevel(&Parser::ParseMath2, {{"~", BinaryOp::kConcat}});
  }
  Result<ExprPtr> ParseMath2() {
    return ParseBinaryLevel(&Parser::ParsePow, {{"*", BinaryOp::kMul},
                                                {"/", BinaryOp::kDiv},
                                                {"//", BinaryOp::kFloorDiv},
                                                {"%", BinaryOp::kMod}});
  }
  Result<ExprPtr> ParsePow() {
    return ParseBinaryLevel(&Parser::ParseUnaryWithFilter, {{"**", BinaryOp::kPow}});
  }
  Result<ExprPtr> ParseUnaryWithFilter() { return ParseUnary(true); }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    const int line = Cur().line;
    ExprPtr node;
    const bool neg = IsOp("-");
    if (neg || IsOp("+")) {
      Next();
      NestingGuard guard(this);
      if (guard.exceeded()) return Fail(line, "too many chained unary operators");
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = std::make_unique<UnaryExpr>(line, neg ? UnaryOp::kNeg : UnaryOp::kPos,
                                         std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> ParsePrimary() {
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

  Result<ExprPtr> ParseList() {
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

  Result<ExprPtr> ParseDict() {
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

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
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

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
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

  Result<ExprPtr> ParseSubscript(ExprPtr node) {
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

  Result<ExprPtr> ParseSubscribed() {
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

  Status ParseCallArgs(Arguments* args, Expr* owner) {
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
        return Fail(line, "*args and **kwargs in calls are not supported by this Jinja "
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

  Result<ExprPtr> ParseCall(ExprPtr callee) {
    auto call = std::make_unique<CallExpr>(Cur().line, std::move(callee));
    RETURN_IF_ERROR(ParseCallArgs(&call->args, call.get()));
    return ExprPtr(std::move(call));
  }

  Result<std::string> ParseDottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (SkipOp(".")) {
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    return name;
  }

  // `|name(args)|name2...`; with start_inline the first `|` is absent ({% filter name %}).
  Result<ExprPtr> ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const int line = Cur().line;
      ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      const FilterFn fn = FindFilter(name);
      if (fn == nullptr) return Fail(line, fmt::format("no filter named '{}'", name));
      auto filter = std::make_unique<FilterExpr>(line, std::move(node), std::move(name), fn);
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(&filter->args, filter.get()));
      node = std::move(filter);
      RETURN_IF_ERROR(CheckDepth(*node));
    }
    return node;
  }

  Result<ExprPtr> ParseTest(ExprPtr node) {
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

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
  std::vector<MacroUsage> macro_usage_;
  std::vector<std::pair<std::string, int>> open_blocks_;  // tag and line, innermost last
};

}  // namespace

Result<Body> ParseTemplate(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).Run();
}

}  // namespace moeserve::tokenizer::jinja
