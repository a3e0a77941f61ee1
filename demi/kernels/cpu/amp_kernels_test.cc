#include "demi/kernels/cpu/amp_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <vector>

#include "demi/core/convert.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::for_each_level;
using testing::random_floats;

// Gradient buffers of odd sizes, one spanning several blocks.
std::vector<std::vector<float>> make_grads() {
  std::vector<std::vector<float>> g;
  uint64_t seed = 121;
  for (int64_t n : {1, 17, 40000, 100003, 5}) g.push_back(random_floats(n, seed++, -1000.0f, 1000.0f));
  return g;
}

std::vector<GradBuffer> spans(std::vector<std::vector<float>>& g) {
  std::vector<GradBuffer> out;
  for (auto& v : g) out.push_back(GradBuffer::f32(v));
  return out;
}

// The same values rounded to `dtype` (f16 or bf16), as buffers of that dtype.
struct LowGrads {
  LowGrads(const std::vector<std::vector<float>>& g, DType low) : dtype(low) {
    for (const auto& v : g) {
      std::vector<uint16_t> b(v.size());
      convert(v.data(), DType::kF32, b.data(), low, static_cast<int64_t>(v.size()));
      bits.push_back(std::move(b));
    }
  }
  std::vector<GradBuffer> buffers() {
    std::vector<GradBuffer> out;
    for (auto& b : bits) out.push_back({b.data(), static_cast<int64_t>(b.size()), dtype});
    return out;
  }
  DType dtype;
  std::vector<std::vector<uint16_t>> bits;
};

TEST(UnscaleAndCheckFinite, MatchesReference) {
  for_each_level([](CpuLevel) {
    for (float inv_scale : {1.0f / 1024.0f, 1.0f / 3.0f, 1.0f}) {
      auto got = make_grads(), want = make_grads();
      auto gs = spans(got), ws = spans(want);
      UnscaleResult r = unscale_and_check_finite(gs, inv_scale);
      UnscaleResult w = ref::unscale_and_check_finite(ws, inv_scale);
      EXPECT_TRUE(r.all_finite);
      EXPECT_EQ(r.first_nonfinite, -1);
      EXPECT_EQ(w.all_finite, r.all_finite);
      EXPECT_EQ(got, want);  // one f32 multiply each: bit-identical
    }
  });
}

TEST(UnscaleAndCheckFinite, FindsTheFirstNonFiniteBuffer) {
  for_each_level([](CpuLevel) {
    struct Case {
      std::vector<std::pair<size_t, size_t>> poison;  // (buffer, index)
      float value;
      int64_t first;
    };
    for (const Case& c : {Case{{{3, 100002}}, INFINITY, 3}, Case{{{2, 39999}, {1, 0}}, NAN, 1},
                          Case{{{4, 4}}, -INFINITY, 4}, Case{{{0, 0}, {3, 5}}, NAN, 0}}) {
      for (float inv_scale : {0.5f, 1.0f}) {
        auto g = make_grads();
        for (auto [b, i] : c.poison) g[b][i] = c.value;
        auto before = g;
        auto gs = spans(g);
        UnscaleResult r = unscale_and_check_finite(gs, inv_scale);
        EXPECT_FALSE(r.all_finite);
        EXPECT_EQ(r.first_nonfinite, c.first);
        // Every buffer is still unscaled (the caller skips the step, but the pass is the same).
        EXPECT_EQ(g[0].size(), before[0].size());
        // Buffer 2's element 7 is never poisoned: read-only when inv_scale == 1, unscaled otherwise.
        EXPECT_EQ(g[2][7], before[2][7] * inv_scale);
      }
    }
    // A finite gradient whose unscaled value overflows counts as non-finite.
    std::vector<std::vector<float>> g = {{1.0f, 3e38f}};
    auto gs = spans(g);
    UnscaleResult r = unscale_and_check_finite(gs, 4.0f);
    EXPECT_FALSE(r.all_finite);
    EXPECT_EQ(r.first_nonfinite, 0);
  });
}

TEST(SumOfSquares, MatchesReference) {
  for_each_level([](CpuLevel) {
    auto g = make_grads();
    std::vector<GradBuffer> cs = spans(g);
    std::vector<double> per(g.size()), want_per(g.size());
    double total = sum_of_squares(cs, per.data());
    double want = ref::sum_of_squares(cs, want_per.data());
    EXPECT_TRUE(tolerance_for(DType::kF32).close(total, want)) << total << " vs " << want;
    EXPECT_TRUE(testing::all_close(per, want_per, tolerance_for(DType::kF32)));
    EXPECT_EQ(sum_of_squares(cs), total);
    EXPECT_EQ(sum_of_squares({}), 0.0);
  });
}

// Clipping's two passes on one block list: the per-buffer sums are sum_of_squares', the coefficient sees
// them, and the buffers are scaled exactly as unscale_and_check_finite scales them (or left alone at 1).
TEST(SumOfSquaresThenScale, IsTheTwoPassesInOne) {
  for_each_level([](CpuLevel) {
    for (float coef : {0.37f, 1.0f}) {
      auto g = make_grads(), want = make_grads();
      std::vector<GradBuffer> cs = spans(g), ws = spans(want);
      std::vector<double> want_per(g.size()), seen(g.size());
      sum_of_squares(ws, want_per.data());
      if (coef != 1.0f) unscale_and_check_finite(ws, coef);
      const float got = sum_of_squares_then_scale(cs, [&](const double* per) {
        std::copy(per, per + g.size(), seen.begin());
        return coef;
      });
      EXPECT_EQ(got, coef);
      EXPECT_EQ(seen, want_per);
      EXPECT_EQ(g, want) << "coefficient " << coef;
    }
  });
}

// AMP O2/O3's parameter gradients: f16 and bf16 buffers are checked as g * inv_scale and never written.
TEST(UnscaleAndCheckFinite, ChecksLowPrecisionBuffersWithoutWritingThem) {
  for_each_level([](CpuLevel) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      auto g = make_grads();
      for (auto& v : g)
        for (float& x : v) x /= 64.0f;  // within f16's range
      LowGrads low(g, dtype);
      const auto before = low.bits;
      for (float inv_scale : {1.0f / 1024.0f, 1.0f}) {
        auto bufs = low.buffers();
        UnscaleResult r = unscale_and_check_finite(bufs, inv_scale);
        EXPECT_TRUE(r.all_finite) << dtype;
        EXPECT_EQ(low.bits, before) << dtype;
      }
      // A non-finite value in buffer 3, and one in buffer 1 that only the product makes infinite.
      LowGrads bad(g, dtype);
      const uint16_t inf = dtype == DType::kF16 ? 0x7c00 : 0x7f80;
      bad.bits[3][100002] = inf;
      auto bufs = bad.buffers();
      UnscaleResult r = unscale_and_check_finite(bufs, 0.5f);
      UnscaleResult w = ref::unscale_and_check_finite(bufs, 0.5f);
      EXPECT_EQ(r.first_nonfinite, 3) << dtype;
      EXPECT_EQ(w.first_nonfinite, 3) << dtype;
      bad.bits[1][16] = dtype == DType::kF16 ? 0x7bff : 0x7f7f;  // the dtype's largest finite value
      bufs = bad.buffers();
      EXPECT_EQ(unscale_and_check_finite(bufs, 1e34f).first_nonfinite, 1) << dtype;
      EXPECT_EQ(ref::unscale_and_check_finite(bufs, 1e34f).first_nonfinite, 1) << dtype;
    }
  });
}

TEST(SumOfSquares, ReadsLowPrecisionBuffers) {
  for_each_level([](CpuLevel) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      auto g = make_grads();
      for (auto& v : g)
        for (float& x : v) x /= 64.0f;
      LowGrads low(g, dtype);
      auto bufs = low.buffers();
      std::vector<double> per(g.size()), want_per(g.size());
      const double total = sum_of_squares(bufs, per.data());
      const double want = ref::sum_of_squares(bufs, want_per.data());
      EXPECT_TRUE(tolerance_for(DType::kF32).close(total, want)) << dtype << ": " << total << " vs " << want;
      EXPECT_TRUE(testing::all_close(per, want_per, tolerance_for(DType::kF32))) << dtype;
    }
  });
}

}  // namespace
}  // namespace demi::kernels
