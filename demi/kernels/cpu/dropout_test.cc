// Tests of the dropout kernels: the fast masks and outputs bit-identical to the reference at every CPU
// level and thread count (f32, bf16, f16; sizes around the 64-element blocks; a counter that carries into
// its high word), the keep rule, the kept fraction, keep_prob 0 and 1, and the backward against f64 finite
// differences.
#include "demi/kernels/cpu/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/kernels/cpu/internal/pointwise_test_util.h"
#include "demi/kernels/reference/dropout.h"

namespace demi::kernels {
namespace {

using test::random_values;

template <typename T>
class DropoutFastTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, BFloat16, Half>;
TYPED_TEST_SUITE(DropoutFastTest, FloatTypes);

TYPED_TEST(DropoutFastTest, MaskAndOutputMatchReferenceExactly) {
  using T = TypeParam;
  const DType dt = dtype_of_v<T>;
  const uint64_t counters[] = {12345, 0xfffffff0ull, 0x1234567800000007ull};  // the second carries
  for (float keep : {0.5f, 0.1f}) {
    for (int64_t n : {1, 3, 15, 63, 64, 65, 130, 4099}) {
      for (uint64_t counter : counters) {
        DropoutParams p{keep, 0x5eedull + static_cast<uint64_t>(n), counter};
        auto x = random_values<T>(n, 3 + static_cast<uint64_t>(n));
        auto dy = random_values<T>(n, 4);
        int64_t mb = dropout_mask_bytes(n);
        std::vector<T> y_ref(x.size()), dx_ref(x.size());
        std::vector<uint8_t> m_ref(static_cast<size_t>(mb));
        ref::dropout_forward(p, x.data(), y_ref.data(), m_ref.data(), n);
        ref::dropout_backward(keep, dy.data(), m_ref.data(), dx_ref.data(), n);
        for (CpuLevel level : supported_cpu_levels()) {
          ScopedCpuLevel scoped(level);
          std::string what = "dropout " + test::type_name<T>() + " keep " + std::to_string(keep) +
                             " n=" + std::to_string(n) + " counter " + std::to_string(counter) + " at " +
                             test::level_name(level);
          std::vector<T> y(x.size()), dx(x.size());
          std::vector<uint8_t> m(static_cast<size_t>(mb), 0xa5);
          dropout_forward(p, dt, x.data(), y.data(), m.data(), n);
          EXPECT_EQ(m, m_ref) << what << " mask";
          test::expect_bit_identical(y, y_ref, what + " y");
          dropout_backward(keep, dt, dy.data(), m.data(), dx.data(), n);
          test::expect_bit_identical(dx, dx_ref, what + " dx");
          std::vector<T> inplace = x;
          dropout_forward(p, dt, inplace.data(), inplace.data(), m.data(), n);
          test::expect_bit_identical(inplace, y_ref, what + " y in place");
        }
      }
    }
  }
}

TEST(DropoutFast, ThreadCountDoesNotChangeTheMask) {
  const int64_t n = 1 << 18;
  auto x = random_values<BFloat16>(n, 8);
  DropoutParams p{0.7f, 42, 1000};
  std::vector<uint8_t> m1(static_cast<size_t>(dropout_mask_bytes(n)));
  std::vector<BFloat16> y1(x.size());
  int saved = num_threads();
  set_num_threads(1);
  dropout_forward(p, DType::kBF16, x.data(), y1.data(), m1.data(), n);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    std::vector<uint8_t> m(m1.size());
    std::vector<BFloat16> y(x.size());
    dropout_forward(p, DType::kBF16, x.data(), y.data(), m.data(), n);
    EXPECT_EQ(m, m1) << threads << " threads";
    test::expect_bit_identical(y, y1, std::to_string(threads) + " threads");
  }
  set_num_threads(saved);
}

TEST(DropoutReference, KeepRuleIsUniformBelowKeepProb) {
  // (w >> 8) < dropout_threshold(p)  <=>  u32_to_unit_float(w) < p, for every word and these p.
  Generator gen(7);
  for (float p : {0.0f, 1e-7f, 0.1f, 1.0f / 3.0f, 0.5f, 0.9f, 0.99999994f, 1.0f}) {
    uint32_t t = dropout_threshold(p);
    for (int i = 0; i < 20000; ++i) {
      uint32_t w = gen.next_u32();
      ASSERT_EQ((w >> 8) < t, u32_to_unit_float(w) < p) << "p " << p << " w " << w;
    }
    // The boundary words themselves.
    for (uint32_t k : {t == 0 ? 0u : t - 1, t < (1u << 24) ? t : (1u << 24) - 1}) {
      uint32_t w = k << 8;
      ASSERT_EQ((w >> 8) < t, u32_to_unit_float(w) < p) << "p " << p << " boundary " << k;
    }
  }
  EXPECT_EQ(dropout_threshold(1.0f), 1u << 24);
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
}

TEST(DropoutFast, KeptFractionScaleAndExtremes) {
  const int64_t n = 200003;
  std::vector<float> x(static_cast<size_t>(n), 2.0f), y(x.size());
  std::vector<uint8_t> m(static_cast<size_t>(dropout_mask_bytes(n)));
  Generator gen(123);
  DropoutParams p = make_dropout_params(0.8f, gen, n);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>((n + 3) / 4));  // the counters n elements use
  dropout_forward(p, DType::kF32, x.data(), y.data(), m.data(), n);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool bit = (m[static_cast<size_t>(i / 8)] >> (i % 8)) & 1;
    kept += bit;
    ASSERT_EQ(y[static_cast<size_t>(i)], bit ? 2.0f * (1.0f / 0.8f) : 0.0f) << i;
  }
  double sigma = std::sqrt(n * 0.8 * 0.2);
  EXPECT_NEAR(static_cast<double>(kept), 0.8 * n, 5 * sigma);
  EXPECT_EQ(m.back() >> (n % 8), 0) << "unused bits of the last byte are 0";
  // The next call continues the stream: a different mask.
  DropoutParams q = make_dropout_params(0.8f, gen, n);
  EXPECT_NE(q.counter, p.counter);

  p.keep_prob = 1.0f;
  dropout_forward(p, DType::kF32, x.data(), y.data(), m.data(), n);
  EXPECT_EQ(y, x);
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(m.size()); ++i) EXPECT_EQ(m[static_cast<size_t>(i)], 0xff);
  p.keep_prob = 0.0f;
  dropout_forward(p, DType::kF32, x.data(), y.data(), m.data(), n);
  for (float v : y) ASSERT_EQ(v, 0.0f);
}

TEST(DropoutGradient, BackwardMatchesFiniteDifferences) {
  const int64_t n = 133;
  auto x = random_values<double>(n, 5);
  auto w = random_values<double>(n, 6);
  DropoutParams p{0.6f, 99, 7};
  std::vector<uint8_t> m(static_cast<size_t>(dropout_mask_bytes(n)));
  std::vector<double> y(x.size()), dx(x.size());
  dropout_forward(p, DType::kF64, x.data(), y.data(), m.data(), n);
  dropout_backward(p.keep_prob, DType::kF64, w.data(), m.data(), dx.data(), n);
  auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> yv(xv.size());
    std::vector<uint8_t> mv(m.size());
    ref::dropout_forward(p, xv.data(), yv.data(), mv.data(), n);
    double s = 0;
    for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * w[i];
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
    EXPECT_TRUE(kFiniteDiffTolerance.close(dx[i], fd)) << "dx[" << i << "] " << dx[i] << " vs " << fd;
  }
}

TEST(DropoutFast, Errors) {
  std::vector<float> x(8), y(8);
  std::vector<uint8_t> m(1);
  DropoutParams p{1.5f, 0, 0};
  EXPECT_THROW(dropout_forward(p, DType::kF32, x.data(), y.data(), m.data(), 8), Error);
  p.keep_prob = 0.5f;
  std::vector<int64_t> xi(8), yi(8);
  try {
    dropout_forward(p, DType::kI64, xi.data(), yi.data(), m.data(), 8);
    FAIL() << "integer data must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dropout_backward(-0.1f, DType::kF32, x.data(), m.data(), y.data(), 8), Error);
}

}  // namespace
}  // namespace demi::kernels
