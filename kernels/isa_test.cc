#include "kernels/isa.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/memory_bandwidth.h"
#include "kernels/ref/memory_bandwidth_ref.h"

namespace moeserve::kernels {
namespace {

// Puts the dispatch back to the CPU's best target when a test ends.
class IsaTest : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(SelectIsa(AvailableIsas().front()).ok()); }
};

TEST_F(IsaTest, EachAvailableTargetBecomesTheActiveOneAndComputes) {
  const std::vector<std::string> available = AvailableIsas();
  ASSERT_FALSE(available.empty());
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  for (const std::string& name : available) {
    ASSERT_TRUE(SelectIsa(name).ok()) << name;
    EXPECT_EQ(ActiveIsa(), name);
    EXPECT_NEAR(ReadSum(x.data(), x.size()), ref::ReadSum(x.data(), x.size()), 1e-3) << name;
  }
  // Upper case and the avx512 alias name the same targets.
  std::string upper = available.back();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ASSERT_TRUE(SelectIsa(upper).ok());
  EXPECT_EQ(ActiveIsa(), available.back());
  if (available.front() == "avx3") {
    ASSERT_TRUE(SelectIsa("avx512").ok());
    EXPECT_EQ(ActiveIsa(), "avx3");
  }
}

TEST_F(IsaTest, UnknownOrUnavailableTargetsAreRefusedByName) {
  const Status unknown = SelectIsa("avx9000");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("'avx9000' is not a SIMD target of this build"),
            std::string::npos)
      << unknown.message();
  EXPECT_NE(unknown.message().find("avx2"), std::string::npos) << unknown.message();
  EXPECT_FALSE(SelectIsa("").ok());
  // The refusal leaves the dispatch as it was.
  EXPECT_EQ(ActiveIsa(), AvailableIsas().front());
}

TEST_F(IsaTest, EnvironmentVariableIsAppliedAndNamedInErrors) {
  const std::string worst = AvailableIsas().back();
  ASSERT_EQ(setenv("MOESERVE_ISA", worst.c_str(), 1), 0);
  ASSERT_TRUE(SelectIsaFromEnvironment().ok());
  EXPECT_EQ(ActiveIsa(), worst);
  ASSERT_EQ(setenv("MOESERVE_ISA", "neon", 1), 0);
  const Status bad = SelectIsaFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message().rfind("MOESERVE_ISA: 'neon'", 0), 0u) << bad.message();
  ASSERT_EQ(unsetenv("MOESERVE_ISA"), 0);
  EXPECT_TRUE(SelectIsaFromEnvironment().ok());
}

}  // namespace
}  // namespace moeserve::kernels
