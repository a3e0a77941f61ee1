// Tests of MaxPool2d / AvgPool2d and the fused ReLU -> MaxPool2d: pad_mode resolution, the fast kernels
// against their reference twins at every CPU level this machine supports (f32, bf16, f16; odd sizes,
// batch 1, ties, NaN), the fused kernel against ReLU then MaxPool, and every backward against f64
// central finite differences of the f64 reference forward.
#include "demi/kernels/cpu/pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/activation.h"
#include "demi/kernels/cpu/internal/pointwise_test_util.h"
#include "demi/kernels/reference/pool.h"

namespace demi::kernels {
namespace {

using test::expect_bit_identical;
using test::random_values;

// ---------------------------------------------------------------------------------------------------
// Geometry

TEST(Pool2dParams, ValidSameAndPadFollowMindSpore) {
  // Model A: 30x30 -> 15x15; an odd input drops its last row and column in "valid".
  Pool2dParams a = make_pool2d_params(32, 32, 30, 30, 2, 2, 2, 2, PadMode::kValid);
  EXPECT_EQ(a.oh, 15);
  EXPECT_EQ(a.ow, 15);
  Pool2dParams v = make_pool2d_params(1, 3, 15, 7, 2, 2, 2, 2, PadMode::kValid);
  EXPECT_EQ(v.oh, 7);
  EXPECT_EQ(v.ow, 3);
  EXPECT_EQ(v.pad_bottom, 0);
  // "same": ceil(H / stride), the odd padding at the bottom / right.
  Pool2dParams s = make_pool2d_params(1, 3, 15, 7, 2, 2, 2, 2, PadMode::kSame);
  EXPECT_EQ(s.oh, 8);
  EXPECT_EQ(s.ow, 4);
  EXPECT_EQ(s.pad_top, 0);
  EXPECT_EQ(s.pad_bottom, 1);
  EXPECT_EQ(s.pad_right, 1);
  EXPECT_FALSE(s.count_include_pad);  // MindSpore's "same" AvgPool divides by the real elements
  Pool2dParams s3 = make_pool2d_params(1, 1, 7, 7, 3, 3, 1, 1, PadMode::kSame);
  EXPECT_EQ(s3.oh, 7);
  EXPECT_EQ(s3.pad_top, 1);
  EXPECT_EQ(s3.pad_bottom, 1);
  Pool2dParams s4 = make_pool2d_params(1, 1, 8, 8, 4, 4, 1, 1, PadMode::kSame);
  EXPECT_EQ(s4.pad_top, 1);
  EXPECT_EQ(s4.pad_bottom, 2);
  // "pad": explicit, count_include_pad defaults to true as in MindSpore.
  Pool2dParams p = make_pool2d_params(2, 3, 9, 9, 3, 3, 2, 2, PadMode::kPad, 1, 1);
  EXPECT_EQ(p.oh, 5);
  EXPECT_EQ(p.pad_left, 1);
  EXPECT_TRUE(p.count_include_pad);
  EXPECT_FALSE(make_pool2d_params(2, 3, 9, 9, 3, 3, 2, 2, PadMode::kPad, 1, 1, false).count_include_pad);
  EXPECT_EQ(parse_pad_mode("SAME"), PadMode::kSame);
}

TEST(Pool2dParams, MistakesAreErrorsNamingTheOp) {
  try {
    make_pool2d_params(1, 3, 4, 4, 5, 5, 1, 1, PadMode::kValid, 0, 0, true, "max_pool2d");
    FAIL() << "a window larger than the input must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pool2d"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kernel"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_pool2d_params(1, 3, 8, 8, 2, 2, 2, 2, PadMode::kValid, 1, 0), Error);  // pad in "valid"
  EXPECT_THROW(make_pool2d_params(1, 3, 8, 8, 2, 2, 2, 2, PadMode::kPad, 2, 0), Error);    // pad >= kernel
  EXPECT_THROW(make_pool2d_params(1, 3, 8, 8, 2, 2, 0, 2, PadMode::kValid), Error);        // stride 0
  Pool2dParams bad = make_pool2d_params(1, 3, 8, 8, 2, 2, 2, 2, PadMode::kValid);
  bad.oh = 5;
  std::vector<float> x(3 * 64), y(3 * 25);
  try {
    max_pool2d_forward(bad, DType::kF32, x.data(), y.data(), nullptr);
    FAIL() << "a wrong output size must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pool2d_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(1, 3, 8, 8)"), std::string::npos) << e.what();
  }
  Pool2dParams ok = make_pool2d_params(1, 3, 8, 8, 2, 2, 2, 2, PadMode::kValid);
  std::vector<int32_t> xi(3 * 64), yi(3 * 16);
  try {
    avg_pool2d_forward(ok, DType::kI32, xi.data(), yi.data());
    FAIL() << "integer data must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
  }
  std::vector<float> dy(3 * 16), dx(3 * 64);
  EXPECT_THROW(max_pool2d_backward(ok, DType::kF32, dy.data(), nullptr, dx.data()), Error);
  Pool2dParams huge = make_pool2d_params(1, 1, 20, 20, 16, 16, 1, 1, PadMode::kValid);
  std::vector<float> hx(400), hy(25);
  std::vector<uint8_t> ha(25);
  EXPECT_THROW(max_pool2d_forward(huge, DType::kF32, hx.data(), hy.data(), ha.data()), Error);  // 256 > 255
  EXPECT_NO_THROW(max_pool2d_forward(huge, DType::kF32, hx.data(), hy.data(), nullptr));
}

// ---------------------------------------------------------------------------------------------------
// Fast against reference

struct Case {
  int64_t n, c, h, w, kh, kw, sh, sw;
  PadMode mode;
  int64_t pad_h = 0, pad_w = 0;
  bool include_pad = true;
};

std::vector<Case> cases() {
  return {
      {1, 3, 7, 7, 2, 2, 2, 2, PadMode::kValid},              // batch 1, odd sizes: last row/column dropped
      {2, 17, 15, 15, 2, 2, 2, 2, PadMode::kValid},           // 17 channels, 7 outputs per row (a tail)
      {1, 3, 31, 31, 2, 2, 2, 2, PadMode::kSame},             // "same" on odd sizes: padded border windows
      {2, 3, 30, 30, 2, 2, 2, 2, PadMode::kValid},            // model A's plane, 15 outputs per row
      {1, 5, 28, 28, 2, 2, 2, 2, PadMode::kValid},            // model B's first pool
      {3, 4, 14, 14, 2, 2, 2, 2, PadMode::kValid},            // model B's second pool (7 per row)
      {1, 2, 6, 70, 2, 2, 2, 2, PadMode::kValid},             // 35 outputs per row: two full vectors and a tail
      {2, 3, 9, 7, 3, 3, 1, 1, PadMode::kPad, 1, 1, true},    // overlapping windows, padding counted
      {2, 3, 9, 7, 3, 3, 1, 1, PadMode::kPad, 1, 1, false},   // ... and not counted
      {1, 3, 11, 8, 3, 2, 2, 3, PadMode::kSame},              // non-square window and stride
      {2, 3, 10, 12, 2, 2, 2, 2, PadMode::kPad, 1, 1, true},  // 2x2 stride 2 with padding: reference path
  };
}

Pool2dParams params_of(const Case& k) {
  return make_pool2d_params(k.n, k.c, k.h, k.w, k.kh, k.kw, k.sh, k.sw, k.mode, k.pad_h, k.pad_w, k.include_pad);
}

std::string name_of(const Pool2dParams& p, CpuLevel level) { return describe(p) + " at " + test::level_name(level); }

// Inputs for the comparisons: random values, or (ties = true) small integers with many ties per window
// and a NaN now and then, which the tie and NaN rules must resolve exactly as the reference does.
template <typename T>
std::vector<T> pool_input(int64_t n, uint64_t seed, bool ties) {
  if (!ties) return random_values<T>(n, seed);
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& e : v) {
    int r = dist(gen);
    float f = (gen() % 97 == 0) ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(r);
    if constexpr (std::is_same_v<T, double>)
      e = f;
    else
      e = T(f);
  }
  return v;
}

template <typename T>
class PoolFastTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, BFloat16, Half>;
TYPED_TEST_SUITE(PoolFastTest, FloatTypes);

TYPED_TEST(PoolFastTest, MaxForwardAndBackwardMatchReferenceExactly) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  for (bool ties : {false, true}) {
    for (const Case& k : cases()) {
      Pool2dParams p = params_of(k);
      auto x = pool_input<T>(p.x_numel(), 11 + static_cast<uint64_t>(p.h * p.w), ties);
      auto dy = random_values<T>(p.y_numel(), 7);
      std::vector<T> y_ref(static_cast<size_t>(p.y_numel())), dx_ref(static_cast<size_t>(p.x_numel()));
      std::vector<uint8_t> a_ref(static_cast<size_t>(p.y_numel()));
      ref::max_pool2d_forward(p, x.data(), y_ref.data(), a_ref.data());
      ref::max_pool2d_backward(p, dy.data(), a_ref.data(), dx_ref.data());
      for (CpuLevel level : supported_cpu_levels()) {
        ScopedCpuLevel scoped(level);
        std::string what = "max_pool2d " + test::type_name<T>() + (ties ? " ties " : " ") + name_of(p, level);
        std::vector<T> y(y_ref.size()), y2(y_ref.size()), dx(dx_ref.size(), T(7.0f));
        std::vector<uint8_t> a(a_ref.size(), 99);
        max_pool2d_forward(p, dt, x.data(), y.data(), a.data());
        expect_bit_identical(y, y_ref, what + " y");
        EXPECT_EQ(a, a_ref) << what << " argmax";
        max_pool2d_forward(p, dt, x.data(), y2.data(), nullptr);  // inference: no argmax
        expect_bit_identical(y2, y_ref, what + " y without argmax");
        max_pool2d_backward(p, dt, dy.data(), a_ref.data(), dx.data());
        expect_bit_identical(dx, dx_ref, what + " dx");
      }
    }
  }
}

TYPED_TEST(PoolFastTest, FusedReluMaxPoolMatchesReferenceAndTheSeparateOps) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  for (bool ties : {false, true}) {
    for (const Case& k : cases()) {
      Pool2dParams p = params_of(k);
      auto x = pool_input<T>(p.x_numel(), 5 + static_cast<uint64_t>(p.w), ties);
      auto dy = random_values<T>(p.y_numel(), 9);
      std::vector<T> y_ref(static_cast<size_t>(p.y_numel())), dx_ref(static_cast<size_t>(p.x_numel()));
      std::vector<uint8_t> a_ref(static_cast<size_t>(p.y_numel()));
      ref::relu_max_pool2d_forward(p, x.data(), y_ref.data(), a_ref.data());
      ref::max_pool2d_backward(p, dy.data(), a_ref.data(), dx_ref.data());
      for (CpuLevel level : supported_cpu_levels()) {
        ScopedCpuLevel scoped(level);
        std::string what = "relu_max_pool2d " + test::type_name<T>() + (ties ? " ties " : " ") + name_of(p, level);
        std::vector<T> y(y_ref.size()), dx(dx_ref.size());
        std::vector<uint8_t> a(a_ref.size());
        relu_max_pool2d_forward(p, dt, x.data(), y.data(), a.data());
        expect_bit_identical(y, y_ref, what + " y");
        EXPECT_EQ(a, a_ref) << what << " argmax";
        max_pool2d_backward(p, dt, dy.data(), a.data(), dx.data());
        expect_bit_identical(dx, dx_ref, what + " dx");

        // The same as ReLU, then MaxPool2d, then their backward in reverse order.
        std::vector<T> r(x.size()), y_sep(y.size()), dr(x.size()), dx_sep(x.size());
        std::vector<uint8_t> a_sep(a.size());
        activation_forward(Activation::kReLU, dt, x.data(), r.data(), p.x_numel());
        max_pool2d_forward(p, dt, r.data(), y_sep.data(), a_sep.data());
        max_pool2d_backward(p, dt, dy.data(), a_sep.data(), dr.data());
        activation_backward(Activation::kReLU, dt, r.data(), dr.data(), dx_sep.data(), p.x_numel());
        expect_bit_identical(y, y_sep, what + " y vs separate");
        expect_bit_identical(dx, dx_sep, what + " dx vs separate");
      }
    }
  }
}

TYPED_TEST(PoolFastTest, AvgForwardAndBackwardMatchReference) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  for (const Case& k : cases()) {
    Pool2dParams p = params_of(k);
    auto x = random_values<T>(p.x_numel(), 3 + static_cast<uint64_t>(p.h));
    auto dy = random_values<T>(p.y_numel(), 4);
    std::vector<T> y_ref(static_cast<size_t>(p.y_numel())), dx_ref(static_cast<size_t>(p.x_numel()));
    ref::avg_pool2d_forward(p, x.data(), y_ref.data());
    ref::avg_pool2d_backward(p, dy.data(), dx_ref.data());
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      std::string what = "avg_pool2d " + test::type_name<T>() + " " + name_of(p, level);
      std::vector<T> y(y_ref.size()), dx(dx_ref.size(), T(5.0f));
      avg_pool2d_forward(p, dt, x.data(), y.data());
      test::expect_close_to_reference(y, y_ref, what + " y");
      avg_pool2d_backward(p, dt, dy.data(), dx.data());
      test::expect_close_to_reference(dx, dx_ref, what + " dx");
    }
  }
}

// Enough planes to be split over the thread pool; the result must not depend on the thread count.
TEST(PoolFast, ThreadCountDoesNotChangeResults) {
  Pool2dParams p = make_pool2d_params(8, 32, 30, 30, 2, 2, 2, 2, PadMode::kValid);
  auto x = random_values<BFloat16>(p.x_numel(), 21);
  auto dy = random_values<BFloat16>(p.y_numel(), 22);
  std::vector<BFloat16> y_ref(static_cast<size_t>(p.y_numel())), dx_ref(static_cast<size_t>(p.x_numel()));
  std::vector<uint8_t> a_ref(static_cast<size_t>(p.y_numel()));
  ref::relu_max_pool2d_forward(p, x.data(), y_ref.data(), a_ref.data());
  ref::max_pool2d_backward(p, dy.data(), a_ref.data(), dx_ref.data());
  int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<BFloat16> y(y_ref.size()), dx(dx_ref.size());
    std::vector<uint8_t> a(a_ref.size());
    relu_max_pool2d_forward(p, DType::kBF16, x.data(), y.data(), a.data());
    max_pool2d_backward(p, DType::kBF16, dy.data(), a.data(), dx.data());
    expect_bit_identical(y, y_ref, "threads " + std::to_string(threads));
    EXPECT_EQ(a, a_ref);
    expect_bit_identical(dx, dx_ref, "threads " + std::to_string(threads));
  }
  set_num_threads(saved);
}

TEST(PoolReference, SemanticsOnAHandWrittenPlane) {
  // One 2x4 plane, 2x2 windows: ties go to the first in row-major order, NaN wins.
  Pool2dParams p = make_pool2d_params(1, 1, 2, 4, 2, 2, 2, 2, PadMode::kValid);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {1, 3, nan, -1, 3, 2, 5, nan};
  std::vector<float> y(2);
  std::vector<uint8_t> a(2);
  ref::max_pool2d_forward(p, x.data(), y.data(), a.data());
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(a[0], 1);  // (0, 1) before the equal (1, 0)
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(a[1], 0);  // the first NaN
  std::vector<float> xn = {-1, -3, 0.5f, -1, -2, -2, -5, 0.25f};
  ref::relu_max_pool2d_forward(p, xn.data(), y.data(), a.data());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(a[0], kArgmaxNone);  // ReLU blocks the gradient
  EXPECT_EQ(y[1], 0.5f);
  EXPECT_EQ(a[1], 0);
  // AvgPool "same" on a 3x3 input with a 2x2 window: the corner window has 1 real element.
  Pool2dParams s = make_pool2d_params(1, 1, 3, 3, 2, 2, 2, 2, PadMode::kSame);
  std::vector<float> xs = {1, 2, 3, 4, 5, 6, 7, 8, 9}, ys(4);
  ref::avg_pool2d_forward(s, xs.data(), ys.data());
  EXPECT_EQ(ys[0], 3.0f);  // (1 + 2 + 4 + 5) / 4
  EXPECT_EQ(ys[1], 4.5f);  // (3 + 6) / 2
  EXPECT_EQ(ys[3], 9.0f);  // 9 / 1
  Pool2dParams inc = make_pool2d_params(1, 1, 3, 3, 2, 2, 2, 2, PadMode::kPad, 1, 1, true);
  std::vector<float> yi(4);
  ref::avg_pool2d_forward(inc, xs.data(), yi.data());
  EXPECT_EQ(yi[0], 0.25f);  // 1 / 4: padding counted
}

// ---------------------------------------------------------------------------------------------------
// Gradients against f64 central finite differences of the f64 reference forward

// Distinct values at least 0.01 apart (no ties within kFiniteDiffStep), none within 0.005 of 0 (no ReLU kink).
std::vector<double> distinct_values(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  std::mt19937_64 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  double mid = static_cast<double>(n) / 2.0;
  for (auto& e : v) e = (e - mid + 0.5) * 0.01;
  return v;
}

// sum(forward(x) * w) and its gradient dx = backward(w), against central differences.
template <typename Forward, typename Backward>
void check_gradient(const Pool2dParams& p, const std::vector<double>& x, Forward forward, Backward backward,
                    const std::string& what) {
  auto w = random_values<double>(p.y_numel(), 99);
  std::vector<double> dx(x.size());
  backward(x, w, dx);
  auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> y(w.size());
    forward(xv, y);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  };
  std::vector<double> xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] = x[i] + kFiniteDiffStep;
    double up = loss(xp);
    xp[i] = x[i] - kFiniteDiffStep;
    double down = loss(xp);
    xp[i] = x[i];
    double fd = (up - down) / (2 * kFiniteDiffStep);
    EXPECT_TRUE(kFiniteDiffTolerance.close(dx[i], fd))
        << what << ": dx[" << i << "] = " << dx[i] << ", finite difference " << fd;
  }
}

TEST(PoolGradient, MaxAvgAndFusedMatchFiniteDifferences) {
  std::vector<Case> small = {
      {1, 2, 5, 7, 2, 2, 2, 2, PadMode::kValid},
      {1, 2, 5, 5, 2, 2, 2, 2, PadMode::kSame},
      {2, 1, 6, 5, 3, 3, 1, 1, PadMode::kPad, 1, 1, true},
      {1, 2, 6, 5, 3, 2, 2, 1, PadMode::kPad, 1, 1, false},
  };
  for (const Case& k : small) {
    Pool2dParams p = params_of(k);
    auto x = distinct_values(p.x_numel(), 3);
    std::string what = describe(p);
    check_gradient(
        p, x,
        [&](const std::vector<double>& xv, std::vector<double>& y) {
          ref::max_pool2d_forward(p, xv.data(), y.data(), nullptr);
        },
        [&](const std::vector<double>& xv, const std::vector<double>& dy, std::vector<double>& dx) {
          std::vector<uint8_t> a(dy.size());
          std::vector<double> y(dy.size());
          max_pool2d_forward(p, DType::kF64, xv.data(), y.data(), a.data());
          max_pool2d_backward(p, DType::kF64, dy.data(), a.data(), dx.data());
        },
        "max_pool2d " + what);
    check_gradient(
        p, x,
        [&](const std::vector<double>& xv, std::vector<double>& y) {
          ref::relu_max_pool2d_forward(p, xv.data(), y.data(), nullptr);
        },
        [&](const std::vector<double>& xv, const std::vector<double>& dy, std::vector<double>& dx) {
          std::vector<uint8_t> a(dy.size());
          std::vector<double> y(dy.size());
          relu_max_pool2d_forward(p, DType::kF64, xv.data(), y.data(), a.data());
          max_pool2d_backward(p, DType::kF64, dy.data(), a.data(), dx.data());
        },
        "relu_max_pool2d " + what);
    check_gradient(
        p, x,
        [&](const std::vector<double>& xv, std::vector<double>& y) { ref::avg_pool2d_forward(p, xv.data(), y.data()); },
        [&](const std::vector<double>&, const std::vector<double>& dy, std::vector<double>& dx) {
          avg_pool2d_backward(p, DType::kF64, dy.data(), dx.data());
        },
        "avg_pool2d " + what);
  }
}

// ---- pooling from a convolution's layout (the fused Conv2d -> ReLU -> MaxPool2d) ----

StridedLayout4 nchw_layout(const Pool2dParams& p) { return StridedLayout4::nchw(p.c, p.h, p.w); }
StridedLayout4 nhwc_layout(const Pool2dParams& p) { return {p.h * p.w * p.c, 0, 1, p.w * p.c, p.c, p.c}; }
// nChw16c with the channels padded up to a multiple of 16.
StridedLayout4 blocked16_layout(const Pool2dParams& p) {
  const int64_t cp = (p.c + 15) / 16 * 16;
  return {cp * p.h * p.w, 16 * p.h * p.w, 1, 16 * p.w, 16, 16};
}
int64_t layout_elems(const Pool2dParams& p, const StridedLayout4& l) {
  return l.cb == 16 && l.sc == 1 ? p.n * l.sn : p.x_numel();
}

// Forward against the reference on the NCHW copy (values and window indices bit for bit), backward against
// the reference's dx read back through the layout (padding and unselected positions 0), for every layout,
// input and output dtype, ISA level, ties and NaNs, and geometries with uncovered tails and stride gaps.
TEST(PoolStrided, ForwardAndBackwardMatchTheReferenceInEveryLayout) {
  const Pool2dParams geoms[] = {make_pool2d_params(2, 32, 30, 30, 2, 2, 2, 2, PadMode::kValid),
                                make_pool2d_params(3, 16, 7, 6, 2, 2, 2, 2, PadMode::kValid),
                                make_pool2d_params(1, 5, 9, 9, 3, 3, 3, 3, PadMode::kValid),
                                make_pool2d_params(2, 32, 8, 8, 2, 2, 3, 3, PadMode::kValid)};
  uint64_t seed = 40;
  for (const Pool2dParams& p : geoms) {
    ASSERT_TRUE(strided_pool_supported(p)) << describe(p);
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      for (DType xt : {DType::kF32, DType::kBF16})
        for (DType yt : {DType::kF32, DType::kBF16, DType::kF16})
          for (bool ties : {false, true})
            for (int which = 0; which < 3; ++which) {
              const StridedLayout4 l = which == 0 ? nchw_layout(p) : which == 1 ? nhwc_layout(p) : blocked16_layout(p);
              SCOPED_TRACE(name_of(p, level) + " x " + std::string(dtype_name(xt)) + " y " +
                           std::string(dtype_name(yt)) + (ties ? " ties" : "") + " layout " + std::to_string(which));
              // x in NCHW as f32 values exactly representable in xt.
              std::vector<float> xv = pool_input<float>(p.x_numel(), seed += 3, ties);
              for (auto& v : xv)
                if (xt == DType::kBF16) v = static_cast<float>(BFloat16(v));
              std::vector<uint16_t> x16(static_cast<size_t>(layout_elems(p, l)), 0);
              std::vector<float> x32(static_cast<size_t>(layout_elems(p, l)), 0.0f);
              for (int64_t n = 0; n < p.n; ++n)
                for (int64_t c = 0; c < p.c; ++c)
                  for (int64_t h = 0; h < p.h; ++h)
                    for (int64_t w = 0; w < p.w; ++w) {
                      const float v = xv[((n * p.c + c) * p.h + h) * p.w + w];
                      x32[l.offset(n, c, h, w)] = v;
                      x16[l.offset(n, c, h, w)] = BFloat16(v).bits;
                    }
              const void* xs = xt == DType::kF32 ? static_cast<const void*>(x32.data()) : x16.data();
              std::vector<float> want_y(p.y_numel());
              std::vector<uint8_t> want_a(p.y_numel()), got_a(p.y_numel(), 7);
              ref::relu_max_pool2d_forward(p, xv.data(), want_y.data(), want_a.data());
              std::vector<char> got_y(p.y_numel() * dtype_size(yt));
              relu_max_pool2d_forward_strided(p, xt, xs, l, yt, got_y.data(), got_a.data());
              std::vector<char> want_yt(got_y.size());
              convert(want_y.data(), DType::kF32, want_yt.data(), yt, p.y_numel());
              ASSERT_EQ(got_y, want_yt) << "forward values";
              ASSERT_EQ(got_a, want_a) << "window indices";

              // Backward: dy in yt, dx in xt (the conv's dtype) and layout l.
              std::vector<float> dyv = random_values<float>(p.y_numel(), seed + 1);
              std::vector<char> dy(p.y_numel() * dtype_size(yt));
              convert(dyv.data(), DType::kF32, dy.data(), yt, p.y_numel());
              std::vector<float> dy_back(p.y_numel()), want_dx(p.x_numel());
              convert(dy.data(), yt, dy_back.data(), DType::kF32, p.y_numel());
              ref::max_pool2d_backward(p, dy_back.data(), want_a.data(), want_dx.data());
              const int64_t elems = layout_elems(p, l);
              std::vector<char> dx(elems * dtype_size(xt), 0x5a);  // garbage that must be overwritten
              max_pool2d_backward_strided(p, yt, dy.data(), want_a.data(), xt, dx.data(), l,
                                          elems * static_cast<int64_t>(dtype_size(xt)));
              std::vector<float> dx32(elems);
              convert(dx.data(), xt, dx32.data(), DType::kF32, elems);
              std::vector<float> want_l(elems, 0.0f);
              for (int64_t n = 0; n < p.n; ++n)
                for (int64_t c = 0; c < p.c; ++c)
                  for (int64_t h = 0; h < p.h; ++h)
                    for (int64_t w = 0; w < p.w; ++w) {
                      float v = want_dx[((n * p.c + c) * p.h + h) * p.w + w];
                      if (xt == DType::kBF16) v = static_cast<float>(BFloat16(v));
                      want_l[l.offset(n, c, h, w)] = v;
                    }
              for (int64_t i = 0; i < elems; ++i)
                ASSERT_EQ(std::memcmp(&dx32[i], &want_l[i], 4), 0) << "dx element " << i << ": " << dx32[i]
                                                                   << " want " << want_l[i];
            }
    }
  }
}

TEST(PoolStrided, OverlappingOrPaddedWindowsAreRefused) {
  const Pool2dParams overlap = make_pool2d_params(1, 16, 8, 8, 3, 3, 2, 2, PadMode::kValid);
  const Pool2dParams padded = make_pool2d_params(1, 16, 7, 7, 2, 2, 2, 2, PadMode::kSame);
  EXPECT_FALSE(strided_pool_supported(overlap));
  EXPECT_FALSE(strided_pool_supported(padded));
  std::vector<float> x(16 * 64), y(16 * 16);
  EXPECT_THROW(relu_max_pool2d_forward_strided(overlap, DType::kF32, x.data(), nchw_layout(overlap), DType::kF32,
                                               y.data(), nullptr),
               Error);
}

}  // namespace
}  // namespace demi::kernels
