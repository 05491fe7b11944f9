// Jinja's built-in filters, tests and global functions, and the methods of str, dict and list
// values that templates call (message.content.startswith(...), tool.items(), ...).
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace moeserve::jinja {

// nullptr when there is no such filter / test.
FilterFn FindFilter(std::string_view name);
// Jinja built-in filters this interpreter leaves out (groupby, urlize, wordwrap, ...): templates
// using them are rejected with a message saying so rather than "no filter named".
bool IsUnsupportedJinjaFilter(std::string_view name);
TestFn FindTest(std::string_view name);

// A global function: range, dict, namespace (Jinja's) and raise_exception, strftime_now
// (transformers'). nullopt for any other name; Jinja's cycler, joiner and lipsum are not provided,
// so calling them fails as calling an undefined name.
std::optional<Value> FindGlobal(std::string_view name);

// `receiver.name` for a str, dict or list receiver when `name` is one of its methods: the bound
// method, or an Undefined whose message says why the method cannot be used (mutating methods are
// forbidden by transformers' immutable sandbox; a few Python methods are not implemented).
// nullopt when `name` is no method of the receiver's type.
std::optional<Value> FindMethod(const Value& receiver, std::string_view name);

// Binds call arguments to named parameters the way Python does: positional first, then by
// keyword. Parameters not given stay nullopt; fewer than `required` given, unknown keywords, too
// many positionals or duplicates are errors that name `function`.
Result<std::vector<std::optional<Value>>> BindArgs(std::string_view function, CallArgs& args,
                                                   std::initializer_list<std::string_view> params,
                                                   size_t required);

}  // namespace moeserve::jinja
