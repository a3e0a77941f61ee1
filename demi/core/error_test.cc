#include "demi/core/error.h"

#include <gtest/gtest.h>

namespace demi {
namespace {

TEST(Error, CheckThrowsWithFormattedMessage) {
  try {
    int got = 3;
    DEMI_CHECK(got == 4, "Dense 'net.fc': expected 4 input features, got ", got);
    FAIL() << "DEMI_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Dense 'net.fc': expected 4 input features, got 3");
  }
}

TEST(Error, CheckPassesSilently) { EXPECT_NO_THROW(DEMI_CHECK(1 + 1 == 2, "never")); }

TEST(Error, AssertIsAnInternalErrorNamingTheCondition) {
  try {
    DEMI_ASSERT(2 < 1, "x=", 7);
    FAIL() << "DEMI_ASSERT did not throw";
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("2 < 1"), std::string::npos) << what;
    EXPECT_NE(what.find("x=7"), std::string::npos) << what;
  }
  EXPECT_THROW(DEMI_ASSERT(false), InternalError);
}

}  // namespace
}  // namespace demi
