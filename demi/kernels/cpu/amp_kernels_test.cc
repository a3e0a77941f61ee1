#include "demi/kernels/cpu/amp_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) {
  return {g.begin(), g.end()};
}

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
    std::vector<std::span<const float>> cs(g.begin(), g.end());
    std::vector<double> per(g.size()), want_per(g.size());
    double total = sum_of_squares(cs, per.data());
    double want = ref::sum_of_squares(cs, want_per.data());
    EXPECT_TRUE(tolerance_for(DType::kF32).close(total, want)) << total << " vs " << want;
    EXPECT_TRUE(testing::all_close(per, want_per, tolerance_for(DType::kF32)));
    EXPECT_EQ(sum_of_squares(cs), total);
    EXPECT_EQ(sum_of_squares({}), 0.0);
  });
}

}  // namespace
}  // namespace demi::kernels
