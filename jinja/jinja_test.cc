// Unit tests of the Jinja interpreter, construct by construct. The expected outputs of the
// table-driven tests are what Python Jinja2 3.1 renders when configured as transformers configures
// it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, transformers'
// tojson and raise_exception), with the shared context below.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "jinja/json_value.h"
#include "jinja/template.h"

namespace moeserve::jinja {
namespace {

using ::testing::HasSubstr;

constexpr char kContextJson[] = R"json(
{"d": {"a": 1, "b": [1, 2]}, "s": "héllo", "n": null, "l": [3, 1, 2], "f": 1.5, "i": 7,
 "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}],
 "e": "", "t": true, "z": 0, "nested": {"x": {"y": [1, {"z": "é"}]}}}
)json";

Template::Context MakeContext(std::string_view json) {
  Result<Value> v = ParseJsonValue(json, "context");
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  Template::Context context;
  for (const auto& [key, value] : v->AsDict().entries()) {
    context.emplace_back(key.AsString(), value);
  }
  return context;
}

// The rendered text, or "ERROR: <message>".
std::string Render(std::string_view source, std::string_view context_json = kContextJson) {
  Result<Template> t = Template::Parse(source);
  if (!t.ok()) return "ERROR: " + t.status().message();
  Result<std::string> out = t->Render(MakeContext(context_json));
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

struct Case {
  std::string_view source;
  std::string_view expected;
};

void ExpectRenders(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    EXPECT_EQ(Render(c.source), c.expected) << "template: " << c.source;
  }
}

// Parsing fails with a message that contains `expected`.
void ExpectParseError(std::string_view source, std::string_view expected) {
  Result<Template> t = Template::Parse(source);
  ASSERT_FALSE(t.ok()) << "parsed: " << source;
  EXPECT_THAT(t.status().message(), HasSubstr(std::string(expected))) << "template: " << source;
}

// Parsing succeeds and rendering fails with a message that contains `expected`.
void ExpectRenderError(std::string_view source, std::string_view expected) {
  Result<Template> t = Template::Parse(source);
  ASSERT_TRUE(t.ok()) << t.status().ToString() << "\ntemplate: " << source;
  Result<std::string> out = t->Render(MakeContext(kContextJson));
  ASSERT_FALSE(out.ok()) << "rendered: " << *out << "\ntemplate: " << source;
  EXPECT_THAT(out.status().message(), HasSubstr(std::string(expected))) << "template: " << source;
}

TEST(JinjaRenderTest, Whitespace) {
  ExpectRenders({
      {"  {% if true %}\n  x\n  {% endif %}\n", "  x\n"},
      {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
      {"{% for m in msgs %}\n  {{ m.role }}\n{% endfor %}\n", "  user\n  assistant\n"},
      {"  {#- c -#}  x {# c #}\ny", "x y"},
      {"{% raw %}{{ x }}{% endraw %}\n{%- raw -%}  {{ y }}  {%- endraw -%} z", "{{ x }}{{ y }}z"},
      {"  {%+ if true %}x{% endif %}", "  x"},
      {"{% if true +%}\nx{% endif %}", "\nx"},
      {"line1\n    {% set a = 1 %}\n  {{ a }}", "line1\n  1"},
      {"x\r\ny\rz\n", "x\ny\nz"},
      {"{{ 'a' }}\n", "a"},
      {"{{ 'a' }}\n\n", "a\n"},
      {"{{- ' a ' -}}  \n  {{ 'b' }}", " a b"},
      {"a\n{# comment #}\nb", "a\nb"},
      {"\t{% if true %}tab{% endif %}\t\n", "tab\t"},
      {"x {% if true %}\ny{% endif %}", "x y"},
  });
}

TEST(JinjaRenderTest, Literals) {
  ExpectRenders({
      {"{{ 1 }}|{{ -3 }}|{{ 1.0 }}|{{ 2.50 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ "
       "1.5e-7 }}|{{ -0.0 }}",
       "1|-3|1.0|2.5|1e+16|1000000000000000.0|1e-05|0.0001|1.5e-07|-0.0"},
      {"{{ 0.1 + 0.2 }}|{{ 10 / 2 }}|{{ 1 / 3 }}|{{ 12345678901234567.0 }}|{{ 1e22 }}|{{ "
       "1.7976931348623157e308 }}|{{ 5e-324 }}",
       "0.30000000000000004|5.0|0.3333333333333333|1.2345678901234568e+16|1e+22|1."
       "7976931348623157e+308|5e-324"},
      {"{{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1_0.5 }}|{{ 1E3 }}",
       "1000|31|15|5|10.5|1000.0"},
      {"{{ 'it''s' }}|{{ \"a\\tb\" }}|{{ \"\\u00e9\\x41\\101\" }}|{{ 'un\\known' }}|{{ 'a' \"b\" "
       "'c' }}",
       "its|a\tb|éAA|un\\known|abc"},
      {"{{ [1, 'a', none, true, false, 1.5] }}|{{ (1,) }}|{{ (1, 2) }}|{{ () }}|{{ {'k': \"it's\", "
       "'q': 'say \"hi\"'} }}",
       "[1, 'a', None, True, False, 1.5]|(1,)|(1, 2)|()|{'k': \"it's\", 'q': 'say \"hi\"'}"},
      {"{{ none }}|{{ None }}|{{ true }}|{{ True }}|{{ False }}|{{ u }}|{{ [u] }}",
       "None|None|True|True|False||[Undefined]"},
      {"{{ 'a\\nb' }}|{{ ['a\\nb\\\\', '\\x01é'] }}", "a\nb|['a\\nb\\\\', '\\x01é']"},
  });
}

TEST(JinjaRenderTest, Arithmetic) {
  ExpectRenders({
      {"{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 // -2 }}|{{ 7.5 // 2 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ -5.5 "
       "% 2 }}|{{ 5.5 % 2 }}",
       "3|-4|-4|3.0|2|-2|0.5|1.5"},
      {"{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ (-2) ** 2 }}|{{ 2 ** 0.5 "
       "}}|{{ 4 ** 0.5 }}",
       "1024|0.5|64|4|4|1.4142135623730951|2.0"},
      {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 - 2 - 1 }}|{{ 1 + 1.0 }}|{{ true + 1 }}|{{ 3 * 1.5 "
       "}}|{{ -i }}|{{ +i }}",
       "7|9|4|2.0|2|4.5|-7|7"},
      {"{{ 'a' * 3 }}|{{ 3 * 'ab' }}|{{ [1] * 2 }}|{{ 'a' * 0 }}|{{ [1, 2] + [3] }}|{{ (1,) + (2,) "
       "}}|{{ 'a' + 'b' }}",
       "aaa|ababab|[1, 1]||[1, 2, 3]|(1, 2)|ab"},
      {"{{ 'a' ~ 1 ~ 2.0 ~ none ~ true ~ [1] ~ u }}|{{ 1 ~ 2 }}", "a12.0NoneTrue[1]|12"},
  });
}

TEST(JinjaRenderTest, Comparisons) {
  ExpectRenders({
      {"{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' != 'b' }}{{ [1] == [1] }}{{ (1, 2) == [1, 2] }}{{ "
       "{'a': 1} == {'a': 1} }}{{ none == none }}{{ u == u }}{{ u == none }}",
       "TrueTrueTrueTrueFalseTrueTrueTrueFalse"},
      {"{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 2 >= 2.0 }}{{ 1 <= 0 "
       "}}",
       "TrueFalseTrueTrueTrueFalse"},
      {"{{ 3 in [1, 2, 3] }}{{ 'x' not in 'abc' }}{{ 'a' in {'a': 1} }}{{ 'é' in s }}{{ 'b' in d "
       "}}{{ 1 in (1, 2) }}{{ 'a' in u }}",
       "TrueTrueTrueTrueTrueTrueFalse"},
      {"{{ not true }}{{ not n }}{{ not not 1 }}{{ true and 'x' }}{{ 0 or 'y' }}{{ '' or none }}{{ "
       "0 and 1 }}{{ 1 or x.y }}",
       "FalseTrueTruexyNone01"},
      {"{{ 1 if true else 2 }}{{ 1 if false else 2 }}{{ 'a' if n is none else 'b' }}[{{ 'x' if "
       "false }}]{{ 1 if 0 else 2 if 0 else 3 }}",
       "12a[]3"},
  });
}

TEST(JinjaRenderTest, Subscript) {
  ExpectRenders({
      {"{{ d.a }}{{ d['a'] }}{{ d.b.0 }}{{ d.b[1] }}{{ d.b[-1] }}[{{ d.b.5 }}][{{ d.zz }}][{{ n.x "
       "}}][{{ l[10] }}]",
       "11122[][][][]"},
      {"{{ nested.x.y[1].z }}{{ nested['x']['y'][1]['z'] }}{{ msgs[1].tool_calls[0].function.name "
       "}}{{ (msgs|last).role }}",
       "ééfassistant"},
      {"{{ 'abc'[0] }}{{ 'abc'[-1] }}[{{ 'abc'[5] }}]{{ s[1] }}{{ [1, 2, 3,][0] }}{{ {'a': "
       "1,}['a'] }}{{ (1, 2,)[1] }}",
       "ac[]é112"},
      {"{{ d['items'] is defined }}{{ d.keys is callable }}{{ d.zz is defined }}{{ "
       "msgs[0].tool_calls is undefined }}",
       "TrueTrueFalseTrue"},
  });
}

TEST(JinjaRenderTest, Slicing) {
  ExpectRenders({
      {"{{ s[::-1] }}|{{ s[1:3] }}|{{ 'abcdef'[::2] }}|{{ 'abcdef'[5:1:-2] }}|{{ 'abc'[1:] }}|{{ "
       "'abc'[:-1] }}|{{ 'abc'[-2:] }}",
       "olléh|él|ace|fd|bc|ab|bc"},
      {"{{ l[::-1] }}|{{ l[1:] }}|{{ l[:1] }}|{{ l[-2:] }}|{{ l[::-2] }}|{{ l[10:] }}|{{ (1, 2, "
       "3)[1:] }}|{{ l[-100:100] }}",
       "[2, 1, 3]|[1, 2]|[3]|[1, 2]|[2, 3]|[]|(2, 3)|[3, 1, 2]"},
      {"{{ range(10)[2:8:2] }}|{{ range(10)[::-1]|list }}|{{ range(5)[::-2] }}",
       "range(2, 8, 2)|[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]|range(4, -1, -2)"},
      {"{% for m in msgs[::-1] %}{{ m.role }}{% endfor %}", "assistantuser"},
  });
}

TEST(JinjaRenderTest, If) {
  ExpectRenders({
      {"{% if n %}a{% elif z %}b{% elif i > 5 %}c{% else %}d{% endif %}", "c"},
      {"{% if false %}a{% else %}b{% endif %}{% if e %}x{% endif %}{% if l %}y{% endif %}{% if d "
       "%}z{% endif %}",
       "byz"},
      {"{% if u is defined and u.x %}bad{% else %}ok{% endif %}", "ok"},
  });
}

TEST(JinjaRenderTest, For) {
  ExpectRenders({
      {"{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ "
       "loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }} {% endfor %}",
       "1032TrueFalse3:3 2121FalseFalse3:1 3210FalseTrue3:2 "},
      {"{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", "[|1][3|2][1|]"},
      {"{% for x in l %}{{ loop.cycle('a', 'b') }}{% endfor %}{% for x in [1, 1, 2, 2, 1] %}{{ "
       "loop.changed(x) }}{% endfor %}",
       "abaTrueFalseTrueFalseTrue"},
      {"{% for x in [] %}x{% else %}empty{% endfor %}{% for x in u %}x{% else %}undef{% endfor %}",
       "emptyundef"},
      {"{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}={{ x }} {% endfor %}",
       "1/2=3 2/2=2 "},
      {"{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for k, v in d|items %}{{ k "
       "}}={{ v }};{% endfor %}",
       "37a=1;b=[1, 2];"},
      {"{% for (a, b), c in [[[1, 2], 3]] %}{{ a }}{{ b }}{{ c }}{% endfor %}", "123"},
      {"{% for k in d %}{{ k }}{% endfor %}{% for c in 'héy' %}{{ c }}-{% endfor %}", "abh-é-y-"},
      {"{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x "
       "in range(5) %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}",
       "012|024"},
      {"{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{{ x }}{{ y }};{% endfor %}{{ "
       "loop.index }}{% endfor %}",
       "113;214;1123;224;2"},
      {"{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{{ loop|length }}{% endfor %}", "101"},
  });
}

TEST(JinjaRenderTest, Set) {
  ExpectRenders({
      // Loop bodies, macros, set blocks and filter blocks are frames of their own; if is not.
      {"{% filter upper %}{% set x = 1 %}{% endfilter %}[{{ x }}]", "[]"},
      {"{% set y %}{% set x = 1 %}{% endset %}[{{ x }}]", "[]"},
      {"{% macro m() %}{% set x = 1 %}{% endmacro %}{{ m() }}[{{ x }}]", "[]"},
      {"{% set l2 = [1, 2] %}{% for i in l2 %}{% set l2 = [9] %}{{ l2 }}{% endfor %}{{ l2 }}",
       "[9][9][1, 2]"},
      {"{% set x = 5 %}{% macro m(x) %}{{ x }}{% endmacro %}{{ m(1) }}{{ x }}", "15"},
      {"{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
       "12121"},
      {"{% set ns = namespace(total=0, items=[]) %}{% for x in l %}{% set ns.total = ns.total + x "
       "%}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.total }}{{ ns.items }}",
       "6[3, 1, 2]"},
      {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, e = 'xy' %}{{ c }}{{ e }}{% set t = 1, 2 %}{{ "
       "t }}",
       "12xy(1, 2)"},
      {"{% set x %}  block {{ 1 }} {% endset %}[{{ x }}]{% set y | upper | trim %} abc {% endset "
       "%}[{{ y }}]",
       "[  block 1 ][ABC]"},
      {"{% if true %}{% set inner = 'set in if' %}{% endif %}{{ inner }}", "set in if"},
      {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "3[]"},
      {"{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}[{{ ns.c }}]{{ ns }}",
       "12[]<Namespace {'a': 1, 'b': 2}>"},
  });
}

TEST(JinjaRenderTest, Macros) {
  ExpectRenders({
      {"{% macro m(a, b=2) %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(b=5, a=4) "
       "}}{{ m() }}",
       "[12][13][45][2]"},
      {"{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(3) }}", "6"},
      {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}",
       "1(2, 3){'x': 4}"},
      {"{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}body{% endcall %}", "[body]"},
      {"{% macro m(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% "
       "call(x) m([1, 2]) %}<{{ x }}>{% endcall %}",
       "<1><2>"},
      {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
       "321"},
      {"{% macro f() %}{{ x }}{% endmacro %}{% set x = 5 %}{{ f() }}", "5"},
      {"{% macro f() %}  text  {% endmacro %}[{{ f() }}][{{ f()|trim }}]{{ f is callable }}",
       "[  text  ][text]True"},
      {"{% set counter = namespace(n=0) %}{% macro bump() %}{% set counter.n = counter.n + 1 %}{% "
       "endmacro %}{{ bump() }}{{ bump() }}{{ counter.n }}",
       "2"},
  });
}

TEST(JinjaRenderTest, Filters) {
  ExpectRenders({
      {"{{ -3|abs }}{{ -3.5|abs }}{{ 'hello world'|capitalize }}{{ 'hello'|center(11) }}|{{ "
       "'x'|default('y') }}{{ u|default('y') }}{{ ''|default('y', true) }}{{ n|default('y') }}{{ "
       "u|d }}",
       "33.5Hello world   hello   |xyyNone"},
      {"{{ d|dictsort }}{{ {'b': 1, 'a': 2}|dictsort(by='value') }}{{ {'B': 1, 'a': 2}|dictsort "
       "}}{{ {'B': 1, 'a': 2}|dictsort(true) }}",
       "[('a', 1), ('b', [1, 2])][('b', 1), ('a', 2)][('a', 2), ('B', 1)][('B', 1), ('a', 2)]"},
      {"{{ '<a href=\"x\">'|e }}{{ '<b>'|escape }}{{ 'a'|e|e }}{{ '<x>'|forceescape }}{{ "
       "\"'\\\"&\"|escape }}",
       "&lt;a href=&#34;x&#34;&gt;&lt;b&gt;a&lt;x&gt;&#39;&#34;&amp;"},
      {"{{ l|first }}[{{ []|first }}]{{ 'abc'|first }}{{ l|last }}{{ d|first }}", "3[]a2a"},
      {"{{ 3|float }}{{ '1e3'|float }}{{ 'x'|float }}{{ '2.5'|float(1) }}{{ '3.5'|int }}{{ 'x'|int "
       "}}{{ 2.7|int }}{{ '0x1A'|int(base=16) }}{{ ' 12 '|int }}{{ 'x'|int(-1) }}{{ true|int }}",
       "3.01000.00.02.53022612-11"},
      {"{{ \"a\\nb\\n\"|indent(2) }}|{{ \"a\\n\\nb\"|indent(2, true, true) }}|{{ "
       "\"a\\nb\"|indent('> ', first=true) }}",
       "a\n  b\n|  a\n  \n  b|> a\n> b"},
      {"{{ d|items|list }}{{ u|items|list }}{{ l|join('-') }}{{ l|join }}{{ msgs|join(', ', "
       "attribute='role') }}",
       "[('a', 1), ('b', [1, 2])][]3-1-2312user, assistant"},
      {"{{ l|length }}{{ d|length }}{{ 'héé'|length }}{{ u|length }}{{ d|count }}{{ 'abc'|list "
       "}}{{ d|list }}",
       "32302['a', 'b', 'c']['a', 'b']"},
      {"{{ 'HeLLo'|lower }}{{ 'HeLLo'|upper }}{{ \"it's-a test(x)\"|title }}{{ 'ab'|reverse }}{{ "
       "l|reverse|list }}",
       "helloHELLOIt's-A Test(X)ba[2, 1, 3]"},
      {"{{ msgs|map(attribute='role')|join(',') }}{{ ['a', 'b']|map('upper')|list }}{{ [1, "
       "2]|map('string')|list }}{{ msgs|map(attribute='x', default='-')|list }}",
       "user,assistant['A', 'B']['1', '2']['-', '-']"},
      {"{{ [1, 2, 3, 4]|select('odd')|list }}{{ [1, 2, 3, 4]|reject('odd')|list }}{{ [0, 1, '', "
       "'a']|select|list }}{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}{{ "
       "msgs|rejectattr('tool_calls')|map(attribute='content')|list }}{{ "
       "msgs|selectattr('tool_calls', 'defined')|list|length }}",
       "[1, 3][2, 4][1, 'a']1['hi']1"},
      {"{{ l|max }}{{ l|min }}{{ ['b', 'A']|max }}{{ ['b', 'A']|max(case_sensitive=true) }}{{ "
       "msgs|max(attribute='role') }}[{{ []|max }}]",
       "31bb{'role': 'user', 'content': 'hi'}[]"},
      {"{{ 'a=%s b=%d'|format('x', 3) }}{{ '%(k)s'|format(k='v') }}{{ "
       "'%05.1f|%-4d|%+d|%x|%o|%X|%e|%g|%r|%c|%%' % (3.14159, 42, 5, 255, 8, 255, 12345.678, "
       "0.0001, 'a', 65) }}",
       "a=x b=3v003.1|42  |+5|ff|10|FF|1.234568e+04|0.0001|'a'|A|%"},
      {"{{ 'aaa'|replace('a', 'b') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ 12|replace('1', 'x') }}",
       "bbbbbax2"},
      {"{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 3|round }}{{ -2.5|round }}{{ "
       "2.1|round(0, 'ceil') }}{{ 2.9|round(0, 'floor') }}{{ 1234|round(-2) }}",
       "2.04.02.673-2.03.02.01200"},
      {"{{ '<b>'|safe }}{{ ('<'|safe) + '<' }}{{ '<' + ('<'|safe) }}{{ ('<'|safe) ~ '<' }}{{ "
       "('a'|safe) is escaped }}",
       "<b><&lt;&lt;<<<True"},
      {"{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'a']|sort }}{{ ['b', "
       "'A', 'a']|sort(case_sensitive=true) }}{{ [{'n': 2}, {'n': "
       "1}]|sort(attribute='n')|map(attribute='n')|list }}",
       "[1, 2, 3][3, 2, 1]['A', 'a', 'b']['A', 'a', 'b'][1, 2]"},
      {"{{ 1|string }}{{ none|string }}{{ [1]|string }}{{ 1.0|string }}{{ [1.5, 2]|sum }}{{ [[1], "
       "[2]]|sum(start=[]) }}{{ msgs|sum(attribute='x', start=0) if false else 0 }}",
       "1None[1]1.03.5[1, 2]0"},
      {"{{ ' x '|trim }}|{{ 'xax'|trim('x') }}|{{ 'a b c d e f g'|truncate(9) }}|{{ "
       "'abcdefghijklmnop'|truncate(9, true) }}|{{ [1, 1, 2, 'a', 'A']|unique|list }}|{{ 'abc "
       "def'|wordcount }}",
       "x|a|a b c d e f g|abcdef...|[1, 2, 'a']|2"},
      {"{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3, 4, 5]|batch(2, 'x')|list }}{{ [1, 2, 3, 4, "
       "5]|slice(2)|list }}{{ [1, 2, 3, 4, 5]|slice(3, 0)|list }}",
       "[[1, 2], [3, 4], [5]][[1, 2], [3, 4], [5, 'x']][[1, 2, 3], [4, 5]][[1, 2], [3, 4], [5, "
       "0]]"},
      {"{{ d|attr('a') }}|{{ 'x'|attr('upper') is callable }}", "|True"},
      {"{% filter upper %}hello {{ s }}{% endfilter %}", "HELLO HÉLLO"},
  });
}

TEST(JinjaRenderTest, ToJson) {
  ExpectRenders({
      {"{{ d|tojson }}{{ msgs|tojson }}",
       "{\"a\": 1, \"b\": [1, 2]}[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
       "\"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
       "\"arguments\": {\"x\": 1}}}]}]"},
      {"{{ {'a': 'é😀', 'b': [1, 2.0, none, true, 1.5e300], 'c': {'d': "
       "'\\n\"\\\\/\\t\\u0001'}}|tojson }}",
       "{\"a\": \"é😀\", \"b\": [1, 2.0, null, true, 1.5e+300], \"c\": {\"d\": "
       "\"\\n\\\"\\\\/\\t\\u0001\"}}"},
      {"{{ {'a': 1, 'b': [1, {'x': 2}], 'e': [], 'f': {}}|tojson(indent=2) }}",
       "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    {\n      \"x\": 2\n    }\n  ],\n  \"e\": [],\n  "
       "\"f\": {}\n}"},
      {"{{ [1, [2]]|tojson(indent='\\t') }}{{ [1, 2]|tojson(indent=0) }}{{ {'b': 1, 'a': {'d': 1, "
       "'c': 2}}|tojson(sort_keys=true) }}{{ [1, {'a': 2}]|tojson(separators=(',', ':')) }}",
       "[\n\t1,\n\t[\n\t\t2\n\t]\n][\n1,\n2\n]{\"a\": {\"c\": 2, \"d\": 1}, \"b\": "
       "1}[1,{\"a\":2}]"},
      {"{{ 'é😀\\x7f'|tojson(ensure_ascii=true) }}{{ 'é😀\\x7f'|tojson }}{{ (1, 2)|tojson }}{{ "
       "1.0|tojson }}{{ 10|tojson }}{{ none|tojson }}{{ 'x'|tojson }}",
       "\"\\u00e9\\ud83d\\ude00\\u007f\"\"é😀\x7f"
       "\"[1, 2]1.010null\"x\""},
      {"{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'}|tojson }}{{ [1e16, 1e-5, -0.0, 123.456]|tojson "
       "}}",
       "{\"1\": \"b\", \"null\": \"c\", \"1.5\": \"d\"}[1e+16, 1e-05, -0.0, 123.456]"},
  });
}

TEST(JinjaRenderTest, Tests) {
  ExpectRenders({
      {"{{ x is defined }}{{ n is none }}{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ "
       "true is integer }}{{ true is number }}{{ 'a' is string }}{{ d is mapping }}{{ l is mapping "
       "}}",
       "FalseTrueTrueTrueTrueFalseTrueTrueTrueFalse"},
      {"{{ l is iterable }}{{ 1 is iterable }}{{ u is iterable }}{{ 's' is iterable }}{{ l is "
       "sequence }}{{ d is sequence }}{{ d.keys() is sequence }}{{ 1 is sequence }}",
       "TrueFalseTrueTrueTrueTrueFalseFalse"},
      {"{{ true is boolean }}{{ 0 is false }}{{ false is false }}{{ true is true }}{{ 1 is true "
       "}}{{ u is undefined }}{{ n is not none }}{{ 'x' is not string }}",
       "TrueFalseTrueTrueFalseTrueFalseFalse"},
      {"{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 2 is in "
       "[1, 2] }}{{ 'A' is upper }}{{ 'a' is lower }}{{ n is sameas none }}{{ l is sameas l }}",
       "TrueTrueTrueFalseTrueTrueTrueTrueTrue"},
      {"{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 1 is gt 0 }}{{ 1 is lt 0 }}{{ 1 is ne 2 }}{{ 1 is ge "
       "1 }}{{ 1 is le 0 }}{{ 2 is greaterthan 1 }}{{ 1 is lessthan 2 }}",
       "TrueFalseTrueFalseTrueTrueFalseTrueTrue"},
      {"{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}{{ range is callable }}{{ "
       "u is callable }}{{ 'a' is escaped }}{{ ('a'|e) is escaped }}",
       "TrueFalseTrueTrueTrueFalseTrue"},
  });
}

TEST(JinjaRenderTest, StringMethods) {
  ExpectRenders({
      {"{{ 'a,b'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ "
       "'a,b,c'.rsplit(',', 1) }}{{ 'aXbX'.split('X') }}{{ ' a b '.rsplit(None, 1) }}",
       "['a', 'b']['a', 'b']['a', 'b,c']['a,b', 'c']['a', 'b', ''][' a', 'b']"},
      {"{{ 'abc'.find('c') }}{{ 'abc'.find('z') }}{{ 'aaa'.count('a') }}{{ 'abc'.rfind('c') }}{{ "
       "'abcabc'.rindex('b') }}{{ 'abcabc'.index('c') }}{{ 'héllo'.find('l') }}",
       "2-132422"},
      {"{{ ' x '.strip() }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ "
       "'\\n\\nx\\n'.lstrip('\\n') }}|{{ '\\u3000x\\xa0'.strip() }}|",
       "x|x | x|a|x\n|x|"},
      {"{{ 'abc'.startswith('a') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.startswith('b', 1) "
       "}}{{ 'abc'.endswith('c') }}{{ 'abc'.endswith(('x', 'bc')) }}{{ 'abc'.endswith('b', 0, 2) "
       "}}",
       "TrueTrueTrueTrueTrueTrue"},
      {"{{ 'aaa'.replace('a', 'b', 2) }}{{ 'abc'.replace('', '-') }}{{ ''.join(['a', 'b']) }}{{ "
       "'-'.join('abc') }}{{ ', '.join(d) }}",
       "bba-a-b-c-aba-b-ca, b"},
      {"{{ 'Hello World'.lower() }}{{ 'hello'.upper() }}{{ 'hello'.capitalize() }}{{ \"it's-a "
       "test(x)\".title() }}{{ 'Ab'.swapcase() }}{{ 'ß'.upper() }}{{ 'ΟΔΟΣ'.lower() }}",
       "hello worldHELLOHelloIt'S-A Test(X)aBSSοδος"},
      {"{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'a\\nb\\n'.splitlines(true) }}{{ "
       "'a-b-c'.rpartition('-') }}{{ 'x'.partition('-') }}{{ 'abc'.removeprefix('a') }}{{ "
       "'abc'.removesuffix('c') }}",
       "['a', 'b', 'c']['a\\n', 'b\\n']('a-b', '-', 'c')('x', '', '')bcab"},
      {"{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}|{{ 'ab'.center(6, '*') }}|{{ '5'.zfill(3) "
       "}}|{{ '-5'.zfill(4) }}",
       "ab..|  ab|**ab**|005|-005"},
      {"{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}{{ 'ab1'.isalnum() }}{{ ' '.isspace() }}{{ "
       "'abc'.islower() }}{{ 'ABC'.isupper() }}{{ ''.isalpha() }}",
       "TrueTrueTrueTrueTrueTrueFalse"},
      {"{{ msgs[0].content.startswith('h') and msgs[0].content.endswith('i') }}{{ '</think>' in "
       "'a</think>b' }}{{ 'x</think>\\n\\ny'.split('</think>')[-1].lstrip('\\n') }}",
       "TrueTruey"},
  });
}

TEST(JinjaRenderTest, DictAndListMethods) {
  ExpectRenders({
      {"{{ d.get('a') }}{{ d.get('z', 5) }}{{ d.get('z') }}{{ d.keys() }}{{ d.values() }}{{ "
       "d.items() }}{{ d.values()|list }}{{ d.copy() }}",
       "15Nonedict_keys(['a', 'b'])dict_values([1, [1, 2]])dict_items([('a', 1), ('b', [1, "
       "2])])[1, [1, 2]]{'a': 1, 'b': [1, 2]}"},
      {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list|length }}",
       "a=1;b=[1, 2];2"},
      {"{{ [1, 2, 1].count(1) }}{{ [1, 2, 3].index(2) }}{{ (1, 2).count(2) }}{{ [1, 2].copy() }}",
       "211[1, 2]"},
  });
}

TEST(JinjaRenderTest, Globals) {
  ExpectRenders({
      {"{{ range(3) }}{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ "
       "range(0)|list }}{{ range(1, 10, 3) }}",
       "range(0, 3)[0, 1, 2][1, 4, 7][5, 3, 1][]range(1, 10, 3)"},
      {"{{ dict(a=1) }}{{ dict([('a', 1)]) }}{{ dict({'a': 1}, b=2) }}{{ namespace(a=1) }}",
       "{'a': 1}{'a': 1}{'a': 1, 'b': 2}<Namespace {'a': 1}>"},
  });
}

// transformers' AssistantTracker adds {% generation %}, which renders its body unchanged (it only
// records which characters the assistant produced); {% print %} is core Jinja.
TEST(JinjaRenderTest, GenerationAndPrintTags) {
  ExpectRenders({
      {"{% for m in msgs %}{% generation %}{{ m.role }};{% endgeneration %}{% endfor %}",
       "user;assistant;"},
      {"{% print 'a' ~ 1 %}{% print d.b %}", "a1[1, 2]"},
  });
}

TEST(JinjaErrorTest, MalformedTemplatesNameTheProblem) {
  ExpectParseError("{{ x", "'{{' is never closed with '}}'");
  ExpectParseError("a\n{% if x", "line 2: unexpected end of template: '{%' is never closed");
  ExpectParseError("{# abc", "missing end of comment tag");
  ExpectParseError("{% raw %}abc", "missing end of raw directive");
  ExpectParseError("{{ 'abc }}", "unterminated string literal");
  ExpectParseError("{% if x %}a", "the 'if' block opened at line 1 is never closed");
  ExpectParseError("{% for x in y %}\n{{ x }}", "the 'for' block opened at line 1 is never closed");
  ExpectParseError("{% macro m() %}", "the 'macro' block opened at line 1 is never closed");
  ExpectParseError("{% for x in y %}a{% endif %}", "unknown tag 'endif'");
  ExpectParseError("{% endfor %}", "unknown tag 'endfor'");
  ExpectParseError("{% foo %}", "unknown tag 'foo'");
  ExpectParseError("{{ x|nofilter }}", "no filter named 'nofilter'");
  ExpectParseError("{% if x is notest %}{% endif %}", "no test named 'notest'");
  ExpectParseError("{{ ) }}", "unexpected ')'");
  ExpectParseError("{{ (1 }}", "unexpected '}', expected ')'");
  ExpectParseError("{{ 1 + }}", "unexpected end of print statement");
  ExpectParseError("{{ a b }}", "expected end of print statement '}}', got 'b'");
  ExpectParseError("{{ }}", "expected an expression");
  ExpectParseError("{{ 1 ? 2 }}", "unexpected character '?'");
  ExpectParseError("{% set 1 = 2 %}", "can't assign to number 1");
  ExpectParseError("{% set true = 2 %}", "can't assign to the constant 'true'");
  ExpectParseError("{% macro m(a=1, b) %}{% endmacro %}", "non-default argument follows default");
  ExpectParseError("{{ f(a=1, 2) }}", "positional argument follows keyword argument");
  ExpectParseError("{% break %}", "'break' outside of a for loop");
  ExpectParseError("{% if true %}{% else %}{% else %}{% endif %}", "unknown tag 'else'");
  ExpectParseError("{{ '\\N{DASH}' }}", "\\N{...} escapes");
  ExpectParseError("{{ 99999999999999999999 }}", "does not fit in 64 bits");
}

TEST(JinjaErrorTest, UnsupportedConstructsAreNamed) {
  ExpectParseError("{% include 'x' %}", "the 'include' tag is not supported");
  ExpectParseError("{% extends 'x' %}", "the 'extends' tag is not supported");
  ExpectParseError("{% block b %}{% endblock %}", "the 'block' tag is not supported");
  ExpectParseError("{% do x %}", "the 'do' tag is not supported");
  ExpectParseError("{% for x in y recursive %}{% endfor %}",
                   "recursive for loops are not supported");
  ExpectParseError("{{ f(*args) }}", "*args and **kwargs in calls are not supported");
  ExpectParseError("{{ xs|groupby('a') }}", "the 'groupby' filter is not supported");
  ExpectRenderError("{{ '{}'.format(1) }}", "str.format() is not supported");
}

TEST(JinjaErrorTest, RuntimeErrorsNameTheProblemAndLine) {
  ExpectRenderError("\n\n{{ u.a }}", "template error at line 3: 'u' is undefined");
  ExpectRenderError("{{ d.zz.yy }}", "'dict object' has no attribute 'zz'");
  ExpectRenderError("{{ undefined_fn(1) }}", "'undefined_fn' is undefined");
  ExpectRenderError("{{ 'x'() }}", "'str' object is not callable");
  ExpectRenderError("{{ 1 / 0 }}", "division by zero");
  ExpectRenderError("{{ 1 // 0 }}", "integer division or modulo by zero");
  ExpectRenderError("{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'");
  ExpectRenderError("{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'");
  ExpectRenderError("{{ 1 in 'abc' }}", "'in <string>' requires string as left operand");
  ExpectRenderError("{% for x in 5 %}{% endfor %}", "'int' object is not iterable");
  ExpectRenderError("{% for x in n %}{% endfor %}", "'NoneType' object is not iterable");
  ExpectRenderError("{% set a, b = [1] %}", "not enough values to unpack (expected 2, got 1)");
  ExpectRenderError("{% set x = 1 %}{% set x.b = 2 %}", "not a namespace");
  ExpectRenderError("{{ [1, 2].append(3) }}",
                    "access to attribute 'append' of 'list' object is unsafe");
  ExpectRenderError("{{ d.update({}) }}",
                    "access to attribute 'update' of 'dict' object is unsafe");
  ExpectRenderError("{{ 'x'.zz() }}", "'str object' has no attribute 'zz'");
  ExpectRenderError("{{ ','.join(['a', 1]) }}",
                    "sequence item 1: expected str instance, int found");
  ExpectRenderError("{{ 'abc'.index('z') }}", "substring not found");
  ExpectRenderError("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}",
                    "macro 'f' takes not more than 1 argument(s)");
  ExpectRenderError("{% macro f(a) %}{% endmacro %}{{ f(b=2) }}",
                    "macro 'f' takes no keyword argument 'b'");
  ExpectRenderError("{{ u|tojson }}", "Object of type Undefined is not JSON serializable");
  ExpectRenderError("{{ [1, 'a']|sort }}",
                    "'<' not supported between instances of 'str' and 'int'");
  ExpectRenderError("{{ 1|length }}", "object of type 'int' has no len()");
  ExpectRenderError("{{ 'x'|indent(foo=1) }}", "indent() got an unexpected keyword argument 'foo'");
  ExpectRenderError("{{ 'x'|replace('a') }}", "replace() missing required argument 'new'");
  ExpectRenderError("{{ l[::0] }}", "slice step cannot be zero");
  ExpectRenderError("{{ range(100001) }}", "Range too big");
  ExpectRenderError("{{ '%s %s' % ('a',) }}", "not enough arguments for format string");
  ExpectRenderError("{{ 9223372036854775807 + 1 }}", "integer overflow");
}

TEST(JinjaErrorTest, RaiseExceptionSurfacesItsMessage) {
  ExpectRenderError(
      "{% if not n %}{{ raise_exception('System message must be first, got ' ~ i) }}"
      "{% endif %}",
      "System message must be first, got 7");
}

TEST(JinjaLimitsTest, HostileTemplatesFailCleanly) {
  const auto repeat = [](std::string_view s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  ExpectParseError("{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}",
                   "brackets nested more than");
  ExpectParseError("{{ " + repeat("a(", 5000) + repeat(")", 5000) + " }}",
                   "brackets nested more than");
  ExpectParseError("{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}",
                   "brackets nested more than");
  ExpectParseError("{{ 1" + repeat("+1", 50000) + " }}", "expression nested more than");
  ExpectParseError("{{ a" + repeat(".b", 50000) + " }}", "expression nested more than");
  ExpectParseError("{{ " + repeat("not ", 5000) + "1 }}", "too many nested 'not'");
  ExpectParseError("{{ " + repeat("- ", 5000) + "1 }}", "too many chained unary operators");
  ExpectParseError(repeat("{% if true %}", 1000) + repeat("{% endif %}", 1000),
                   "blocks nested more than");
  ExpectRenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                    "template recursion deeper than");
  ExpectRenderError(
      "{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
      "value nested more than");
  ExpectRenderError("{{ 'x' * 1000000000 }}", "result larger than");
  ExpectRenderError("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}",
                    "rendered output larger than");
}

TEST(JinjaTemplateTest, RendersRepeatedlyAndConcurrently) {
  Result<Template> t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}{% endfor %}"
      "{{ ns.n }}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Template::Context context = MakeContext(kContextJson);
  // A namespace created by one render must not leak into the next.
  EXPECT_EQ(*t->Render(context), "2");
  EXPECT_EQ(*t->Render(context), "2");
  std::vector<std::thread> threads;
  std::vector<std::string> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 50; ++k) results[i] = *t->Render(context);
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& r : results) EXPECT_EQ(r, "2");
}

// Macros stored in their own scope and namespaces stored in themselves are reference cycles;
// the interpreter breaks them after each render (the ASan build's leak checker verifies it).
TEST(JinjaTemplateTest, ReferenceCyclesDoNotLeak) {
  ExpectRenders({
      {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}", "True"},
      {"{% macro m() %}x{% endmacro %}{% set ns = namespace(m=m) %}{% set ns.m2 = m %}"
       "{{ ns.m() }}{{ ns.m2() }}",
       "xx"},
      {"{% for x in [1, 1, 2] %}{{ loop.changed(x, loop.index0 // 2) }}{% endfor %}",
       "TrueFalseTrue"},
      {"{% for i in range(3) %}{% macro m() %}{{ i }}{% endmacro %}"
       "{% set ns = namespace(f=m) %}{{ ns.f() }}{% endfor %}",
       "012"},
  });
}

TEST(JinjaTemplateTest, LaterContextEntriesWin) {
  Result<Template> t = Template::Parse("{{ a }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render({{"a", Value::Int(1)}, {"a", Value::Int(2)}}), "2");
}

TEST(JinjaTemplateTest, StrftimeNowFormatsTheLocalTime) {
  const std::string year = Render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u) << year;
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace
}  // namespace moeserve::jinja
