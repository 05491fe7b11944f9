#include "server/tool_call_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/json.h"

namespace moeserve::server {
namespace {

using nlohmann::json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool IsPrefixOf(std::string_view prefix, std::string_view tag) {
  return prefix.size() <= tag.size() && tag.substr(0, prefix.size()) == prefix;
}

// A function or parameter name as vLLM's qwen3_coder parser accepts it: no template syntax,
// quotes or whitespace (`<function={{ name }}>` is a template the model echoed, not a call).
bool IsNameByte(char c) {
  return std::string_view("{}<>\"' \t\n\r").find(c) == std::string_view::npos;
}

// The bytes of a JSON string's body, as Python's json.dumps(ensure_ascii=False) writes them.
void AppendJsonEscaped(std::string* out, char c) {
  switch (c) {
    case '"':
      out->append("\\\"");
      return;
    case '\\':
      out->append("\\\\");
      return;
    case '\n':
      out->append("\\n");
      return;
    case '\r':
      out->append("\\r");
      return;
    case '\t':
      out->append("\\t");
      return;
    case '\b':
      out->append("\\b");
      return;
    case '\f':
      out->append("\\f");
      return;
    default:
      break;
  }
  if (static_cast<unsigned char>(c) < 0x20) {
    out->append(fmt::format("\\u{:04x}", static_cast<unsigned char>(c)));
  } else {
    out->push_back(c);
  }
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) AppendJsonEscaped(&out, c);
  out.push_back('"');
  return out;
}

// `value` as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": " between
// items, keys in their order. Recursion is bounded by the depth ParseJson allowed.
void AppendPythonJson(const nlohmann::ordered_json& value, std::string* out) {
  if (value.is_string()) {
    *out += JsonString(value.get_ref<const std::string&>());
  } else if (value.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out->append(", ");
      AppendPythonJson(value[i], out);
    }
    out->push_back(']');
  } else if (value.is_object()) {
    out->push_back('{');
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out->append(", ");
      first = false;
      *out += JsonString(key);
      out->append(": ");
      AppendPythonJson(item, out);
    }
    out->push_back('}');
  } else {
    out->append(value.dump());  // numbers, true, false, null
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

bool StartsWithAny(std::string_view s, std::initializer_list<std::string_view> prefixes) {
  for (std::string_view p : prefixes) {
    if (s.starts_with(p)) return true;
  }
  return false;
}

// Checks JSON text one byte at a time: is it still the start of one JSON value? Keeps a stack
// of the open arrays and objects (at most max_depth) and the state inside the current token, so
// each byte costs O(1). Used on hermes arguments, which the model writes as JSON.
class JsonPrefixScanner {
 public:
  enum class Step { kMore, kDone, kBad };

  explicit JsonPrefixScanner(int max_depth = 64) : max_depth_(max_depth) {}

  Step Push(char c) {
    switch (mode_) {
      case Mode::kValue:
        return Value(c);
      case Mode::kArrayFirst:
        if (IsSpace(c)) return Step::kMore;
        if (c == ']') return Close();
        mode_ = Mode::kValue;
        return Value(c);
      case Mode::kObjectFirst:
        if (IsSpace(c)) return Step::kMore;
        if (c == '}') return Close();
        return Key(c);
      case Mode::kKey:
        if (IsSpace(c)) return Step::kMore;
        return Key(c);
      case Mode::kColon:
        if (IsSpace(c)) return Step::kMore;
        if (c != ':') return Step::kBad;
        mode_ = Mode::kValue;
        return Step::kMore;
      case Mode::kAfterValue:
        if (IsSpace(c)) return Step::kMore;
        if (c == ',') {
          mode_ = stack_.back() == '{' ? Mode::kKey : Mode::kValue;
          return Step::kMore;
        }
        if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '['))
          return Close();
        return Step::kBad;
      case Mode::kString:
        if (c == '"') {
          if (in_key_) {
            mode_ = Mode::kColon;
            return Step::kMore;
          }
          return ValueEnded();
        }
        if (c == '\\') mode_ = Mode::kEscape;
        if (static_cast<unsigned char>(c) < 0x20) return Step::kBad;
        return Step::kMore;
      case Mode::kEscape:
        if (c == 'u') {
          hex_left_ = 4;
          mode_ = Mode::kUnicode;
          return Step::kMore;
        }
        if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Step::kBad;
        mode_ = Mode::kString;
        return Step::kMore;
      case Mode::kUnicode:
        if (!std::isxdigit(static_cast<unsigned char>(c))) return Step::kBad;
        if (--hex_left_ == 0) mode_ = Mode::kString;
        return Step::kMore;
      case Mode::kLiteral:
        if (literal_[literal_pos_] != c) return Step::kBad;
        if (++literal_pos_ == literal_.size()) return ValueEnded();
        return Step::kMore;
      case Mode::kNumber:
        return Number(c);
      case Mode::kDone:
        return Step::kBad;
    }
    return Step::kBad;
  }

 private:
  enum class Mode {
    kValue,
    kArrayFirst,
    kObjectFirst,
    kKey,
    kColon,
    kAfterValue,
    kString,
    kEscape,
    kUnicode,
    kLiteral,
    kNumber,
    kDone,
  };
  // Inside a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  enum class Num { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  Step Value(char c) {
    if (IsSpace(c)) return Step::kMore;
    if (c == '{' || c == '[') {
      if (static_cast<int>(stack_.size()) >= max_depth_) return Step::kBad;
      stack_.push_back(c);
      mode_ = c == '{' ? Mode::kObjectFirst : Mode::kArrayFirst;
      return Step::kMore;
    }
    if (c == '"') {
      in_key_ = false;
      mode_ = Mode::kString;
      return Step::kMore;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      mode_ = Mode::kNumber;
      num_ = c == '-' ? Num::kMinus : c == '0' ? Num::kZero : Num::kInt;
      number_.assign(1, c);
      return Step::kMore;
    }
    for (std::string_view lit : {"true", "false", "null"}) {
      if (lit[0] == c) {
        literal_ = lit;
        literal_pos_ = 1;
        mode_ = Mode::kLiteral;
        return Step::kMore;
      }
    }
    return Step::kBad;
  }

  Step Key(char c) {
    if (c != '"') return Step::kBad;
    in_key_ = true;
    mode_ = Mode::kString;
    return Step::kMore;
  }

  Step Close() {
    stack_.pop_back();
    return ValueEnded();
  }

  Step ValueEnded() {
    if (stack_.empty()) {
      mode_ = Mode::kDone;
      return Step::kDone;
    }
    mode_ = Mode::kAfterValue;
    return Step::kMore;
  }

  Step Number(char c) {
    const bool digit = c >= '0' && c <= '9';
    const bool part = digit || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
    if (part) {
      number_.push_back(c);
      if (number_.size() > kMaxNumberBytes) return Step::kBad;
    }
    switch (num_) {
      case Num::kMinus:
        if (c == '0')
          num_ = Num::kZero;
        else if (digit)
          num_ = Num::kInt;
        else
          return Step::kBad;
        return Step::kMore;
      case Num::kZero:
      case Num::kInt:
        if (digit && num_ == Num::kInt) return Step::kMore;
        if (c == '.')
          num_ = Num::kDot;
        else if (c == 'e' || c == 'E')
          num_ = Num::kE;
        else
          break;
        return Step::kMore;
      case Num::kDot:
        if (!digit) return Step::kBad;
        num_ = Num::kFrac;
        return Step::kMore;
      case Num::kFrac:
        if (digit) return Step::kMore;
        if (c == 'e' || c == 'E') {
          num_ = Num::kE;
          return Step::kMore;
        }
        break;
      case Num::kE:
        if (c == '+' || c == '-')
          num_ = Num::kESign;
        else if (digit)
          num_ = Num::kExp;
        else
          return Step::kBad;
        return Step::kMore;
      case Num::kESign:
        if (!digit) return Step::kBad;
        num_ = Num::kExp;
        return Step::kMore;
      case Num::kExp:
        if (digit) return Step::kMore;
        break;
    }
    // The number ended before c (numbers only end inside a container: the top is an object).
    // One a double cannot hold (1e999) is refused: JSON parsers (nlohmann's, the clients') may
    // reject it, so the call would not be the JSON it claims to be.
    if (stack_.empty() || !std::isfinite(std::strtod(number_.c_str(), nullptr))) return Step::kBad;
    mode_ = Mode::kAfterValue;
    return Push(c);
  }

  // A number's text, checked at its end; longer than any double needs is refused.
  static constexpr size_t kMaxNumberBytes = 64;

  int max_depth_;
  std::vector<char> stack_;
  std::string number_;
  Mode mode_ = Mode::kValue;
  bool in_key_ = false;
  int hex_left_ = 0;
  std::string_view literal_;
  size_t literal_pos_ = 0;
  Num num_ = Num::kInt;
};

}  // namespace

Result<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "qwen3_xml" || name == "qwen3_coder") return ToolCallFormat::kQwen3Xml;
  if (name == "none") return ToolCallFormat::kNone;
  return InvalidArgument(
      "unknown tool call parser '{}' (known: hermes, qwen3_xml, qwen3_coder, none)", name);
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kQwen3Xml:
      return "qwen3_xml";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

std::string NewToolCallId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

namespace {

// vLLM's reading of one property schema (qwen3coder_tool_parser._convert_param_value).
ToolParam ReadToolParam(const json& schema) {
  ToolParam p;
  if (!schema.is_object()) return p;
  auto first_non_null = [&p](const json& types) {
    bool picked = false;
    for (const json& t : types) {
      const json* type = &t;
      if (t.is_object()) {
        auto it = t.find("type");
        if (it == t.end()) continue;
        type = &*it;
      }
      if (!type->is_string()) continue;
      std::string name = Lower(Trim(type->get_ref<const std::string&>()));
      if (name == "null") {
        p.allows_null = true;
      } else if (!picked) {
        p.type = name;
        picked = true;
      }
    }
  };
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) {
      p.type = Lower(Trim(it->get_ref<const std::string&>()));
      p.allows_null = p.type == "null";
    } else if (it->is_array()) {
      first_non_null(*it);
    }
  } else if (auto any = schema.find("anyOf"); any != schema.end() && any->is_array()) {
    first_non_null(*any);
  }
  return p;
}

}  // namespace

Result<std::vector<ToolSpec>> ReadToolSpecs(std::string_view tools_json) {
  ASSIGN_OR_RETURN(json tools, ParseJson(tools_json, "tools"));
  std::vector<ToolSpec> specs;
  if (tools.is_null()) return specs;
  if (!tools.is_array()) return InvalidArgument("tools: must be a list");
  if (tools.size() > kMaxTools) {
    return InvalidArgument("tools: {} tools, at most {}", tools.size(), kMaxTools);
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    auto fn = tool.is_object() ? tool.find("function") : tool.end();
    if (!tool.is_object() || fn == tool.end() || !fn->is_object()) {
      return InvalidArgument("tools[{}]: must be an object with a \"function\" object", i);
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return InvalidArgument("tools[{}].function.name: must be a non-empty string", i);
    }
    ToolSpec spec;
    spec.name = name->get<std::string>();
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null()) {
      if (!params->is_object()) {
        return InvalidArgument("tools[{}].function.parameters: must be an object", i);
      }
      auto props = params->find("properties");
      if (props != params->end() && !props->is_null()) {
        if (!props->is_object()) {
          return InvalidArgument("tools[{}].function.parameters.properties: must be an object", i);
        }
        if (props->size() > kMaxToolParams) {
          return InvalidArgument(
              "tools[{}].function.parameters.properties: {} properties, at most {}", i,
              props->size(), kMaxToolParams);
        }
        for (const auto& [key, schema] : props->items()) spec.params[key] = ReadToolParam(schema);
      }
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string ConvertXmlParamValue(std::string_view text, const ToolParam* param, int max_depth) {
  if (param == nullptr) return JsonString(text);
  const std::string lower = Lower(text);
  const bool null_word = lower == "null" || lower == "none";
  if (param->allows_null && null_word) return "null";
  const std::string& type = param->type;
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum") {
    return JsonString(text);
  }
  if (null_word) return "null";
  if (StartsWithAny(type, {"int", "uint", "long", "short", "unsigned"})) {
    std::string_view t = Trim(text);
    if (!t.empty() && t.front() == '+') t.remove_prefix(1);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (!t.empty() && ec == std::errc() && end == t.data() + t.size()) return std::to_string(v);
    return JsonString(text);
  }
  if (StartsWithAny(type, {"num", "float"})) {
    std::string t(Trim(text));
    char* end = nullptr;
    double v = t.empty() || t.find_first_of("xX") != std::string::npos
                   ? NAN
                   : std::strtod(t.c_str(), &end);
    if (std::isfinite(v) && end == t.c_str() + t.size()) {
      if (v == std::trunc(v) && std::fabs(v) < 9.2e18)
        return std::to_string(static_cast<int64_t>(v));
      return json(v).dump();
    }
    return JsonString(text);
  }
  if (type == "boolean" || type == "bool" || type == "binary") {
    return lower == "true" ? "true" : "false";
  }
  // object, array and types vLLM hands to json.loads / ast.literal_eval.
  Result<nlohmann::ordered_json> value = ParseJson<nlohmann::ordered_json>(text, "", max_depth);
  if (!value.ok()) return JsonString(text);
  std::string out;
  AppendPythonJson(*value, &out);
  return out;
}

struct ToolCallParser::State {
  enum class Mode {
    kText,          // content; ws = held whitespace, tag = a partial `<tool_call>`
    kHeader,        // header = `<tool_call>` and what followed, until the name is whole
    kHermesArgs,    // the arguments object, through the scanner
    kXmlBody,       // between parameters; tag = a partial `<parameter=` / `</function>`
    kXmlParamName,  // after `<parameter=`
    kXmlValue,      // a parameter's value; tag = a partial `</parameter>`
    kAfterCall,     // dropped up to `</tool_call>` (or a new `<tool_call>`)
  };

  ToolCallFormat format;
  std::shared_ptr<const std::vector<ToolSpec>> tools;
  ToolCallLimits limits;
  std::function<std::string()> new_id;

  Mode mode = Mode::kText;
  std::vector<ToolCall> calls;
  std::string ws;
  bool after_call = false;  // no content since the last call: its whitespace is dropped
  bool any_content = false;
  std::string separator;  // the whitespace before the last run of calls, when text preceded it
  std::string tag;
  // kHeader
  std::string header;
  int header_step = 0;
  size_t literal_pos = 0;
  std::string name;
  bool name_escape = false;
  // The call being read
  JsonPrefixScanner scanner;
  const ToolSpec* spec = nullptr;
  bool first_param = true;
  std::set<std::string, std::less<>> seen_params;
  std::string param_name;
  const ToolParam* param = nullptr;
  bool skip_value = false;    // a repeated parameter: the first one counts
  bool string_value = false;  // streamed as a JSON string as it arrives
  bool value_started = false;
  bool pending_newline = false;  // a value's last "\n" is not part of it (vLLM strips one)
  std::string raw_value;
  // Bytes to read again before the rest of the input.
  std::string replay;
  size_t replay_pos = 0;
  // The current Feed's outputs.
  std::string* content = nullptr;
  std::vector<ToolCallDelta>* deltas = nullptr;

  void Replay(std::string_view bytes) {
    std::string again(bytes);
    again.append(replay, replay_pos);
    replay = std::move(again);
    replay_pos = 0;
  }

  // Content text (not empty). Whitespace held before it is emitted, except after a call: there
  // the whitespace that stood before the call separates the texts around it, once.
  void Content(std::string_view text) {
    content->append(after_call ? separator : ws);
    ws.clear();
    separator.clear();
    content->append(text);
    after_call = false;
    any_content = true;
  }

  const ToolSpec* FindTool(std::string_view tool_name) const {
    for (const ToolSpec& t : *tools) {
      if (t.name == tool_name) return &t;
    }
    return nullptr;
  }

  // Appends to the open call's arguments; false (and the call broken) past the size limit.
  bool Arguments(std::string_view text) {
    ToolCall& call = calls.back();
    if (call.arguments.size() + text.size() > limits.max_argument_bytes) {
      Break();
      return false;
    }
    call.arguments.append(text);
    size_t index = calls.size() - 1;
    if (deltas->empty() || deltas->back().index != index) {
      ToolCallDelta d;
      d.index = index;
      deltas->push_back(std::move(d));
    }
    deltas->back().arguments.append(text);
    return true;
  }

  void Break() {
    mode = Mode::kAfterCall;
    tag.clear();
  }

  void CallEnded() {
    calls.back().complete = true;
    mode = Mode::kAfterCall;
    tag.clear();
  }

  void OpenCall() {
    if (calls.size() >= limits.max_calls) {  // past the limit a call is text
      Content(tag);
      tag.clear();
      mode = Mode::kText;
      return;
    }
    header = std::move(tag);
    tag.clear();
    mode = Mode::kHeader;
    header_step = 0;
    literal_pos = 0;
    name.clear();
    name_escape = false;
  }

  // The header is not a call: it is content, and c is read again.
  void HeaderFailed(char c) {
    Content(header);
    header.clear();
    mode = Mode::kText;
    Replay(std::string_view(&c, 1));
  }

  void StartCall(std::string call_name, const ToolSpec* tool) {
    if (!after_call) separator = any_content ? ws : "";  // not content unless text follows
    ws.clear();
    header.clear();
    ToolCall call;
    call.id = new_id();
    call.name = std::move(call_name);
    ToolCallDelta first;
    first.index = calls.size();
    first.id = call.id;
    first.name = call.name;
    deltas->push_back(std::move(first));
    calls.push_back(std::move(call));
    spec = tool;
    if (format == ToolCallFormat::kHermes) {
      scanner = JsonPrefixScanner(limits.max_argument_depth);
      scanner.Push('{');
      mode = Mode::kHermesArgs;
      Arguments("{");
    } else {
      first_param = true;
      seen_params.clear();
      mode = Mode::kXmlBody;
      tag.clear();
      Arguments("{");
    }
  }

  void Step(char c) {
    switch (mode) {
      case Mode::kText:
        return Text(c);
      case Mode::kHeader:
        return Header(c);
      case Mode::kHermesArgs:
        return HermesArgs(c);
      case Mode::kXmlBody:
        return XmlBody(c);
      case Mode::kXmlParamName:
        return XmlParamName(c);
      case Mode::kXmlValue:
        return XmlValue(c);
      case Mode::kAfterCall:
        return AfterCall(c);
    }
  }

  void Text(char c) {
    if (tag.empty()) {
      if (IsSpace(c)) {
        ws.push_back(c);
      } else if (c == '<') {
        tag.push_back(c);
      } else {
        Content(std::string_view(&c, 1));
      }
      return;
    }
    tag.push_back(c);
    if (IsPrefixOf(tag, kCallOpen)) {
      if (tag.size() == kCallOpen.size()) OpenCall();
      return;
    }
    // Not a tag: its '<' is content, the rest is read again.
    Content(tag.substr(0, 1));
    Replay(std::string_view(tag).substr(1));
    tag.clear();
  }

  // Matches `literal` with whitespace before it; advances header_step when it is whole.
  bool Literal(std::string_view literal, char c) {
    if (literal_pos == 0 && IsSpace(c)) return true;
    if (literal[literal_pos] != c) return false;
    if (++literal_pos == literal.size()) {
      literal_pos = 0;
      ++header_step;
    }
    return true;
  }

  void Header(char c) {
    if (header.size() >= limits.max_header_bytes) return HeaderFailed(c);
    bool ok = format == ToolCallFormat::kHermes ? HermesHeader(c) : XmlHeader(c);
    if (!ok) return HeaderFailed(c);
    if (mode == Mode::kHeader) header.push_back(c);
  }

  // {"name": "NAME", "arguments": {   (the order Qwen3's template asks for)
  bool HermesHeader(char c) {
    static constexpr std::string_view kSteps[] = {"{", "\"name\"",      ":", "\"", "",
                                                  ",", "\"arguments\"", ":", "{"};
    if (header_step == 4) {  // the name's characters, escapes kept for the JSON parser
      if (name_escape) {
        name_escape = false;
      } else if (c == '\\') {
        name_escape = true;
      } else if (c == '"') {
        ++header_step;
        return true;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return false;
      }
      name.push_back(c);
      return name.size() <= limits.max_name_bytes;
    }
    if (!Literal(kSteps[header_step], c)) return false;
    if (header_step < static_cast<int>(std::size(kSteps))) return true;
    Result<json> decoded = ParseJson("\"" + name + "\"", "", 1);
    if (!decoded.ok() || !decoded->is_string()) return false;
    std::string call_name = decoded->get<std::string>();
    const ToolSpec* tool = FindTool(call_name);
    if (call_name.empty() || (!tools->empty() && tool == nullptr)) return false;
    StartCall(std::move(call_name), tool);
    return true;
  }

  // <function=NAME>
  bool XmlHeader(char c) {
    if (header_step == 0) return Literal(kFunctionOpen, c);
    if (c != '>') {
      name.push_back(c);
      return IsNameByte(c) && name.size() <= limits.max_name_bytes;
    }
    const ToolSpec* tool = FindTool(name);
    if (name.empty() || (!tools->empty() && tool == nullptr)) return false;
    StartCall(std::move(name), tool);
    name.clear();
    return true;
  }

  void HermesArgs(char c) {
    // A byte that breaks the call is read again after it (it may start `</tool_call>`).
    JsonPrefixScanner::Step step = scanner.Push(c);
    if (step == JsonPrefixScanner::Step::kBad) {
      Break();
      return Replay(std::string_view(&c, 1));
    }
    if (!Arguments(std::string_view(&c, 1))) return Replay(std::string_view(&c, 1));
    if (step == JsonPrefixScanner::Step::kDone) CallEnded();
  }

  // A partial tag ended in a mismatch: in a call's body that breaks the call; the bytes are read
  // again after it (they may hold `</tool_call>`).
  void BreakAndReplayTag() {
    std::string bytes = std::move(tag);
    Break();
    Replay(bytes);
  }

  void XmlBody(char c) {
    if (tag.empty()) {
      if (IsSpace(c)) return;
      if (c != '<') return Break();
      tag.push_back(c);
      return;
    }
    tag.push_back(c);
    if (IsPrefixOf(tag, kParamOpen)) {
      if (tag.size() == kParamOpen.size()) {
        tag.clear();
        param_name.clear();
        mode = Mode::kXmlParamName;
      }
      return;
    }
    if (IsPrefixOf(tag, kFunctionClose) || IsPrefixOf(tag, kCallClose)) {
      const bool call_close = tag == kCallClose;  // `</function>` forgotten: the call still ends
      if (tag == kFunctionClose || call_close) {
        if (!Arguments("}")) return;
        CallEnded();
        if (call_close) {
          mode = Mode::kText;
          after_call = true;
          ws.clear();
        }
      }
      return;
    }
    BreakAndReplayTag();
  }

  void XmlParamName(char c) {
    if (c != '>') {
      param_name.push_back(c);
      if (!IsNameByte(c) || param_name.size() > limits.max_name_bytes) {
        Break();
        Replay(std::string_view(&c, 1));
      }
      return;
    }
    if (param_name.empty()) return Break();
    skip_value = seen_params.contains(param_name) || seen_params.size() >= kMaxToolParams;
    param = nullptr;
    if (spec != nullptr) {
      auto it = spec->params.find(param_name);
      if (it != spec->params.end()) param = &it->second;
    }
    static const std::set<std::string, std::less<>> kStringTypes = {"string",  "str",  "text",
                                                                    "varchar", "char", "enum"};
    string_value = param == nullptr || (kStringTypes.contains(param->type) && !param->allows_null);
    value_started = false;
    pending_newline = false;
    raw_value.clear();
    tag.clear();
    mode = Mode::kXmlValue;
    if (skip_value) return;
    seen_params.insert(param_name);
    std::string key = first_param ? "" : ", ";
    first_param = false;
    key += JsonString(param_name) + ": ";
    if (string_value) key.push_back('"');
    Arguments(key);
  }

  void ValueByte(char c) {
    if (skip_value) return;
    if (!string_value) {
      raw_value.push_back(c);
      if (raw_value.size() > limits.max_argument_bytes) Break();
      return;
    }
    std::string escaped;
    if (pending_newline) AppendJsonEscaped(&escaped, '\n');
    pending_newline = c == '\n';
    if (!pending_newline) AppendJsonEscaped(&escaped, c);
    if (!escaped.empty()) Arguments(escaped);
  }

  void XmlValue(char c) {
    if (!value_started) {
      value_started = true;
      if (c == '\n') return;  // vLLM strips one newline after `>`
    }
    if (tag.empty() && c != '<') return ValueByte(c);
    tag.push_back(c);
    if (IsPrefixOf(tag, kParamClose)) {
      if (tag.size() == kParamClose.size()) EndParam();
      return;
    }
    std::string rest = tag.substr(1);
    char first = tag[0];
    tag.clear();
    ValueByte(first);
    Replay(rest);
  }

  void EndParam() {
    tag.clear();
    mode = Mode::kXmlBody;
    if (skip_value) return;
    if (string_value) {
      Arguments("\"");  // a pending "\n" was the value's last byte: dropped
      return;
    }
    std::string_view value = raw_value;
    if (value.ends_with('\n')) value.remove_suffix(1);
    Arguments(ConvertXmlParamValue(value, param, limits.max_argument_depth));
  }

  void AfterCall(char c) {
    if (tag.empty()) {
      if (c == '<') tag.push_back(c);
      return;
    }
    tag.push_back(c);
    if (IsPrefixOf(tag, kCallClose)) {
      if (tag.size() == kCallClose.size()) {
        tag.clear();
        ws.clear();
        after_call = true;
        mode = Mode::kText;
      }
      return;
    }
    if (IsPrefixOf(tag, kCallOpen)) {
      if (tag.size() == kCallOpen.size()) {
        ws.clear();
        after_call = true;
        OpenCall();
      }
      return;
    }
    std::string rest = tag.substr(1);
    tag.clear();
    Replay(rest);
  }

  void Feed(std::string_view text) {
    for (char c : text) {
      Step(c);
      while (replay_pos < replay.size()) Step(replay[replay_pos++]);
      replay.clear();
      replay_pos = 0;
    }
  }

  void Finish() {
    switch (mode) {
      case Mode::kText:
        if (!tag.empty()) Content(tag);
        if (!after_call) content->append(ws);
        break;
      case Mode::kHeader:
        Content(header);
        break;
      default:  // a call cut off: it stays incomplete
        break;
    }
    tag.clear();
    header.clear();
    ws.clear();
    mode = Mode::kText;
  }
};

ToolCallParser::ToolCallParser(ToolCallFormat format,
                               std::shared_ptr<const std::vector<ToolSpec>> tools,
                               ToolCallLimits limits, std::function<std::string()> new_id)
    : s_(std::make_unique<State>()) {
  s_->format = format;
  s_->tools = tools ? std::move(tools) : std::make_shared<const std::vector<ToolSpec>>();
  s_->limits = limits;
  s_->new_id = std::move(new_id);
}

ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

void ToolCallParser::Feed(std::string_view text, std::string* content,
                          std::vector<ToolCallDelta>* calls) {
  if (s_->format == ToolCallFormat::kNone) {
    content->append(text);
    return;
  }
  s_->content = content;
  s_->deltas = calls;
  s_->Feed(text);
}

void ToolCallParser::Finish(std::string* content, std::vector<ToolCallDelta>* calls) {
  if (s_->format == ToolCallFormat::kNone) return;
  s_->content = content;
  s_->deltas = calls;
  s_->Finish();
}

const std::vector<ToolCall>& ToolCallParser::calls() const { return s_->calls; }

}  // namespace moeserve::server
