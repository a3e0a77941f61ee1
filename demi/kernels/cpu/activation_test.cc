// Tests of the activation kernels: fast against reference at every CPU level (f32, bf16, f16; odd sizes,
// in place), the accuracy of the vectorised exp / tanh / erf-based functions on a dense f32 sweep against
// f64, and every backward against f64 central finite differences of the f64 reference forward.
#include "demi/kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/pointwise_test_util.h"
#include "demi/kernels/reference/activation.h"

namespace demi::kernels {
namespace {

using test::random_values;

constexpr Activation kAll[] = {Activation::kReLU, Activation::kSigmoid,  Activation::kTanh,
                               Activation::kGelu, Activation::kGeluTanh, Activation::kSiLU};
static_assert(std::size(kAll) == kNumActivations, "a new activation needs its tests");

template <typename T>
class ActivationFastTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, BFloat16, Half>;
TYPED_TEST_SUITE(ActivationFastTest, FloatTypes);

TYPED_TEST(ActivationFastTest, ForwardAndBackwardMatchReference) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  for (Activation a : kAll) {
    for (int64_t n : {1, 15, 16, 17, 33, 1000}) {
      auto x = random_values<T>(n, 17 + static_cast<uint64_t>(n), -8.0, 8.0);
      auto dy = random_values<T>(n, 5);
      std::vector<T> y_ref(x.size()), dx_ref(x.size());
      ref::activation_forward(a, x.data(), y_ref.data(), n);
      const std::vector<T>& saved = activation_saved(a) == ActivationSaved::kInput ? x : y_ref;
      ref::activation_backward(a, saved.data(), dy.data(), dx_ref.data(), n);
      for (CpuLevel level : supported_cpu_levels()) {
        ScopedCpuLevel scoped(level);
        std::string what = std::string(activation_name(a)) + " " + test::type_name<T>() + " n=" + std::to_string(n) +
                           " at " + test::level_name(level);
        std::vector<T> y(x.size()), dx(x.size());
        activation_forward(a, dt, x.data(), y.data(), n);
        test::expect_close_to_reference(y, y_ref, what + " forward");
        activation_backward(a, dt, saved.data(), dy.data(), dx.data(), n);
        test::expect_close_to_reference(dx, dx_ref, what + " backward");
        // In place: y over x, dx over dy.
        std::vector<T> inplace = x;
        activation_forward(a, dt, inplace.data(), inplace.data(), n);
        test::expect_bit_identical(inplace, y, what + " forward in place");
        std::vector<T> grad = dy;
        activation_backward(a, dt, saved.data(), grad.data(), grad.data(), n);
        test::expect_bit_identical(grad, dx, what + " backward in place");
      }
    }
  }
}

// Long enough to be split over the thread pool (chunks start at arbitrary elements, not vector multiples).
TEST(ActivationFast, ThreadSplitMatchesReference) {
  const int64_t n = 100003;
  auto x = random_values<BFloat16>(n, 2, -6.0, 6.0);
  for (Activation a : {Activation::kReLU, Activation::kGelu}) {
    std::vector<BFloat16> y_ref(x.size()), y(x.size());
    ref::activation_forward(a, x.data(), y_ref.data(), n);
    activation_forward(a, DType::kBF16, x.data(), y.data(), n);
    test::expect_close_to_reference(y, y_ref, std::string(activation_name(a)) + " n=100003");
  }
}

// ReLU's mask kept as bits: the bits are the reference's at every level (odd sizes, a partial last byte,
// NaN, -0, +0), and the backward from bits equals the backward from y bit for bit, in place too; long
// enough to be split over the thread pool (chunks start at whole bytes of the mask).
TYPED_TEST(ActivationFastTest, ReluMaskBitsGiveTheBackwardFromY) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 1000, 100003}) {
    auto x = random_values<T>(n, 40 + static_cast<uint64_t>(n), -4.0, 4.0);
    if (n >= 4) {
      x[0] = T(std::numeric_limits<float>::quiet_NaN());
      x[1] = T(-0.0f);
      x[2] = T(0.0f);
      x[3] = T(std::numeric_limits<float>::infinity());
    }
    auto dy = random_values<T>(n, 9);
    std::vector<T> y(x.size()), dx_ref(x.size());
    ref::activation_forward(Activation::kReLU, x.data(), y.data(), n);
    ref::activation_backward(Activation::kReLU, y.data(), dy.data(), dx_ref.data(), n);
    std::vector<uint8_t> bits_ref(static_cast<size_t>(ref::relu_mask_bytes(n)), 0xAB);
    ref::relu_mask(dt, y.data(), bits_ref.data(), n);
    std::vector<T> dx_bits_ref(x.size());
    ref::relu_backward_mask(dt, bits_ref.data(), dy.data(), dx_bits_ref.data(), n);
    // (dy * 0 is -0 for a negative dy in the reference from y; the bits keep +0, as the fast kernels do.)
    test::expect_close_to_reference(dx_bits_ref, dx_ref, "reference backward from bits n=" + std::to_string(n));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ((bits_ref[static_cast<size_t>(i / 8)] >> (i % 8)) & 1, static_cast<float>(y[i]) > 0 ? 1 : 0) << i;
    }
    if (n % 8) {
      EXPECT_EQ(bits_ref.back() >> (n % 8), 0) << "the last byte's unused bits are 0";
    }
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      const std::string what = test::type_name<T>() + " n=" + std::to_string(n) + " at " + test::level_name(level);
      std::vector<uint8_t> bits(bits_ref.size(), 0xCD);
      relu_mask(dt, y.data(), bits.data(), n);
      EXPECT_EQ(bits, bits_ref) << what;
      std::vector<T> dx(x.size()), dx_from_y(x.size());
      relu_backward_mask(dt, bits.data(), dy.data(), dx.data(), n);
      test::expect_bit_identical(dx, dx_bits_ref, what + " backward");
      activation_backward(Activation::kReLU, dt, y.data(), dy.data(), dx_from_y.data(), n);
      test::expect_bit_identical(dx, dx_from_y, what + " backward, against the backward from y");
      std::vector<T> grad = dy;
      relu_backward_mask(dt, bits.data(), grad.data(), grad.data(), n);
      test::expect_bit_identical(grad, dx_bits_ref, what + " backward in place");
    }
  }
}

TEST(ActivationFast, ReluMaskRejectsOtherDtypes) {
  uint8_t bits[1] = {};
  int32_t v[1] = {1};
  EXPECT_THROW(relu_mask(DType::kI32, v, bits, 1), Error);
  EXPECT_THROW(relu_backward_mask(DType::kI32, bits, v, v, 1), Error);
  std::vector<double> y = {1.0, -1.0, 0.5}, dy = {3.0, 4.0, 5.0}, dx(3);
  relu_mask(DType::kF64, y.data(), bits, 3);
  EXPECT_EQ(bits[0], 0b101);
  relu_backward_mask(DType::kF64, bits, dy.data(), dx.data(), 3);
  EXPECT_EQ(dx, (std::vector<double>{3.0, 0.0, 5.0}));
}

TEST(ActivationFast, ReluKeepsNaNAndSignedZeroLikeTheReference) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, -0.0f, 0.0f, -1.0f, 2.0f, -nan};
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    std::vector<float> y(x.size()), y_ref(x.size());
    activation_forward(Activation::kReLU, DType::kF32, x.data(), y.data(), static_cast<int64_t>(x.size()));
    ref::activation_forward(Activation::kReLU, x.data(), y_ref.data(), static_cast<int64_t>(x.size()));
    test::expect_bit_identical(y, y_ref, "relu at " + test::level_name(level));
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_TRUE(std::signbit(y[1]));
  }
}

// The accuracy of the fast f32 kernels over a dense sweep of x, against the f64 reference.
//
// Forward: in ulps of the true value (values below 2^-100 count as 2^-100, so underflow is not an error
// of millions of ulps). This measures the vectorised exp (sigmoid, SiLU), tanh and erf (GELU) directly.
// GELU's tanh form evaluates its argument 2u = 2 sqrt(2/pi) (x + 0.044715 x^3) in f32 before e^-2u; that
// argument's own rounding (the f32 constants and about 4 roundings, each up to 2^-24 |2u|) is amplified
// |2u| times, as in any f32 evaluation, so its bound grows with |2u|: 4 + 3 |2u| ulps (the portable path
// evaluates 2u in f64).
// Backward: derivatives cross zero (GELU near -0.75, SiLU near -1.28) and 1 - y^2 cancels near |y| = 1,
// so the error is measured in ulps of max(|true value|, 1): absolute below 1, relative above. The truth
// is taken at the f32 value the kernel reads (x, or the correctly rounded y).
double ulp_of(double v, double floor) {
  float f = static_cast<float>(std::max(std::abs(v), floor));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

std::vector<float> sweep_points() {
  std::vector<float> x;
  x.reserve(25000 + 600 + 200);
  for (float v = -12.0f; v <= 12.0f; v += 1.0f / 1024.0f) x.push_back(v);
  for (float v = 12.0f; v <= 120.0f; v += 0.37f) {
    x.push_back(v);
    x.push_back(-v);
  }
  for (float v = 1e-30f; v < 1e-2f; v *= 1.7f) {
    x.push_back(v);
    x.push_back(-v);
  }
  return x;
}

TEST(ActivationAccuracy, DenseSweepAgainstF64) {
  auto x = sweep_points();
  int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> xd(x.begin(), x.end());
  std::vector<float> dy(x.size(), 1.0f);
  std::vector<double> dyd(x.size(), 1.0);
  struct Bound {
    Activation a;
    double forward, backward;  // ulps, as described above
  };
  const Bound bounds[] = {{Activation::kReLU, 0, 0}, {Activation::kSigmoid, 2.5, 1},  {Activation::kTanh, 2.5, 1},
                          {Activation::kGelu, 5, 2}, {Activation::kGeluTanh, 4, 1.5}, {Activation::kSiLU, 3, 2}};
  for (const Bound& b : bounds) {
    std::vector<double> want(x.size()), dwant(x.size());
    ref::activation_forward(b.a, xd.data(), want.data(), n);
    std::vector<float> saved(x.size());
    std::vector<double> saved_d(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      saved[i] = activation_saved(b.a) == ActivationSaved::kInput ? x[i] : static_cast<float>(want[i]);
      saved_d[i] = saved[i];
    }
    ref::activation_backward(b.a, saved_d.data(), dyd.data(), dwant.data(), n);
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      std::vector<float> y(x.size()), dx(x.size());
      activation_forward(b.a, DType::kF32, x.data(), y.data(), n);
      activation_backward(b.a, DType::kF32, saved.data(), dy.data(), dx.data(), n);
      double worst_f = 0, worst_b = 0;
      float at_f = 0, at_b = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        double allowance = 0;  // the extra ulps of GELU-tanh's argument (see above)
        if (b.a == Activation::kGeluTanh) {
          double v = static_cast<double>(x[i]);
          allowance = 3 * std::abs(2 * 0.7978845608028654 * (v + 0.044715 * v * v * v));
        }
        double uf = std::abs(static_cast<double>(y[i]) - want[i]) / ulp_of(want[i], 0x1p-100) - allowance;
        double ub = std::abs(static_cast<double>(dx[i]) - dwant[i]) / ulp_of(dwant[i], 1.0) - allowance;
        if (uf > worst_f) {
          worst_f = uf;
          at_f = x[i];
        }
        if (ub > worst_b) {
          worst_b = ub;
          at_b = x[i];
        }
      }
      std::printf("    %-9s %-11s forward max %.2f ulp (at %g), backward max %.2f ulp (at %g)\n",
                  std::string(activation_name(b.a)).c_str(), test::level_name(level).c_str(), worst_f,
                  static_cast<double>(at_f), worst_b, static_cast<double>(at_b));
      EXPECT_LE(worst_f, b.forward) << activation_name(b.a) << " forward at x = " << at_f << " ("
                                    << test::level_name(level) << ")";
      EXPECT_LE(worst_b, b.backward) << activation_name(b.a) << " backward at x = " << at_b << " ("
                                     << test::level_name(level) << ")";
    }
  }
}

TEST(ActivationGradient, BackwardMatchesFiniteDifferences) {
  const int64_t n = 257;
  auto x = random_values<double>(n, 31, -5.0, 5.0);
  for (auto& v : x)
    if (std::abs(v) < 0.01) v = 0.5;  // away from ReLU's kink
  for (Activation a : kAll) {
    std::vector<double> y(x.size()), dx(x.size());
    activation_forward(a, DType::kF64, x.data(), y.data(), n);
    const std::vector<double>& saved = activation_saved(a) == ActivationSaved::kInput ? x : y;
    std::vector<double> ones(x.size(), 1.0);
    activation_backward(a, DType::kF64, saved.data(), ones.data(), dx.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double up = x[static_cast<size_t>(i)] + kFiniteDiffStep, down = x[static_cast<size_t>(i)] - kFiniteDiffStep;
      double fu, fd;
      ref::activation_forward(a, &up, &fu, 1);
      ref::activation_forward(a, &down, &fd, 1);
      double numeric = (fu - fd) / (2 * kFiniteDiffStep);
      EXPECT_TRUE(kFiniteDiffTolerance.close(dx[static_cast<size_t>(i)], numeric))
          << activation_name(a) << " at x = " << x[static_cast<size_t>(i)] << ": backward "
          << dx[static_cast<size_t>(i)] << ", finite difference " << numeric;
    }
  }
}

TEST(ActivationFast, SavedTensorsAndErrors) {
  EXPECT_EQ(activation_saved(Activation::kReLU), ActivationSaved::kOutput);
  EXPECT_EQ(activation_saved(Activation::kSigmoid), ActivationSaved::kOutput);
  EXPECT_EQ(activation_saved(Activation::kTanh), ActivationSaved::kOutput);
  EXPECT_EQ(activation_saved(Activation::kGelu), ActivationSaved::kInput);
  EXPECT_EQ(activation_saved(Activation::kGeluTanh), ActivationSaved::kInput);
  EXPECT_EQ(activation_saved(Activation::kSiLU), ActivationSaved::kInput);
  std::vector<int32_t> x(4), y(4);
  try {
    activation_forward(Activation::kGelu, DType::kI32, x.data(), y.data(), 4);
    FAIL() << "integer data must throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("activation_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gelu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  }
  EXPECT_THROW(activation_backward(Activation::kReLU, DType::kBool, x.data(), x.data(), y.data(), 4), Error);
}

}  // namespace
}  // namespace demi::kernels
