// Tests of the interpreter's value model against Python's: float repr, str()/repr(), equality
// and ordering across types, dict key identity, json.dumps formatting, and the string helpers.
#include "jinja/value.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "jinja/json_value.h"
#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ValueTest, FloatsPrintLikePythonRepr) {
  EXPECT_EQ(FormatPyFloat(1.0), "1.0");
  EXPECT_EQ(FormatPyFloat(-2.0), "-2.0");
  EXPECT_EQ(FormatPyFloat(0.0), "0.0");
  EXPECT_EQ(FormatPyFloat(-0.0), "-0.0");
  EXPECT_EQ(FormatPyFloat(0.1), "0.1");
  EXPECT_EQ(FormatPyFloat(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatPyFloat(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatPyFloat(123.456), "123.456");
  EXPECT_EQ(FormatPyFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(FormatPyFloat(1e16), "1e+16");
  EXPECT_EQ(FormatPyFloat(1.5e16), "1.5e+16");
  EXPECT_EQ(FormatPyFloat(12345678901234567.0), "1.2345678901234568e+16");
  EXPECT_EQ(FormatPyFloat(0.0001), "0.0001");
  EXPECT_EQ(FormatPyFloat(0.00001), "1e-05");
  EXPECT_EQ(FormatPyFloat(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatPyFloat(1e300), "1e+300");
  EXPECT_EQ(FormatPyFloat(5e-324), "5e-324");
  EXPECT_EQ(FormatPyFloat(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(FormatPyFloat(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(FormatPyFloat(std::nan("")), "nan");
}

TEST(ValueTest, StrAndReprFollowPython) {
  EXPECT_EQ(ToStr(Value()), "");
  EXPECT_EQ(ToStr(Value::None()), "None");
  EXPECT_EQ(ToStr(Value::Bool(true)), "True");
  EXPECT_EQ(ToStr(Value::Int(-42)), "-42");
  EXPECT_EQ(ToStr(Value::Float(2.0)), "2.0");
  EXPECT_EQ(ToStr(Value::String("it's")), "it's");
  EXPECT_EQ(Repr(Value::String("it's")), "\"it's\"");
  EXPECT_EQ(Repr(Value::String("a'b\"c")), "'a\\'b\"c'");
  EXPECT_EQ(Repr(Value::String("tab\there\n\x01é")), "'tab\\there\\n\\x01é'");
  EXPECT_EQ(Repr(Value::String("<b>", /*markup=*/true)), "Markup('<b>')");
  EXPECT_EQ(Repr(Value::MakeList({Value::Int(1), Value::String("a"), Value::None()})),
            "[1, 'a', None]");
  EXPECT_EQ(Repr(Value::MakeList({Value::Int(1)}, ListKind::kTuple)), "(1,)");
  EXPECT_EQ(Repr(Value::MakeList({}, ListKind::kTuple)), "()");
  Dict d;
  d.Set(Value::String("b"), Value::Float(1.5));
  d.Set(Value::String("a"), Value::MakeList({}));
  EXPECT_EQ(Repr(Value::MakeDict(d)), "{'b': 1.5, 'a': []}");
}

TEST(ValueTest, EqualityAcrossNumericTypes) {
  EXPECT_TRUE(Equals(Value::Int(1), Value::Float(1.0)));
  EXPECT_TRUE(Equals(Value::Bool(true), Value::Int(1)));
  EXPECT_FALSE(Equals(Value::Int(1), Value::String("1")));
  EXPECT_FALSE(Equals(Value::Float(std::nan("")), Value::Float(std::nan(""))));
  EXPECT_TRUE(Equals(Value::Int(9007199254740993), Value::Int(9007199254740993)));
  // 2**53 + 1 is not representable as a double: Python compares exactly.
  EXPECT_FALSE(Equals(Value::Int(9007199254740993), Value::Float(9007199254740992.0)));
  EXPECT_FALSE(
      Equals(Value::MakeList({Value::Int(1)}), Value::MakeList({Value::Int(1)}, ListKind::kTuple)));
  EXPECT_TRUE(Equals(Value(), Value()));
  EXPECT_FALSE(Equals(Value(), Value::None()));
}

TEST(ValueTest, OrderingFollowsPythonAndRejectsMixedTypes) {
  EXPECT_EQ(*Compare(Value::Int(1), Value::Float(1.5), "<"), -1);
  EXPECT_EQ(*Compare(Value::String("b"), Value::String("a"), "<"), 1);
  EXPECT_EQ(*Compare(Value::String("é"), Value::String("z"), "<"), 1);  // code point order
  EXPECT_EQ(*Compare(Value::MakeList({Value::Int(1), Value::Int(2)}),
                     Value::MakeList({Value::Int(1)}), "<"),
            1);
  Result<int> mixed = Compare(Value::Int(1), Value::String("a"), "<");
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.status().message(),
              HasSubstr("'<' not supported between instances of 'int' and 'str'"));
}

TEST(ValueTest, DictKeepsInsertionOrderAndPythonKeyIdentity) {
  Dict d;
  d.Set(Value::String("z"), Value::Int(1));
  d.Set(Value::Int(1), Value::String("int"));
  d.Set(Value::String("a"), Value::Int(2));
  d.Set(Value::Float(1.0), Value::String("float"));  // same key as 1, value replaced in place
  d.Set(Value::String("z"), Value::Int(3));
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(Repr(Value::MakeDict(d)), "{'z': 3, 1: 'float', 'a': 2}");
  EXPECT_EQ(d.Find(Value::Bool(true))->AsString(), "float");
  EXPECT_EQ(d.Find("a")->AsInt(), 2);
  EXPECT_EQ(d.Find("missing"), nullptr);
}

TEST(ValueTest, TruthinessFollowsPython) {
  EXPECT_FALSE(Truthy(Value()));
  EXPECT_FALSE(Truthy(Value::None()));
  EXPECT_FALSE(Truthy(Value::Int(0)));
  EXPECT_FALSE(Truthy(Value::Float(0.0)));
  EXPECT_FALSE(Truthy(Value::String("")));
  EXPECT_FALSE(Truthy(Value::MakeList({})));
  EXPECT_FALSE(Truthy(Value::MakeDict(Dict())));
  EXPECT_TRUE(Truthy(Value::String("0")));
  EXPECT_TRUE(Truthy(Value::Float(0.5)));
}

TEST(ValueTest, JsonMatchesPythonJsonDumps) {
  Result<Value> v = ParseJsonValue(
      R"({"name": "Zoë 😀", "n": [1, 2.0, -0.5, 1e100, null, true], "nested": {"q": "a\"b\\c\n\u0001"}})",
      "test");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*ToJson(*v, JsonOptions()),
            R"({"name": "Zoë 😀", "n": [1, 2.0, -0.5, 1e+100, null, true], )"
            R"("nested": {"q": "a\"b\\c\n\u0001"}})");
  JsonOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(*ToJson(Value::String("Zoë 😀\x7f"), ascii), R"("Zo\u00eb \ud83d\ude00\u007f")");
  JsonOptions indented;
  indented.indent = "  ";
  indented.item_separator = ",";
  EXPECT_EQ(*ToJson(*ParseJsonValue(R"({"a": [1, {}], "b": []})", "test"), indented),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(*ToJson(Value::Float(std::numeric_limits<double>::infinity()), JsonOptions()),
            "Infinity");
  EXPECT_FALSE(ToJson(Value(), JsonOptions()).ok());
}

TEST(ValueTest, JsonInputKeepsIntsAndFloatsApart) {
  Result<Value> v = ParseJsonValue("[1, 1.0, 1e2, -0, 9223372036854775807]", "test");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(ToStr(*v), "[1, 1.0, 100.0, 0, 9223372036854775807]");
  EXPECT_THAT(ParseJsonValue("[18446744073709551615]", "test").status().message(),
              HasSubstr("does not fit in 64 bits"));
  EXPECT_THAT(ParseJsonValue("[1,", "msgs").status().message(), HasSubstr("msgs: not valid JSON"));
  std::string deep(kMaxValueDepth + 10, '[');
  deep += std::string(kMaxValueDepth + 10, ']');
  // Refused by the JSON reader's own limit (core/json.h, 128) before anything is built.
  EXPECT_THAT(ParseJsonValue(deep, "test").status().message(),
              HasSubstr("test: nests deeper than 128 levels"));
}

TEST(PyStringTest, SplitStripAndFindFollowPython) {
  EXPECT_THAT(PySplit("  a  b  ", std::nullopt, -1, false), ElementsAre("a", "b"));
  EXPECT_THAT(PySplit(" a b c ", std::nullopt, 1, false), ElementsAre("a", "b c "));
  EXPECT_THAT(PySplit(" a b c ", std::nullopt, 1, true), ElementsAre(" a b", "c"));
  EXPECT_THAT(PySplit("a,,b,", std::string(","), -1, false), ElementsAre("a", "", "b", ""));
  EXPECT_THAT(PySplit("a,b,c", std::string(","), 1, true), ElementsAre("a,b", "c"));
  EXPECT_THAT(PySplitLines("a\r\nb\rc\n\nd", false), ElementsAre("a", "b", "c", "", "d"));
  EXPECT_EQ(PyStrip("\u3000 x\t\n", std::nullopt, true, true), "x");
  EXPECT_EQ(PyStrip("xyaxy", std::string("xy"), true, false), "axy");
  EXPECT_EQ(PyFind("héllo", "l", 0, INT64_MAX, false), 2);
  EXPECT_EQ(PyFind("héllo", "l", 0, INT64_MAX, true), 3);
  EXPECT_EQ(PyFind("abc", "c", -1, INT64_MAX, false), 2);
  EXPECT_EQ(PyCount("aaaa", "aa", 0, INT64_MAX), 2);
  EXPECT_EQ(PyReplace("abc", "", "-", -1), "-a-b-c-");
}

TEST(PyStringTest, CaseMappingUsesFullUnicodeMappings) {
  EXPECT_EQ(PyUpper("straße"), "STRASSE");
  EXPECT_EQ(PyLower("ΟΔΟΣ ΣΑΣ"), "οδος σας");
  EXPECT_EQ(PyLower("İ"), "i\u0307");
  EXPECT_EQ(PyTitle("ǆemal ﬁsh"), "ǅemal Fish");
  EXPECT_EQ(PyCapitalize("éCOLE"), "École");
}

TEST(PyStringTest, SlicesAdjustLikePython) {
  int64_t start, stop;
  EXPECT_EQ(AdjustSlice(5, std::nullopt, std::nullopt, -1, &start, &stop), 5);
  EXPECT_EQ(start, 4);
  EXPECT_EQ(stop, -1);
  EXPECT_EQ(AdjustSlice(5, -2, std::nullopt, 1, &start, &stop), 2);
  EXPECT_EQ(start, 3);
  EXPECT_EQ(AdjustSlice(5, 10, 20, 1, &start, &stop), 0);
  EXPECT_EQ(AdjustSlice(5, std::nullopt, std::nullopt, 2, &start, &stop), 3);
  EXPECT_EQ(AdjustSlice(0, std::nullopt, std::nullopt, -1, &start, &stop), 0);
}

}  // namespace
}  // namespace moeserve::jinja
