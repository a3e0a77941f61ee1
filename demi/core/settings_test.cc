// The environment settings registry (core/settings.h): one parser, errors that name the variable, every
// variable read declared, and the overrides in force listed.
#include "demi/core/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "demi/core/error.h"
#include "demi/core/test_support.h"

namespace demi {
namespace {

// Sets (or, with nullptr, unsets) a variable for one scope, putting back what was there.
TEST(Settings, AChoiceIsItsFirstValueUnsetAndAnErrorNamingTheVariableOtherwise) {
  {
    test_support::EnvScope unset("DEMI_MATMUL", nullptr);
    EXPECT_EQ(env_choice("DEMI_MATMUL"), "auto");
    EXPECT_FALSE(env_value("DEMI_MATMUL").has_value());
  }
  {
    test_support::EnvScope empty("DEMI_MATMUL", "");
    EXPECT_EQ(env_choice("DEMI_MATMUL"), "auto") << "empty is unset";
  }
  {
    test_support::EnvScope set("DEMI_MATMUL", "onednn");
    EXPECT_EQ(env_choice("DEMI_MATMUL"), "onednn");
  }
  test_support::EnvScope bad("DEMI_CONV_BF16", "fp8");
  try {
    env_choice("DEMI_CONV_BF16");
    ADD_FAILURE() << "an unknown value must be refused";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DEMI_CONV_BF16 must be auto, bf16 or f32, got \"fp8\"");
  }
}

TEST(Settings, EveryVariableReadIsDeclared) {
  EXPECT_THROW(env_value("DEMI_NOT_A_SETTING"), InternalError);
  for (const EnvSetting& s : env_settings()) {
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_FALSE(s.values.empty()) << s.name;
    // Unset, a choice setting means its first choice, or (an override of a run's own option) none of them.
    if (!s.choices.empty() && std::find(s.choices.begin(), s.choices.end(), s.unset) != s.choices.end()) {
      EXPECT_EQ(s.unset, s.choices.front()) << s.name << ": unset means its first choice";
    }
  }
}

TEST(Settings, TheOverridesInForceLeaveOutWhereFilesGo) {
  test_support::EnvScope level("DEMI_CPU_LEVEL", "scalar");
  test_support::EnvScope cache("DEMI_CACHE_DIR", "/tmp/somewhere");
  test_support::EnvScope matmul("DEMI_MATMUL", nullptr);
  const std::vector<std::string> in_force = env_overrides_in_force();
  EXPECT_NE(std::find(in_force.begin(), in_force.end(), "DEMI_CPU_LEVEL=scalar"), in_force.end());
  for (const std::string& s : in_force) EXPECT_EQ(s.rfind("DEMI_CACHE_DIR", 0), std::string::npos) << s;
}

}  // namespace
}  // namespace demi
