#include "jinja/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>

#include "jinja/parser_internal.h"

namespace moeserve::jinja {
namespace internal {
namespace {

// Names of the tags Jinja knows but this interpreter does not support: chat templates are one
// self-contained string, and transformers enables no extension that would make them useful.
constexpr std::string_view kUnsupportedTags[] = {"block",     "extends",    "include", "import",
                                                 "from",      "autoescape", "do",      "trans",
                                                 "pluralize", "endblock"};

}  // namespace

// Parses until a block whose tag is one of `end_tags` (left unconsumed, current token is its
// name) or, with no end tags, until the end of the template.
Result<Body> Parser::Subparse(std::initializer_list<std::string_view> end_tags) {
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

Status Parser::UnclosedBlockError(std::initializer_list<std::string_view> end_tags) const {
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
Result<Body> Parser::ParseBlockBody(std::initializer_list<std::string_view> end_tags,
                                    std::string* end_tag) {
  RETURN_IF_ERROR(ExpectBlockEnd());
  ASSIGN_OR_RETURN(Body body, Subparse(end_tags));
  if (end_tag != nullptr) *end_tag = Cur().value;
  Next();
  return body;
}

Result<StmtPtr> Parser::ParseStatement() {
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

Result<StmtPtr> Parser::ParseTag(const std::string& tag, int line) {
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
      return Fail(line,
                  fmt::format("the '{}' tag is not supported by this Jinja interpreter", tag));
    }
  }
  // An end tag of an enclosing block here means blocks are closed in the wrong order.
  std::string message = fmt::format("unknown tag '{}'", tag);
  if (open_blocks_.size() >= 2) {
    const auto& [outer, outer_line] = open_blocks_[open_blocks_.size() - 2];
    message += fmt::format(" (the innermost open block is '{}' from line {})", outer, outer_line);
  }
  return Fail(line, message);
}

Result<StmtPtr> Parser::ParseIf(int line) {
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

Result<StmtPtr> Parser::ParseFor(int line) {
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

Result<StmtPtr> Parser::ParseSet(int line) {
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
Status Parser::ParseSignature(MacroStmt* macro) {
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
Status Parser::ParseMacroBody(MacroStmt* macro, std::string_view end_tag) {
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

Result<StmtPtr> Parser::ParseMacro(int line) {
  auto stmt = std::make_unique<MacroStmt>(line);
  Next();
  ASSIGN_OR_RETURN(stmt->name, ExpectName());
  RETURN_IF_ERROR(ParseSignature(stmt.get()));
  RETURN_IF_ERROR(ParseMacroBody(stmt.get(), "endmacro"));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::ParseCallBlock(int line) {
  auto stmt = std::make_unique<CallBlockStmt>(line);
  Next();
  stmt->caller.name = "caller";
  if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(&stmt->caller));
  ASSIGN_OR_RETURN(stmt->call, ParseExpression(true));
  if (stmt->call->kind != ExprKind::kCall) return Fail(line, "expected a call after 'call'");
  RETURN_IF_ERROR(ParseMacroBody(&stmt->caller, "endcall"));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::ParseFilterBlock(int line) {
  auto stmt = std::make_unique<FilterBlockStmt>(line);
  Next();
  ASSIGN_OR_RETURN(stmt->filter, ParseFilter(nullptr, true));
  ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endfilter"}));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::ParseWith(int line) {
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

Result<Target> Parser::ParseTargetPrimary(bool with_namespace) {
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

bool Parser::IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
  const Token& t = Cur();
  if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || IsOp(")")) {
    return true;
  }
  if (t.type == TokenType::kName) {
    return std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
  }
  return false;
}

Result<Target> Parser::ParseTargetTuple(bool with_namespace,
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

Result<Target> Parser::ParseAssignTarget(bool with_namespace,
                                         std::initializer_list<std::string_view> extra_end) {
  return ParseTargetTuple(with_namespace, extra_end, false);
}

}  // namespace internal

Result<Body> ParseTemplate(std::vector<Token> tokens) {
  return internal::Parser(std::move(tokens)).Run();
}

}  // namespace moeserve::jinja
