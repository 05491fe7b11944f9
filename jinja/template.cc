#include "jinja/template.h"

#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace moeserve::jinja {

Result<Template> Template::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  ASSIGN_OR_RETURN(Body body, ParseTemplate(std::move(tokens)));
  return Template(std::make_shared<const Body>(std::move(body)));
}

Result<std::string> Template::Render(const Context& context) const {
  Interpreter interpreter;
  return interpreter.Render(*body_, context);
}

}  // namespace moeserve::jinja
