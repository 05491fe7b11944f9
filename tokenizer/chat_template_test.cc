// Golden tests of tokenizer/chat_template: every case of the shared Qwen3 chat goldens renders
// byte-identical to what transformers (cross-checked by Python Jinja2 and @huggingface/jinja)
// produced.
#include "tokenizer/chat_template.h"
#include "core/test_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace moeserve::tokenizer {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

const std::string kQwen3Dir = std::string(MOESERVE_TESTDATA_DIR) + "/qwen3-tokenizer";
const std::string kTinyDir = std::string(MOESERVE_TESTDATA_DIR) + "/tiny-qwen3next";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Json> ReadJsonLines(const std::string& path) {
  std::vector<Json> cases;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) cases.push_back(Json::parse(line));
  }
  return cases;
}

ChatTemplateInputs InputsOf(const Json& c) {
  ChatTemplateInputs inputs;
  inputs.messages_json = c["messages"].dump();
  inputs.tools_json = c["tools"].dump();
  inputs.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  inputs.extra_json = c["extra"].dump();
  return inputs;
}

// Renders every case of a goldens file and compares byte for byte.
void ExpectGoldens(const ChatTemplate& tmpl, const std::string& cases_path, size_t min_cases) {
  const std::vector<Json> cases = ReadJsonLines(cases_path);
  ASSERT_GE(cases.size(), min_cases);
  for (const Json& c : cases) {
    SCOPED_TRACE(c["id"].get<std::string>());
    Result<std::string> rendered = tmpl.Render(InputsOf(c));
    ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
    EXPECT_EQ(*rendered, c["rendered"].get<std::string>());
  }
}

TEST(ChatTemplateTest, Qwen3TemplateMatchesEveryGolden) {
  Result<ChatTemplate> tmpl =
      ChatTemplate::FromTokenizerConfig(ReadFile(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ExpectGoldens(*tmpl, kQwen3Dir + "/chat_cases.jsonl", 15);
}

TEST(ChatTemplateTest, Qwen3NextThinkingTemplateMatchesEveryGolden) {
  Result<ChatTemplate> base =
      ChatTemplate::FromTokenizerConfig(ReadFile(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  Result<ChatTemplate> tmpl =
      base->WithTemplate(ReadFile(kQwen3Dir + "/chat_template_qwen3_next_thinking.jinja"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ExpectGoldens(*tmpl, kQwen3Dir + "/chat_cases_qwen3_next_thinking.jsonl", 3);
}

TEST(ChatTemplateTest, TinyChatMLTemplateRendersAsTransformersDoes) {
  Result<ChatTemplate> tmpl =
      ChatTemplate::FromTokenizerConfig(ReadFile(kTinyDir + "/tokenizer_config.json"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs inputs;
  inputs.messages_json =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"}])";
  inputs.add_generation_prompt = true;
  EXPECT_EQ(*tmpl->Render(inputs),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n"
            "<|im_start|>assistant\n");
  inputs.messages_json =
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])";
  inputs.add_generation_prompt = false;
  EXPECT_EQ(*tmpl->Render(inputs),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n");
}

// The context transformers builds: special tokens only when set (bos_token null is undefined),
// tools and documents None, extra keys last.
TEST(ChatTemplateTest, ContextHoldsSpecialTokensAndExtras) {
  Result<ChatTemplate> base =
      ChatTemplate::FromTokenizerConfig(ReadFile(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  Result<ChatTemplate> tmpl = base->WithTemplate(
      "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|"
      "{{ additional_special_tokens[:2] }}|{{ tools }}|{{ documents }}|"
      "{{ add_generation_prompt }}|{{ enable_thinking }}|{{ messages|length }}|{{ custom.k }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs inputs;
  inputs.messages_json = R"([{"role": "user", "content": "x"}])";
  inputs.add_generation_prompt = true;
  inputs.extra_json = R"({"enable_thinking": false, "custom": {"k": 1.0}})";
  EXPECT_EQ(*tmpl->Render(inputs),
            "<|im_end|>|<|endoftext|>|False|['<|im_start|>', '<|im_end|>']|None|None|True|False|"
            "1|1.0");
  // Extra keys may override special tokens, as kwargs do in apply_chat_template.
  inputs.extra_json = R"({"eos_token": "</s>", "custom": {"k": 2}})";
  EXPECT_THAT(*tmpl->Render(inputs), ::testing::StartsWith("</s>|"));
}

TEST(ChatTemplateTest, ReadsNamedTemplatesAndAddedTokenObjects) {
  Result<ChatTemplate> tmpl = ChatTemplate::FromTokenizerConfig(R"({
    "bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"},
    "eos_token": "</s>",
    "additional_special_tokens": [{"content": "<extra>"}, "<more>"],
    "chat_template": [
      {"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "{{ bos_token }}{{ additional_special_tokens|join(',') }}"}
    ]
  })");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs inputs;
  inputs.messages_json = "[]";
  EXPECT_EQ(*tmpl->Render(inputs), "<s><extra>,<more>");
  EXPECT_EQ(tmpl->source(), "{{ bos_token }}{{ additional_special_tokens|join(',') }}");
}

TEST(ChatTemplateTest, BadConfigsAndInputsAreErrors) {
  EXPECT_THAT(ChatTemplate::FromTokenizerConfig("{").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ChatTemplate::FromTokenizerConfig(R"({"eos_token": "x"})").status().message(),
              HasSubstr("has no chat_template"));
  EXPECT_THAT(
      ChatTemplate::FromTokenizerConfig(R"({"chat_template": [{"name": "rag", "template": "x"}]})")
          .status()
          .message(),
      HasSubstr("no \"default\" entry (has: rag)"));
  EXPECT_THAT(ChatTemplate::FromTokenizerConfig(R"({"chat_template": "x", "eos_token": 5})")
                  .status()
                  .message(),
              HasSubstr("eos_token must be a string"));
  EXPECT_THAT(
      ChatTemplate::FromTokenizerConfig(R"({"chat_template": "{% if x %}"})").status().message(),
      HasSubstr("chat template: template syntax error at line 1"));

  Result<ChatTemplate> tmpl = ChatTemplate::Parse("{{ messages|length }}");
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateInputs inputs;
  inputs.messages_json = R"({"role": "user"})";
  EXPECT_THAT(tmpl->Render(inputs).status().message(), HasSubstr("must be a JSON array"));
  inputs.messages_json = "[";
  EXPECT_THAT(tmpl->Render(inputs).status().message(), HasSubstr("messages_json: not valid JSON"));
  inputs.messages_json = "[]";
  inputs.tools_json = "{}";
  EXPECT_THAT(tmpl->Render(inputs).status().message(), HasSubstr("tools_json must be"));
  inputs.tools_json = "null";
  inputs.extra_json = "[]";
  EXPECT_THAT(tmpl->Render(inputs).status().message(), HasSubstr("extra_json must be"));
  inputs.extra_json = R"({"messages": []})";
  EXPECT_THAT(tmpl->Render(inputs).status().message(), HasSubstr("'messages' collides"));
}

TEST(ChatTemplateTest, RaiseExceptionSurfacesTheTemplatesMessage) {
  Result<ChatTemplate> tmpl = ChatTemplate::Parse(
      "{%- for m in messages %}\n"
      "{%- if m.role == 'system' and not loop.first %}\n"
      "{{- raise_exception('System message must be at the beginning.') }}\n"
      "{%- endif %}\n"
      "{%- endfor %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs inputs;
  inputs.messages_json =
      R"([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])";
  Result<std::string> out = tmpl->Render(inputs);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "chat template: template error at line 3: System message must be at the beginning.");
}

// A Qwen3.5-style template exercises what the Qwen3 goldens do not: a macro whose output is
// trimmed, namespaces mutated inside the macro, content parts, loop.previtem/nextitem, tool-call
// arguments rendered per parameter with `x | tojson | safe if ... else x | string`.
TEST(ChatTemplateTest, RendersQwen35StyleConstructs) {
  Result<ChatTemplate> tmpl = ChatTemplate::Parse(R"({%- set image_count = namespace(value=0) %}
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or item.type == 'image' %}
                {%- set image_count.value = image_count.value + 1 %}
                {{- 'Picture ' ~ image_count.value ~ ': <|image_pad|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {%- set content = render_content(message.content)|trim %}
    {%- if message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- for tool_call in message.tool_calls if message.tool_calls is defined %}
            {%- set tool_call = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '\n<function=' + tool_call.name + '>\n' }}
            {%- for args_name, args_value in tool_call.arguments|items %}
                {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                {{- '<parameter=' + args_name + '>\n' + args_value + '\n</parameter>\n' }}
            {%- endfor %}
            {{- '</function>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %})");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs inputs;
  inputs.messages_json = R"([
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this? "}]},
    {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "look",
      "arguments": {"q": "cat <b>", "n": 2, "x": 1.0, "opts": {"deep": [1, "é"]}, "flag": true}}}]},
    {"role": "tool", "content": "a cat"},
    {"role": "tool", "content": "really"}
  ])";
  // Expected output from Python Jinja2 3.1.6 set up as transformers sets it up.
  EXPECT_EQ(*tmpl->Render(inputs),
            "<|im_start|>user\nPicture 1: <|image_pad|>  What is this?<|im_end|>\n"
            "<|im_start|>assistant\n\n<function=look>\n"
            "<parameter=q>\ncat <b>\n</parameter>\n"
            "<parameter=n>\n2\n</parameter>\n"
            "<parameter=x>\n1.0\n</parameter>\n"
            // |safe made args_value Markup, so `str + Markup` escaped the surrounding text.
            "&lt;parameter=opts&gt;\n{\"deep\": [1, \"é\"]}\n&lt;/parameter&gt;\n"
            "<parameter=flag>\nTrue\n</parameter>\n"
            "</function><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\na cat\n</tool_response>"
            "\n<tool_response>\nreally\n</tool_response><|im_end|>\n");
}

}  // namespace
}  // namespace moeserve::tokenizer
