#include "demi/amp/loss_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "demi/amp/policy.h"
#include "demi/core/memory.h"

namespace demi::amp {
namespace {

TEST(DynamicLossScaleManager, MindSporesDefaultsFloorAndCeiling) {
  DynamicLossScaleManager m;
  EXPECT_EQ(m.get_loss_scale(), 16777216.0);
  EXPECT_EQ(m.scale_factor(), 2.0);
  EXPECT_EQ(m.scale_window(), 2000);
  DynamicLossScaleManager small(4.0, 2.0, 1, {.min_scale = 1.0, .max_scale = 16.0});
  small.update_loss_scale(true);
  small.update_loss_scale(true);
  small.update_loss_scale(true);
  EXPECT_EQ(small.get_loss_scale(), 1.0) << "never below the floor";
  for (int i = 0; i < 100; ++i) small.update_loss_scale(false);
  EXPECT_EQ(small.get_loss_scale(), 16.0) << "never above the ceiling, never infinite";
  EXPECT_EQ(small.state().total_overflows, 3);
}

TEST(DynamicLossScaleManager, GrowsOnlyAfterAFullCleanWindow) {
  DynamicLossScaleManager m(8.0, 2.0, 3);
  m.update_loss_scale(false);
  m.update_loss_scale(false);
  m.update_loss_scale(true);  // resets the window and halves
  EXPECT_EQ(m.get_loss_scale(), 4.0);
  m.update_loss_scale(false);
  m.update_loss_scale(false);
  EXPECT_EQ(m.get_loss_scale(), 4.0);
  m.update_loss_scale(false);
  EXPECT_EQ(m.get_loss_scale(), 8.0);
}

TEST(FixedLossScaleManager, KeepsItsScale) {
  FixedLossScaleManager m(1024.0, false);
  m.update_loss_scale(true);
  EXPECT_EQ(m.get_loss_scale(), 1024.0);
  EXPECT_FALSE(m.get_drop_overflow_update());
  EXPECT_EQ(FixedLossScaleManager().get_loss_scale(), 128.0) << "MindSpore's default";
  EXPECT_THROW(FixedLossScaleManager(0.0), Error);
  EXPECT_THROW(FixedLossScaleManager(std::numeric_limits<double>::infinity()), Error);
}

TEST(UnscaleAndCheck, OnePassScalesEverythingAndFindsTheFirstBadBuffer) {
  std::vector<Tensor> grads = {full({5}, 8.0), full({3}, 4.0), full({2}, 2.0)};
  grads[2].set(1, std::numeric_limits<float>::infinity());
  EXPECT_EQ(unscale_and_check(grads, 0.25f), 2);
  EXPECT_FLOAT_EQ(grads[0].get(4), 2.0f);
  EXPECT_FLOAT_EQ(grads[1].get(0), 1.0f);
  EXPECT_FALSE(all_finite(grads));
  grads[2].set(1, 1.0);
  EXPECT_TRUE(all_finite(grads));
  EXPECT_EQ(unscale_and_check(grads, 1.0f), -1);
  grads[0].set(0, std::nanf(""));
  EXPECT_EQ(unscale_and_check(grads, 1.0f), 0);
  // Low-precision gradients are checked where they are: no FP32 copy of them is made.
  std::vector<Tensor> low = {full({4096}, 1.0).to(DType::kF16), full({4096}, 2.0).to(DType::kBF16)};
  const int64_t before = mem_stats().total_current;
  ScopedPeak peak;
  EXPECT_TRUE(all_finite(low));
  EXPECT_LT(peak.peak().total_peak - before, 4096) << "bytes allocated to check them (FP32 copies: 32768)";
  low[1].set(4095, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(all_finite(low));
}

TEST(FunctionalScalers, DynamicScalerAdjusts) {
  DynamicLossScaler s(1024.0, 2.0, 2);
  EXPECT_FALSE(s.adjust(false));
  EXPECT_EQ(s.scale_value(), 512.0);
  s.adjust(true);
  s.adjust(true);
  EXPECT_EQ(s.scale_value(), 1024.0);
  StaticLossScaler st(64.0);
  std::vector<Tensor> g = {full({2}, 128.0)};
  st.unscale(g);
  EXPECT_FLOAT_EQ(g[0].get(0), 2.0f);
}

TEST(Policy, ListsAreDataAndLevelsMapToDtypes) {
  auto white = get_white_list();
  EXPECT_NE(std::find(white.begin(), white.end(), "Conv2d"), white.end());
  EXPECT_NE(std::find(white.begin(), white.end(), "Dense"), white.end());
  auto black = get_black_list();
  EXPECT_NE(std::find(black.begin(), black.end(), "BatchNorm"), black.end());
  AmpPolicy o1(Level::kO1, DType::kBF16);
  EXPECT_EQ(o1.compute_dtype(ops::Op::kConv2d, DType::kF32), DType::kBF16);
  EXPECT_EQ(o1.compute_dtype(ops::Op::kMaxPool2d, DType::kF32), DType::kF32);
  EXPECT_TRUE(o1.outputs_to_fp32(ops::Op::kConv2d));
  AmpPolicy o2(Level::kO2, DType::kF16);
  EXPECT_EQ(o2.compute_dtype(ops::Op::kMaxPool2d, DType::kF32), DType::kF16);
  EXPECT_EQ(o2.compute_dtype(ops::Op::kBatchNorm, DType::kF32), DType::kF32);
  EXPECT_EQ(o2.compute_dtype(ops::Op::kDense, DType::kF64), DType::kF64) << "f64 is never lowered";
  AmpPolicy custom(AmpPolicy::Mode::kBlackList, ops_from_names({"Dense"}), DType::kBF16);
  EXPECT_EQ(custom.compute_dtype(ops::Op::kDense, DType::kF32), DType::kF32);
  EXPECT_THROW(ops_from_names({"Convolution"}), Error);
  EXPECT_THROW(AmpPolicy(Level::kO2, DType::kF32), Error);
  EXPECT_EQ(parse_level("O2"), Level::kO2);
  EXPECT_THROW(parse_level("O4"), Error);
}

}  // namespace
}  // namespace demi::amp
