#include "structured/tool_calls_grammar.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "structured/json_schema.h"

namespace moeserve::structured {
namespace {

using Json = nlohmann::ordered_json;

void ShiftRules(Expr& e, int offset) {
  if (e.kind == Expr::Kind::kRule) e.rule += offset;
  for (Expr& c : e.children) ShiftRules(c, offset);
}

// Appends `from`'s rules to `into`; the index of from's root there.
int Embed(Grammar& into, Grammar from, const std::string& prefix) {
  const int offset = static_cast<int>(into.bodies.size());
  for (size_t i = 0; i < from.bodies.size(); ++i) {
    ShiftRules(from.bodies[i], offset);
    into.names.push_back(prefix + from.names[i]);
    into.bodies.push_back(std::move(from.bodies[i]));
  }
  return from.root + offset;
}

// The JSON Schema `schema` as a rule of `g`.
Result<Expr> SchemaRule(Grammar& g, const Json& schema, const std::string& where,
                        const Limits& limits) {
  Result<Grammar> sub = JsonSchemaGrammar(schema.dump(), limits);
  if (!sub.ok()) return sub.status().WithContext(where);
  return Ref(Embed(g, std::move(*sub), where + "."));
}

// A string parameter's text in the XML format: never "</" (its closing tag follows).
Expr XmlText() {
  const std::vector<CodeRange> not_lt = ComplementRanges({{'<', '<'}});
  const std::vector<CodeRange> not_slash_lt = ComplementRanges({{'/', '/'}, {'<', '<'}});
  return Star(Alt({Chars(not_lt), Seq({Lit("<"), Chars(not_slash_lt)})}));
}

// The first type a schema names (vLLM's reading of a parameter's type).
std::string TypeOf(const Json& schema) {
  if (!schema.is_object()) return "";
  const auto type = schema.find("type");
  if (type != schema.end() && type->is_string()) return type->get<std::string>();
  if (type != schema.end() && type->is_array()) {
    for (const Json& t : *type) {
      if (t.is_string() && t != "null") return t.get<std::string>();
    }
  }
  return "";
}

Result<Expr> XmlValue(Grammar& g, const Json& schema, const std::string& where,
                      const Limits& limits) {
  const std::string type = TypeOf(schema);
  const auto values = schema.is_object() ? schema.find("enum") : schema.end();
  const bool string_enum =
      values != schema.end() && values->is_array() && !values->empty() &&
      std::all_of(values->begin(), values->end(), [](const Json& v) { return v.is_string(); });
  if (string_enum) {
    std::vector<Expr> alts;
    for (const Json& v : *values) alts.push_back(Lit(v.get<std::string>()));
    return Alt(std::move(alts));
  }
  if (type == "string" || type.empty()) return XmlText();
  return SchemaRule(g, schema, where, limits);
}

// How a call starts: with its `<tool_call>`, or (opened) after it.
std::string Open(bool opened) { return opened ? "\n" : "<tool_call>\n"; }

Result<Expr> HermesCall(Grammar& g, const std::string& name, const Json& parameters, bool free,
                        bool opened, const std::string& where, const Limits& limits) {
  const Json any_object = {{"type", "object"}, {"additionalProperties", true}};
  ASSIGN_OR_RETURN(Expr arguments, SchemaRule(g, free ? any_object : parameters, where, limits));
  return Seq({Lit(Open(opened) + "{\"name\": " + Json(name).dump() + ", \"arguments\": "),
              std::move(arguments), Lit("}\n</tool_call>")});
}

// Any parameters: <parameter=NAME>\nTEXT\n</parameter>\n, as many as written.
Expr AnyXmlParameters() {
  const std::vector<CodeRange> name = ComplementRanges({{'\n', '\n'}, {'<', '<'}, {'>', '>'}});
  return Star(
      Seq({Lit("<parameter="), Plus(Chars(name)), Lit(">\n"), XmlText(), Lit("\n</parameter>\n")}));
}

Result<Expr> XmlCall(Grammar& g, const std::string& name, const Json& parameters, bool free,
                     bool opened, const std::string& where, const Limits& limits) {
  std::vector<Expr> parts = {Lit(Open(opened) + "<function=" + name + ">\n")};
  if (free) {
    parts.push_back(AnyXmlParameters());
    parts.push_back(Lit("</function>\n</tool_call>"));
    return Seq(std::move(parts));
  }
  const Json none = Json::object();
  const Json& properties =
      parameters.is_object() && parameters.contains("properties") ? parameters["properties"] : none;
  if (!properties.is_object()) {
    return InvalidArgument("{}.properties: must be an object", where);
  }
  std::vector<std::string> required;
  if (parameters.is_object() && parameters.contains("required") &&
      parameters["required"].is_array()) {
    for (const Json& r : parameters["required"]) {
      if (r.is_string()) required.push_back(r.get<std::string>());
    }
  }
  for (const auto& [key, schema] : properties.items()) {
    ASSIGN_OR_RETURN(Expr value, XmlValue(g, schema, where + ".properties." + key, limits));
    Expr param = Seq({Lit("<parameter=" + key + ">\n"), std::move(value), Lit("\n</parameter>\n")});
    const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
    parts.push_back(is_required ? std::move(param) : Opt(std::move(param)));
  }
  parts.push_back(Lit("</function>\n</tool_call>"));
  return Seq(std::move(parts));
}

}  // namespace

Result<Grammar> ToolCallsGrammar(std::string_view spec_json, const Limits& limits) {
  if (spec_json.size() > limits.max_spec_bytes) {
    return InvalidArgument("tools of {} bytes: more than {} (max_spec_bytes)", spec_json.size(),
                           limits.max_spec_bytes);
  }
  ASSIGN_OR_RETURN(Json spec, ParseJson<Json>(spec_json, "tool calls", limits.max_nesting + 4));
  const std::string format = spec.value("format", "");
  if (format != "hermes" && format != "qwen3_xml") {
    return InvalidArgument("tool calls: format \"{}\" has no grammar", format);
  }
  const bool opened = spec.value("opened", false);
  const bool parallel = spec.value("parallel", true) && !opened;
  const std::string only = spec.contains("only") && spec["only"].is_string()
                               ? spec["only"].get<std::string>()
                               : std::string();
  if (!spec.contains("tools") || !spec["tools"].is_array()) {
    return InvalidArgument("tool calls: no tools");
  }
  Grammar g;
  g.root = g.AddRule("root");
  std::vector<Expr> calls;
  const Json& tools = spec["tools"];
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "].function";
    const Json& tool = tools[i];
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
        !tool["function"].contains("name") || !tool["function"]["name"].is_string()) {
      return InvalidArgument("{}: needs a name", where);
    }
    const Json& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    const Json parameters = function.contains("parameters") && !function["parameters"].is_null()
                                ? function["parameters"]
                                : Json{{"type", "object"}};
    // Opened by the model (tool_choice auto), only "strict" tools have their schema enforced.
    const bool free = opened && !(function.contains("strict") && function["strict"] == true);
    ASSIGN_OR_RETURN(Expr call, format == "hermes" ? HermesCall(g, name, parameters, free, opened,
                                                                where + ".parameters", limits)
                                                   : XmlCall(g, name, parameters, free, opened,
                                                             where + ".parameters", limits));
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return InvalidArgument("tool calls: no tool named \"{}\"", only);
  Expr one = Alt(std::move(calls));
  const int call_rule = g.AddRule("call");
  g.bodies[call_rule] = std::move(one);
  g.bodies[g.root] =
      parallel ? Seq({Ref(call_rule), Star(Seq({Lit("\n"), Ref(call_rule)}))}) : Ref(call_rule);
  RETURN_IF_ERROR(CheckGrammar(g, limits));
  return g;
}

}  // namespace moeserve::structured
