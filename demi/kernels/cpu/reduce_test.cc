#include "demi/kernels/cpu/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::for_each_level;
using testing::random_floats;

std::string view_string(AxisView v) {
  return str_cat("(", v.outer, ", ", v.axis, ", ", v.inner, ")");
}

const std::vector<AxisView> kViews = {
    {1, 1, 1},   {3, 7, 1},    {1, 1000, 1}, {4, 37, 5},    {2, 5, 300},  {1, 300000, 1},
    {300, 33, 1}, {1, 17, 513}, {64, 1, 9},  {5, 70000, 1},
};

// The reference runs once per case; the fast kernel once per CPU level.
TEST(Reduce, SumAndMeanMatchReference) {
  for (DType t : testing::kFastDtypes) {
    for (DType out : {t, DType::kF32}) {
      SCOPED_TRACE(str_cat(dtype_name(t), " -> ", dtype_name(out)));
      for (AxisView v : kViews) {
        SCOPED_TRACE(view_string(v));
        // Positive values keep long f32 sums well conditioned, so the tolerance measures the kernel.
        Buffer x(t, random_floats(v.numel(), 51, 0.25f, 1.0f));
        const int64_t m = v.outer * v.inner;
        for (bool mean : {false, true}) {
          Buffer want(out, m);
          testing::visit_fast(t, [&](auto tag) {
            using T = decltype(tag);
            testing::visit_fast(out, [&](auto otag) {
              using O = decltype(otag);
              if constexpr (std::is_same_v<O, T> || std::is_same_v<O, float>) {
                if (mean)
                  ref::reduce_mean(x.as<T>(), v, want.as<O>());
                else
                  ref::reduce_sum(x.as<T>(), v, want.as<O>());
              }
            });
          });
          for_each_level([&](CpuLevel) {
            Buffer got(out, m);
            if (mean)
              reduce_mean(x.data(), t, v, got.data(), out);
            else
              reduce_sum(x.data(), t, v, got.data(), out);
            EXPECT_TRUE(testing::all_close(got, want, tolerance_for(out), mean ? "mean" : "sum"));
          });
        }
      }
    }
  }
}

TEST(Reduce, MaxAndArgmaxMatchReferenceExactly) {
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (AxisView v : kViews) {
      SCOPED_TRACE(view_string(v));
      Buffer x(t, random_floats(v.numel(), 52, -100.0f, 100.0f));
      const int64_t m = v.outer * v.inner;
      Buffer want(DType::kF32, m);
      std::vector<int64_t> wi(static_cast<size_t>(m));
      testing::visit_fast(t, [&](auto tag) {
        using T = decltype(tag);
        ref::reduce_max(x.as<T>(), v, want.as<float>(), wi.data());
      });
      for_each_level([&](CpuLevel) {
        Buffer got(DType::kF32, m), same(t, m);
        std::vector<int64_t> gi(static_cast<size_t>(m)), only(static_cast<size_t>(m));
        reduce_max(x.data(), t, v, got.data(), DType::kF32, gi.data());
        reduce_max(x.data(), t, v, same.data(), t, nullptr);
        reduce_argmax(x.data(), t, v, only.data());
        EXPECT_EQ(got.values(), want.values());  // the maximum is a copy of an element: exact
        EXPECT_EQ(same.values(), want.values());
        EXPECT_EQ(gi, wi);
        EXPECT_EQ(only, wi);
      });
    }
  }
}

// Ties give the first index; a NaN wins (the first NaN); -inf rows give 0.
TEST(Reduce, ArgmaxTiesNaNAndInfinity) {
  const float nan = NAN, inf = INFINITY;
  // 4 rows of 37 (long enough for vector lanes and a tail).
  std::vector<float> x(4 * 37, 1.0f);
  x[5] = 3.0f, x[30] = 3.0f;                       // row 0: tie at 5 and 30 -> 5
  x[37 + 20] = nan, x[37 + 33] = nan, x[37 + 2] = 9.0f;  // row 1: first NaN -> 20
  for (int j = 0; j < 37; ++j) x[2 * 37 + j] = -inf;     // row 2: all -inf -> 0
  x[3 * 37 + 36] = inf;                             // row 3: +inf in the tail -> 36
  for_each_level([&](CpuLevel) {
    for (AxisView v : {AxisView{4, 37, 1}}) {
      std::vector<int64_t> idx(4), want(4);
      std::vector<float> mx(4), wmx(4);
      reduce_max(x.data(), DType::kF32, v, mx.data(), DType::kF32, idx.data());
      ref::reduce_max(x.data(), v, wmx.data(), want.data());
      EXPECT_EQ(idx, (std::vector<int64_t>{5, 20, 0, 36}));
      EXPECT_EQ(want, idx);
      EXPECT_TRUE(std::isnan(mx[1]));
      EXPECT_EQ(mx[2], -inf);
      EXPECT_EQ(mx[3], inf);
    }
    // The same rows as columns: (1, 37, 4) after a transpose.
    std::vector<float> xt(4 * 37);
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 37; ++j) xt[static_cast<size_t>(j * 4 + r)] = x[static_cast<size_t>(r * 37 + j)];
    std::vector<int64_t> idx(4);
    reduce_argmax(xt.data(), DType::kF32, AxisView{1, 37, 4}, idx.data());
    EXPECT_EQ(idx, (std::vector<int64_t>{5, 20, 0, 36}));
  });
}

TEST(Reduce, ErrorsNameTheOpAndDtypes) {
  std::vector<float> x(12, 1.0f), y(12);
  EXPECT_THROW(reduce_mean(x.data(), DType::kF32, AxisView{3, 0, 4}, y.data(), DType::kF32), Error);
  EXPECT_THROW(reduce_max(x.data(), DType::kF32, AxisView{3, 0, 4}, y.data(), DType::kF32, nullptr), Error);
  try {
    reduce_sum(x.data(), DType::kF32, AxisView{3, 4, 1}, y.data(), DType::kBF16);
    FAIL() << "expected demi::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("reduce_sum"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bfloat16"), std::string::npos) << msg;
  }
  // Sum over an empty axis is 0.
  reduce_sum(x.data(), DType::kF32, AxisView{3, 0, 4}, y.data(), DType::kF32);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], 0.0f);
}

TEST(Reduce, F64RunsTheReference) {
  std::vector<double> x = {1, 2, 3, 4, 5, 6}, y(2);
  reduce_sum(x.data(), DType::kF64, AxisView{2, 3, 1}, y.data(), DType::kF64);
  EXPECT_EQ(y, (std::vector<double>{6, 15}));
  std::vector<double> cols(3);
  reduce_mean(x.data(), DType::kF64, AxisView{1, 2, 3}, cols.data(), DType::kF64);
  EXPECT_EQ(cols, (std::vector<double>{2.5, 3.5, 4.5}));
}

}  // namespace
}  // namespace demi::kernels
