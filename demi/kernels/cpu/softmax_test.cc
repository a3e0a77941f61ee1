#include "demi/kernels/cpu/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/test_util.h"
#include "demi/kernels/reference/softmax.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::for_each_level;
using testing::random_floats;

std::string view_string(AxisView v) {
  return str_cat("(", v.outer, ", ", v.axis, ", ", v.inner, ")");
}

const std::vector<AxisView> kViews = {
    {1, 1, 1}, {5, 10, 1}, {1, 7, 1}, {3, 1000, 1}, {2, 5000, 1}, {33, 33, 1}, {4, 6, 9}, {2, 30, 130}, {3, 2, 17},
};

struct DtypePair {
  DType x, y;
};
const std::vector<DtypePair> kPairs = {{DType::kF32, DType::kF32},
                                       {DType::kBF16, DType::kBF16},
                                       {DType::kF16, DType::kF16},
                                       {DType::kBF16, DType::kF32},
                                       {DType::kF16, DType::kF32}};

// Calls fn(T{}, Out{}) for a supported (x, y) dtype pair.
template <typename Fn>
void visit_pair(DtypePair p, Fn&& fn) {
  testing::visit_fast(p.x, [&](auto xt) {
    using T = decltype(xt);
    if (p.y == p.x)
      fn(T{}, T{});
    else
      fn(T{}, float{});
  });
}

TEST(Softmax, ForwardAndBackwardMatchReference) {
  for (DtypePair dp : kPairs) {
    SCOPED_TRACE(str_cat(dtype_name(dp.x), " -> ", dtype_name(dp.y)));
    for (AxisView v : kViews) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(str_cat(log ? "log_softmax " : "softmax ", view_string(v)));
        const int64_t n = v.numel();
        Buffer x(dp.x, random_floats(n, 61, -6.0f, 6.0f)), dy(dp.y, random_floats(n, 62));
        Buffer want_y(dp.y, n), want_dx(dp.x, n);
        visit_pair(dp, [&](auto xt, auto yt) {
          using T = decltype(xt);
          using O = decltype(yt);
          if (log) {
            ref::log_softmax_forward(x.as<T>(), v, want_y.as<O>());
            ref::log_softmax_backward(want_y.as<O>(), dy.as<O>(), v, want_dx.as<T>());
          } else {
            ref::softmax_forward(x.as<T>(), v, want_y.as<O>());
            ref::softmax_backward(want_y.as<O>(), dy.as<O>(), v, want_dx.as<T>());
          }
        });
        for_each_level([&](CpuLevel) {
          Buffer y(dp.y, n), dx(dp.x, n);
          if (log) {
            log_softmax_forward(x.data(), dp.x, v, y.data(), dp.y);
            log_softmax_backward(want_y.data(), dy.data(), dp.y, v, dx.data(), dp.x);
          } else {
            softmax_forward(x.data(), dp.x, v, y.data(), dp.y);
            softmax_backward(want_y.data(), dy.data(), dp.y, v, dx.data(), dp.x);
          }
          EXPECT_TRUE(testing::all_close(y, want_y, tolerance_for(dp.y), "y"));
          EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(dp.x), "dx"));
        });
      }
    }
  }
}

// Logits of ±1e4 in f32 and near 65504 in f16 (the largest finite) must not overflow: the maximum is
// subtracted first, in f32.
TEST(Softmax, HugeLogitsDoNotOverflow) {
  const int64_t c = 37;
  std::vector<float> big = random_floats(3 * c, 63, -1.0f, 1.0f);
  std::vector<float> f32_logits, f16_logits;
  for (float v : big) {
    f32_logits.push_back(v * 1e4f);
    f16_logits.push_back(v > 0 ? 65504.0f - 64.0f * std::floor(v * 10) : -65504.0f + 32.0f * std::floor(-v * 10));
  }
  for_each_level([&](CpuLevel) {
    for (auto [t, vals] : {std::pair{DType::kF32, f32_logits}, std::pair{DType::kF16, f16_logits}}) {
      SCOPED_TRACE(testing::dtype_trace(t));
      Buffer x(t, vals), y(DType::kF32, 3 * c), ly(DType::kF32, 3 * c), want(DType::kF32, 3 * c);
      softmax_forward(x.data(), t, AxisView{3, c, 1}, y.data(), DType::kF32);
      log_softmax_forward(x.data(), t, AxisView{3, c, 1}, ly.data(), DType::kF32);
      testing::visit_fast(t, [&](auto tag) {
        using T = decltype(tag);
        ref::softmax_forward(x.as<T>(), AxisView{3, c, 1}, want.as<float>());
      });
      EXPECT_TRUE(testing::all_close(y, want, tolerance_for(DType::kF32)));
      for (int r = 0; r < 3; ++r) {
        double s = 0;
        for (int j = 0; j < c; ++j) {
          ASSERT_TRUE(std::isfinite(y.get(r * c + j)) && std::isfinite(ly.get(r * c + j)));
          s += y.get(r * c + j);
        }
        EXPECT_TRUE(tolerance_for(DType::kF32).close(s, 1.0)) << s;
      }
    }
  });
}

// f64 central finite differences of the f64 reference: L = sum(w * softmax(x)).
TEST(Softmax, BackwardMatchesFiniteDifferences) {
  for (AxisView v : {AxisView{3, 5, 1}, AxisView{2, 4, 3}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(str_cat(log ? "log_softmax " : "softmax ", view_string(v)));
      const size_t n = static_cast<size_t>(v.numel());
      std::vector<double> x, w, y(n), dx(n);
      for (float f : random_floats(v.numel(), 64, -3.0f, 3.0f)) x.push_back(f);
      for (float f : random_floats(v.numel(), 65)) w.push_back(f);
      auto loss = [&] {
        log ? ref::log_softmax_forward(x.data(), v, y.data()) : ref::softmax_forward(x.data(), v, y.data());
        double l = 0;
        for (size_t i = 0; i < n; ++i) l += w[i] * y[i];
        return l;
      };
      loss();
      if (log)
        ref::log_softmax_backward(y.data(), w.data(), v, dx.data());
      else
        ref::softmax_backward(y.data(), w.data(), v, dx.data());
      // The fast entry points take f64 too (through the reference).
      std::vector<double> dx2(n);
      if (log)
        log_softmax_backward(y.data(), w.data(), DType::kF64, v, dx2.data(), DType::kF64);
      else
        softmax_backward(y.data(), w.data(), DType::kF64, v, dx2.data(), DType::kF64);
      EXPECT_EQ(dx, dx2);
      EXPECT_TRUE(testing::all_close(dx, testing::numeric_grad(loss, x), kFiniteDiffTolerance));
    }
  }
}

TEST(Softmax, RejectsBadDtypesAndEmptyAxis) {
  std::vector<float> x(6), y(6);
  EXPECT_THROW(softmax_forward(x.data(), DType::kF32, AxisView{2, 3, 1}, y.data(), DType::kBF16), Error);
  EXPECT_THROW(softmax_forward(x.data(), DType::kI32, AxisView{2, 3, 1}, y.data(), DType::kI32), Error);
  EXPECT_THROW(softmax_forward(x.data(), DType::kF32, AxisView{2, 0, 1}, y.data(), DType::kF32), Error);
}

}  // namespace
}  // namespace demi::kernels
