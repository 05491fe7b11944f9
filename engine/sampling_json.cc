#include "engine/sampling_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace moeserve::engine {
namespace {

using nlohmann::json;

// ---- Values, by the type of the field they go to ----

Result<int64_t> ToInt(const json& v, std::string_view key) {
  if (!v.is_number_integer()) return InvalidArgument("\"{}\" must be an integer", key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
    return InvalidArgument("\"{}\": {} is too large", key, v.dump());
  }
  return v.get<int64_t>();
}

// An element of a token-id list: any int32 (whether it lies in the vocabulary is Validate's
// check, which knows the vocabulary).
Result<int32_t> ToTokenId(const json& v, std::string_view key) {
  if (!v.is_number_integer()) return InvalidArgument("\"{}\": {} is not an integer", key, v.dump());
  const double id = v.get<double>();  // exact for every int32; huge values stay huge
  if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("\"{}\": {} is not a token id", key, v.dump());
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

Status Parse(const json& v, std::string_view key, int64_t& out) {
  ASSIGN_OR_RETURN(out, ToInt(v, key));
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, std::optional<int64_t>& out) {
  ASSIGN_OR_RETURN(out, ToInt(v, key));
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, double& out) {
  if (!v.is_number()) return InvalidArgument("\"{}\" must be a number", key);
  out = v.get<double>();
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, bool& out) {
  if (!v.is_boolean()) return InvalidArgument("\"{}\" must be true or false", key);
  out = v.get<bool>();
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, std::vector<int32_t>& out) {
  if (!v.is_array()) return InvalidArgument("\"{}\" must be a list of token ids", key);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& id : v) {
    ASSIGN_OR_RETURN(const int32_t token, ToTokenId(id, key));
    ids.push_back(token);
  }
  out = std::move(ids);
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, std::optional<std::vector<int32_t>>& out) {
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(Parse(v, key, ids));
  out = std::move(ids);
  return OkStatus();
}

Status Parse(const json& v, std::string_view key, std::vector<std::string>& out) {
  if (!v.is_array()) return InvalidArgument("\"{}\" must be a list of strings", key);
  std::vector<std::string> strings;
  strings.reserve(v.size());
  for (const json& s : v) {
    if (!s.is_string()) return InvalidArgument("\"{}\": {} is not a string", key, s.dump());
    strings.push_back(s.get<std::string>());
  }
  out = std::move(strings);
  return OkStatus();
}

// {"token id": bias}: JSON keys are strings, which vLLM coerces to int.
Status Parse(const json& v, std::string_view key, std::vector<std::pair<int32_t, float>>& out) {
  if (!v.is_object()) {
    return InvalidArgument("\"{}\" must be an object {{\"token id\": bias}}", key);
  }
  std::vector<std::pair<int32_t, float>> biases;
  biases.reserve(v.size());
  for (const auto& [id, bias] : v.items()) {
    int32_t token = 0;
    const char* end = id.data() + id.size();
    const auto [parsed_to, error] = std::from_chars(id.data(), end, token);
    if (id.empty() || error != std::errc() || parsed_to != end) {
      return InvalidArgument("\"{}\": key \"{}\" is not a token id", key, id);
    }
    if (!bias.is_number()) {
      return InvalidArgument("\"{}\": the bias of token {} must be a number", key, id);
    }
    biases.emplace_back(token, bias.get<float>());
  }
  out = std::move(biases);
  return OkStatus();
}

// ---- Keys ----

using Setter = Status (*)(const json& value, std::string_view key, SamplingParams& p);

// The field of SamplingParams that the key names, parsed by the field's type.
template <auto kField>
Status Set(const json& value, std::string_view key, SamplingParams& p) {
  return Parse(value, key, p.*kField);
}

Status SetSeed(const json& value, std::string_view key, SamplingParams& p) {
  ASSIGN_OR_RETURN(const int64_t seed, ToInt(value, key));
  p.seed = seed == -1 ? std::nullopt : std::optional<int64_t>(seed);  // vLLM: -1 is None
  return OkStatus();
}

Status SetStop(const json& value, std::string_view key, SamplingParams& p) {
  if (value.is_string()) {
    p.stop = {value.get<std::string>()};
    return OkStatus();
  }
  if (!value.is_array()) {
    return InvalidArgument("\"{}\" must be a string or a list of strings", key);
  }
  return Parse(value, key, p.stop);
}

// ---- Structured output: vLLM's structured_outputs, OpenAI's response_format, the guided_* keys

using structured::GrammarSpec;

// A JSON Schema given as an object, or as its text (vLLM takes both).
Result<GrammarSpec> SchemaSpec(const json& value, std::string_view key) {
  if (value.is_string()) {
    return GrammarSpec{GrammarSpec::Kind::kJsonSchema, value.get<std::string>(), {}};
  }
  if (!value.is_object() && !value.is_boolean()) {
    return InvalidArgument("\"{}\" must be a JSON Schema (an object, or its text)", key);
  }
  return GrammarSpec{GrammarSpec::Kind::kJsonSchema, value.dump(), {}};
}

Result<std::string> TextOf(const json& value, std::string_view key) {
  if (!value.is_string()) return InvalidArgument("\"{}\" must be a string", key);
  return value.get<std::string>();
}

Result<GrammarSpec> ChoiceSpec(const json& value, std::string_view key) {
  GrammarSpec spec{GrammarSpec::Kind::kChoice, {}, {}};
  RETURN_IF_ERROR(Parse(value, key, spec.choices));
  if (spec.choices.empty()) return InvalidArgument("\"{}\" must list at least one choice", key);
  return spec;
}

Status SetGuidedJson(const json& value, std::string_view key, SamplingParams& p) {
  ASSIGN_OR_RETURN(p.structured_outputs, SchemaSpec(value, key));
  return OkStatus();
}

Status SetGuidedRegex(const json& value, std::string_view key, SamplingParams& p) {
  ASSIGN_OR_RETURN(std::string text, TextOf(value, key));
  p.structured_outputs = GrammarSpec{GrammarSpec::Kind::kRegex, std::move(text), {}};
  return OkStatus();
}

Status SetGuidedChoice(const json& value, std::string_view key, SamplingParams& p) {
  ASSIGN_OR_RETURN(p.structured_outputs, ChoiceSpec(value, key));
  return OkStatus();
}

Status SetGuidedGrammar(const json& value, std::string_view key, SamplingParams& p) {
  ASSIGN_OR_RETURN(std::string text, TextOf(value, key));
  p.structured_outputs = GrammarSpec{GrammarSpec::Kind::kGrammar, std::move(text), {}};
  return OkStatus();
}

// vLLM's StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object.
// Its switches that this engine always behaves as (no fallback; no additional properties unless
// the schema allows them; compact whitespace) are accepted as booleans; what it cannot honour
// (structural tags, a whitespace pattern) is refused by name.
Status SetStructuredOutputs(const json& value, std::string_view key, SamplingParams& p) {
  if (!value.is_object()) return InvalidArgument("\"{}\" must be an object", key);
  std::optional<GrammarSpec> spec;
  std::string_view chosen;
  for (const auto& [name, v] : value.items()) {
    if (v.is_null()) continue;
    const std::string field = fmt::format("{}.{}", key, name);
    std::optional<GrammarSpec> one;
    if (name == "json") {
      ASSIGN_OR_RETURN(one, SchemaSpec(v, field));
    } else if (name == "regex") {
      ASSIGN_OR_RETURN(std::string text, TextOf(v, field));
      one = GrammarSpec{GrammarSpec::Kind::kRegex, std::move(text), {}};
    } else if (name == "choice") {
      ASSIGN_OR_RETURN(one, ChoiceSpec(v, field));
    } else if (name == "grammar") {
      ASSIGN_OR_RETURN(std::string text, TextOf(v, field));
      one = GrammarSpec{GrammarSpec::Kind::kGrammar, std::move(text), {}};
    } else if (name == "json_object") {
      bool on = false;
      RETURN_IF_ERROR(Parse(v, field, on));
      if (on) one = GrammarSpec{GrammarSpec::Kind::kJsonObject, {}, {}};
    } else if (name == "disable_fallback" || name == "disable_any_whitespace" ||
               name == "disable_additional_properties") {
      bool ignored = false;
      RETURN_IF_ERROR(Parse(v, field, ignored));
    } else if (name == "backend" || name == "_backend") {
      if (!v.is_string()) return InvalidArgument("\"{}\" must be a string", field);
    } else {
      return InvalidArgument("\"{}\" is not supported by this server", field);
    }
    if (!one.has_value()) continue;
    if (spec.has_value()) {
      return InvalidArgument(
          "\"{}\" takes one of json, regex, choice, grammar, json_object; got "
          "{} and {}",
          key, chosen, name);
    }
    spec = std::move(one);
    chosen = name;
  }
  if (!spec.has_value()) {
    return InvalidArgument("\"{}\" needs one of json, regex, choice, grammar, json_object", key);
  }
  p.structured_outputs = std::move(spec);
  return OkStatus();
}

// OpenAI's response_format: {"type": "text"} (plain text: no grammar), {"type": "json_object"}
// (any JSON object), {"type": "json_schema", "json_schema": {"name", "schema", "strict",
// "description"}} (the schema, enforced whether strict or not, as vLLM).
Status SetResponseFormat(const json& value, std::string_view key, SamplingParams& p) {
  if (!value.is_object()) return InvalidArgument("\"{}\" must be an object", key);
  const auto type = value.find("type");
  if (type == value.end() || !type->is_string()) {
    return InvalidArgument("\"{}\" must have a \"type\"", key);
  }
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "text") {
    p.structured_outputs.reset();
  } else if (name == "json_object") {
    p.structured_outputs = GrammarSpec{GrammarSpec::Kind::kJsonObject, {}, {}};
  } else if (name == "json_schema") {
    const auto format = value.find("json_schema");
    if (format == value.end() || !format->is_object()) {
      return InvalidArgument("\"{}\": type json_schema needs a \"json_schema\" object", key);
    }
    const auto schema = format->find("schema");
    if (schema == format->end() || schema->is_null()) {
      return InvalidArgument("\"{}\": json_schema needs a \"schema\"", key);
    }
    const auto strict = format->find("strict");
    if (strict != format->end() && !strict->is_null() && !strict->is_boolean()) {
      return InvalidArgument("\"{}\": json_schema.strict must be true or false", key);
    }
    ASSIGN_OR_RETURN(p.structured_outputs,
                     SchemaSpec(*schema, "response_format.json_schema.schema"));
  } else {
    return InvalidArgument("\"{}\": type \"{}\" is not supported (text, json_object, json_schema)",
                           key, name.substr(0, 64));
  }
  return OkStatus();
}

struct SamplingKey {
  std::string_view name;
  Setter set;
};

constexpr SamplingKey kKeys[] = {
    {"n", Set<&SamplingParams::n>},
    {"temperature", Set<&SamplingParams::temperature>},
    {"top_p", Set<&SamplingParams::top_p>},
    {"top_k", Set<&SamplingParams::top_k>},
    {"min_p", Set<&SamplingParams::min_p>},
    {"seed", SetSeed},
    {"presence_penalty", Set<&SamplingParams::presence_penalty>},
    {"frequency_penalty", Set<&SamplingParams::frequency_penalty>},
    {"repetition_penalty", Set<&SamplingParams::repetition_penalty>},
    {"max_tokens", Set<&SamplingParams::max_tokens>},
    {"min_tokens", Set<&SamplingParams::min_tokens>},
    {"stop", SetStop},
    {"include_stop_str_in_output", Set<&SamplingParams::include_stop_str_in_output>},
    {"stop_token_ids", Set<&SamplingParams::stop_token_ids>},
    {"ignore_eos", Set<&SamplingParams::ignore_eos>},
    {"logprobs", Set<&SamplingParams::logprobs>},
    {"prompt_logprobs", Set<&SamplingParams::prompt_logprobs>},
    {"logit_bias", Set<&SamplingParams::logit_bias>},
    {"allowed_token_ids", Set<&SamplingParams::allowed_token_ids>},
    {"bad_words", Set<&SamplingParams::bad_words>},
    {"skip_special_tokens", Set<&SamplingParams::skip_special_tokens>},
    {"structured_outputs", SetStructuredOutputs},
    {"response_format", SetResponseFormat},
    {"guided_json", SetGuidedJson},
    {"guided_regex", SetGuidedRegex},
    {"guided_choice", SetGuidedChoice},
    {"guided_grammar", SetGuidedGrammar},
};

// The keys that set structured_outputs.
bool IsStructuredKey(std::string_view name) {
  return name == "structured_outputs" || name == "response_format" ||
         name.substr(0, 7) == "guided_";
}

}  // namespace

Status ApplySamplingKey(std::string_view key, const json& value, SamplingParams& p, bool* known) {
  const SamplingKey* found = std::find_if(std::begin(kKeys), std::end(kKeys),
                                          [key](const SamplingKey& k) { return k.name == key; });
  *known = found != std::end(kKeys);
  if (!*known || value.is_null()) return OkStatus();
  return found->set(value, key, p);
}

Status CheckOneStructuredOutput(const json& object) {
  std::string_view first;
  for (const SamplingKey& k : kKeys) {
    if (!IsStructuredKey(k.name)) continue;
    const auto it = object.find(k.name);
    if (it == object.end() || it->is_null()) continue;
    if (k.name == "response_format" && it->is_object() && it->value("type", json()) == "text") {
      continue;
    }
    if (!first.empty()) {
      return InvalidArgument(
          "\"{}\" and \"{}\" both ask for structured output; a request takes one", first, k.name);
    }
    first = k.name;
  }
  return OkStatus();
}

void KeepSchemaOrder(std::string_view object_text, SamplingParams& p) {
  if (!p.structured_outputs || p.structured_outputs->kind != GrammarSpec::Kind::kJsonSchema) return;
  for (std::initializer_list<std::string_view> path :
       {std::initializer_list<std::string_view>{"guided_json"},
        {"structured_outputs", "json"},
        {"response_format", "json_schema", "schema"}}) {
    const std::optional<std::string_view> raw = RawJsonMember(object_text, path);
    if (raw && !raw->empty() && raw->front() == '{') {
      p.structured_outputs->text = std::string(*raw);
      return;
    }
  }
}

std::span<const std::string_view> SamplingKeys() {
  static const auto kNames = [] {
    std::array<std::string_view, std::size(kKeys)> names;
    std::transform(std::begin(kKeys), std::end(kKeys), names.begin(),
                   [](const SamplingKey& k) { return k.name; });
    return names;
  }();
  return kNames;
}

}  // namespace moeserve::engine
