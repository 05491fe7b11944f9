// What filters, tests, methods and global functions may ask of the template being rendered. The
// interpreter implements it; builtins depend on this interface rather than on the interpreter
// that dispatches to them, so the two do not include each other.
#pragma once

#include <string_view>

#include "core/status.h"
#include "jinja/value.h"

namespace moeserve::jinja {

class Evaluator {
 public:
  // Calls a macro, builtin or bound method.
  virtual Result<Value> Call(const Value& callee, CallArgs args) = 0;
  // Jinja's environment.getattr / getitem: attribute first or item first, Undefined when
  // neither exists, an error only when `object` itself is Undefined.
  virtual Result<Value> GetAttr(const Value& object, std::string_view name) = 0;
  virtual Result<Value> GetItem(const Value& object, const Value& key) = 0;
  // Applies a filter or test by name (for map, select, reject, ...).
  virtual Result<Value> ApplyFilter(std::string_view name, const Value& input, CallArgs args) = 0;
  virtual Result<bool> ApplyTest(std::string_view name, const Value& input, CallArgs args) = 0;

 protected:
  ~Evaluator() = default;
};

}  // namespace moeserve::jinja
