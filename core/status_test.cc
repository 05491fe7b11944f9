#include "core/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

namespace moeserve {
namespace {

TEST(StatusTest, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
  EXPECT_TRUE(OkStatus().ok());
}

TEST(StatusTest, FactoriesSetCodeAndFormatMessage) {
  const Status s = InvalidArgument("bad value {} for {}", 42, "n_experts");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad value 42 for n_experts");
  EXPECT_EQ(s.ToString(), "invalid argument: bad value 42 for n_experts");

  EXPECT_EQ(NotFound("x").code(), StatusCode::kNotFound);
  EXPECT_EQ(OutOfRange("x").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Unimplemented("x").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(Internal("x").code(), StatusCode::kInternal);
  EXPECT_EQ(IoError("x").code(), StatusCode::kIoError);
}

TEST(StatusTest, ToStringNamesEveryCode) {
  EXPECT_EQ(NotFound("tensor {}", "w1").ToString(), "not found: tensor w1");
  EXPECT_EQ(OutOfRange("i").ToString(), "out of range: i");
  EXPECT_EQ(Unimplemented("f8").ToString(), "unimplemented: f8");
  EXPECT_EQ(Internal("oops").ToString(), "internal error: oops");
  EXPECT_EQ(IoError("open").ToString(), "I/O error: open");
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "ok");
}

TEST(StatusTest, WithContextPrependsAndKeepsCode) {
  const Status s = NotFound("tensor w1").WithContext("model.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "model.safetensors: tensor w1");
  EXPECT_EQ(s.WithContext("load").ToString(), "not found: load: model.safetensors: tensor w1");
}

TEST(StatusTest, WithContextOnOkIsNoOp) {
  const Status s = OkStatus().WithContext("ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(ResultTest, HoldsValue) {
  Result<int> r = 7;
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 7);
  EXPECT_EQ(*r, 7);
  *r = 8;
  EXPECT_EQ(r.value(), 8);

  Result<std::string> s = std::string("hello");
  EXPECT_EQ(s->size(), 5u);
  const Result<std::string>& cs = s;
  EXPECT_EQ(*cs, "hello");
  EXPECT_EQ(cs->front(), 'h');
}

TEST(ResultTest, HoldsError) {
  const Result<int> r = OutOfRange("index {} past {}", 5, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(), "index 5 past 4");
}

TEST(ResultTest, OkStatusBecomesInternalError) {
  // A Result must hold a value or a reason; an OK status is neither.
  const Result<int> r = OkStatus();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(**r, 3);
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 3);

  Result<std::unique_ptr<int>> e = NotFound("none");
  EXPECT_FALSE(e.ok());
}

// ---- RETURN_IF_ERROR / ASSIGN_OR_RETURN through small helpers ----

Status CheckPositive(int x) {
  if (x <= 0) return InvalidArgument("{} is not positive", x);
  return OkStatus();
}

// Counts how far it got, so the tests can see that an error returns early.
Status CheckBoth(int a, int b, int* reached) {
  *reached = 0;
  RETURN_IF_ERROR(CheckPositive(a));
  *reached = 1;
  RETURN_IF_ERROR(CheckPositive(b).WithContext("second"));
  *reached = 2;
  return OkStatus();
}

TEST(MacroTest, ReturnIfError) {
  int reached = -1;
  EXPECT_TRUE(CheckBoth(1, 2, &reached).ok());
  EXPECT_EQ(reached, 2);

  Status s = CheckBoth(-1, 2, &reached);
  EXPECT_EQ(s.ToString(), "invalid argument: -1 is not positive");
  EXPECT_EQ(reached, 0);

  s = CheckBoth(1, 0, &reached);
  EXPECT_EQ(s.ToString(), "invalid argument: second: 0 is not positive");
  EXPECT_EQ(reached, 1);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("{} is odd", x);
  return x / 2;
}

// Two ASSIGN_OR_RETURN on consecutive lines: the temporaries must not collide.
Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

// ASSIGN_OR_RETURN into an existing variable, in a function returning Status.
Status QuarterInto(int x, int* out) {
  ASSIGN_OR_RETURN(*out, Quarter(x));
  return OkStatus();
}

TEST(MacroTest, AssignOrReturn) {
  Result<int> r = Quarter(12);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 3);

  r = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "3 is odd");

  int out = 0;
  EXPECT_TRUE(QuarterInto(20, &out).ok());
  EXPECT_EQ(out, 5);
  const Status s = QuarterInto(7, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 5);  // untouched on error
}

Result<std::unique_ptr<std::string>> MakeName(bool ok) {
  if (!ok) return NotFound("no name");
  return std::make_unique<std::string>("expert");
}

Result<size_t> NameLength(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<std::string> name, MakeName(ok));
  return name->size();
}

TEST(MacroTest, AssignOrReturnMovesMoveOnlyValues) {
  Result<size_t> r = NameLength(true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 6u);
  r = NameLength(false);
  EXPECT_EQ(r.status().ToString(), "not found: no name");
}

}  // namespace
}  // namespace moeserve
