// Tests of Shape: construction, negative axes, numel, strides, printing and its errors.
#include "demi/core/shape.h"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "demi/core/error.h"

namespace demi {
namespace {

TEST(Shape, BasicsAndNegativeAxes) {
  Shape s{32, 3, 28, 28};
  EXPECT_EQ(s.rank(), 4);
  EXPECT_EQ(s.numel(), 32 * 3 * 28 * 28);
  EXPECT_EQ(s[0], 32);
  EXPECT_EQ(s[-1], 28);
  EXPECT_EQ(s[-4], 32);
  s[1] = 5;
  EXPECT_EQ(s[1], 5);
  EXPECT_EQ(s.wrap(-1), 3);
  EXPECT_EQ(s.wrap(2), 2);
}

TEST(Shape, ScalarAndEmpty) {
  Shape scalar;
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.to_string(), "()");
  EXPECT_EQ(Shape({4, 0, 3}).numel(), 0);
}

TEST(Shape, FromSpanAndPushBack) {
  std::vector<int64_t> d{2, 3, 4};
  Shape a{std::span<const int64_t>(d)};
  Shape b;
  for (int64_t x : d) b.push_back(x);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, Shape({2, 3, 4}));
  EXPECT_NE(a, Shape({2, 3}));
  EXPECT_NE(a, Shape({2, 3, 5}));
  EXPECT_EQ(a.dims().size(), 3u);
  EXPECT_EQ(a.dims()[2], 4);
}

TEST(Shape, RowMajorStrides) {
  auto st = Shape({2, 3, 4, 5}).strides();
  EXPECT_EQ(st[0], 60);
  EXPECT_EQ(st[1], 20);
  EXPECT_EQ(st[2], 5);
  EXPECT_EQ(st[3], 1);
}

TEST(Shape, Printing) {
  Shape s{32, 3, 32, 32};
  EXPECT_EQ(s.to_string(), "(32, 3, 32, 32)");
  std::ostringstream os;
  os << Shape{7};
  EXPECT_EQ(os.str(), "(7)");
}

TEST(Shape, ErrorsNameTheAxisAndTheShape) {
  Shape s{2, 3};
  try {
    (void)s[2];
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("axis 2"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
  }
  EXPECT_THROW(s.wrap(-3), Error);
  EXPECT_THROW(Shape().wrap(0), Error);
  Shape full{1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(full.push_back(1), Error);
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

}  // namespace
}  // namespace demi
