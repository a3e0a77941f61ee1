#include "demi/core/dtype.h"

#include <gtest/gtest.h>

#include "demi/core/error.h"

namespace demi {
namespace {

constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                          DType::kI32, DType::kI64, DType::kU8,   DType::kBool};

TEST(DType, SizesMatchTheirCxxTypes) {
  for (DType t : kAll) {
    size_t cxx = visit_dtype(t, [](auto v) { return sizeof(v); });
    EXPECT_EQ(dtype_size(t), cxx) << t;
    DType back = visit_dtype(t, [](auto v) { return dtype_of_v<decltype(v)>; });
    EXPECT_EQ(back, t);
  }
}

TEST(DType, NamesAndParsingRoundTrip) {
  for (DType t : kAll) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_THROW(parse_dtype("float8"), Error);
}

TEST(DType, Floating) {
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_FALSE(is_floating(DType::kI64));
  EXPECT_TRUE(is_low_precision(DType::kF16));
  EXPECT_FALSE(is_low_precision(DType::kF32));
}

TEST(DType, PromotionIsSymmetricAndNeverLowers) {
  for (DType a : kAll) {
    EXPECT_EQ(promote_types(a, a), a);
    for (DType b : kAll) {
      DType r = promote_types(a, b);
      EXPECT_EQ(r, promote_types(b, a)) << a << " " << b;
      // The result is at least as wide as each floating input: nothing is lowered silently.
      if (is_floating(a)) {
        EXPECT_GE(dtype_size(r), dtype_size(a)) << a << " " << b;
      }
      if (is_floating(a) || is_floating(b)) {
        EXPECT_TRUE(is_floating(r)) << a << " " << b;
      }
    }
  }
  EXPECT_EQ(promote_types(DType::kF16, DType::kBF16), DType::kF32);
  EXPECT_EQ(promote_types(DType::kF16, DType::kF32), DType::kF32);
  EXPECT_EQ(promote_types(DType::kI32, DType::kI64), DType::kI64);
  EXPECT_EQ(promote_types(DType::kBF16, DType::kI64), DType::kBF16);
}

}  // namespace
}  // namespace demi
