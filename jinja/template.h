// A parsed Jinja template: the entry point of the interpreter. Parse once, render many times;
// a Template is immutable and cheap to copy, and Render is safe to call from several threads.
//
// Semantics are those of transformers' chat-template environment (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the loopcontrols extension,
// transformers' tojson, raise_exception and strftime_now, autoescaping off).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace moeserve::jinja {

class Template {
 public:
  // Syntax errors, unknown tags/filters/tests and unsupported constructs fail here, naming the
  // line and the construct.
  static Result<Template> Parse(std::string_view source);

  // Template variables in order; a later entry with the same name wins.
  using Context = std::vector<std::pair<std::string, Value>>;
  Result<std::string> Render(const Context& context) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace moeserve::jinja
