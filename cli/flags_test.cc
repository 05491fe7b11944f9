#include "cli/flags.h"

#include <gtest/gtest.h>

namespace moeserve::cli {
namespace {

struct Parsed {
  std::string out = "x";
  int64_t seed = 7;
  double rate = 1.5;
  bool json = false;
};

FlagSet MakeFlags(Parsed* p) {
  FlagSet flags("moeserve test", "a test");
  flags.String("out", &p->out, "output");
  flags.Int("seed", &p->seed, "seed");
  flags.Double("rate", &p->rate, "rate");
  flags.Bool("json", &p->json, "json");
  return flags;
}

TEST(FlagsTest, ParsesAllForms) {
  Parsed p;
  FlagSet flags = MakeFlags(&p);
  ASSERT_TRUE(flags.Parse({"--out", "dir", "--seed=-3", "--rate", "2.25", "--json"}).ok());
  EXPECT_EQ(p.out, "dir");
  EXPECT_EQ(p.seed, -3);
  EXPECT_DOUBLE_EQ(p.rate, 2.25);
  EXPECT_TRUE(p.json);
  EXPECT_TRUE(flags.WasSet("seed"));
  EXPECT_FALSE(flags.help_requested());
}

TEST(FlagsTest, DefaultsStayWhenUnset) {
  Parsed p;
  FlagSet flags = MakeFlags(&p);
  ASSERT_TRUE(flags.Parse({}).ok());
  EXPECT_EQ(p.seed, 7);
  EXPECT_FALSE(flags.WasSet("seed"));
  EXPECT_NE(flags.Help().find("(default: 7)"), std::string::npos);
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "unknown flag --bogus"},
      {{"--seed"}, "--seed needs a value"},
      {{"--seed", "abc"}, "--seed: 'abc' is not an integer"},
      {{"--seed", "12x"}, "--seed: '12x' is not an integer"},
      {{"--seed", "99999999999999999999"}, "--seed"},
      {{"--rate", "fast"}, "--rate: 'fast' is not a number"},
      {{"--rate=inf"}, "--rate"},
      {{"--json=maybe"}, "--json: 'maybe' is not true or false"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--"}, "unexpected argument '--'"},
  };
  for (const Case& c : cases) {
    Parsed p;
    FlagSet flags = MakeFlags(&p);
    Status s = flags.Parse(c.args);
    ASSERT_FALSE(s.ok()) << c.expected;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
  }
}

TEST(FlagsTest, HelpStopsParsing) {
  Parsed p;
  FlagSet flags = MakeFlags(&p);
  ASSERT_TRUE(flags.Parse({"--help", "--bogus"}).ok());
  EXPECT_TRUE(flags.help_requested());
  EXPECT_NE(flags.Help().find("--out TEXT"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::cli
