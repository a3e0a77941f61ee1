#include "demi/kernels/conv_params.h"

#include <gtest/gtest.h>

#include <string>

#include "demi/core/error.h"

namespace demi::kernels {
namespace {

// The message of the demi::Error that f throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConvPadMode, ParsesMindSporeNamesCaseInsensitively) {
  EXPECT_EQ(parse_pad_mode("valid"), PadMode::kValid);
  EXPECT_EQ(parse_pad_mode("same"), PadMode::kSame);
  EXPECT_EQ(parse_pad_mode("pad"), PadMode::kPad);
  EXPECT_EQ(parse_pad_mode("SAME"), PadMode::kSame);
  std::string msg = error_of([] { parse_pad_mode("full"); });
  EXPECT_NE(msg.find("\"full\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"same\", \"valid\", \"pad\""), std::string::npos) << msg;
}

TEST(ConvPadMode, ValidHasNoPaddingAndKeepsWholeWindows) {
  // The seed's conv: 32x32, k3, valid -> 30x30.
  Conv2dPadding r = resolve_conv2d_padding(PadMode::kValid, 32, 32, 3, 3, 1, 1);
  EXPECT_EQ(r.top + r.bottom + r.left + r.right, 0);
  EXPECT_EQ(r.out_h, 30);
  EXPECT_EQ(r.out_w, 30);
  // Stride 2 on 8: windows at 0, 2, 4 (the one at 6 would need column 8): floor((8 - 3) / 2) + 1 = 3.
  r = resolve_conv2d_padding(PadMode::kValid, 8, 9, 3, 3, 2, 2);
  EXPECT_EQ(r.out_h, 3);
  EXPECT_EQ(r.out_w, 4);
  // Dilation 2 spans 5.
  r = resolve_conv2d_padding(PadMode::kValid, 7, 7, 3, 3, 1, 1, 2, 2);
  EXPECT_EQ(r.out_h, 3);
}

TEST(ConvPadMode, SameGivesCeilOfInputOverStrideWithTheOddPadAtBottomRight) {
  // Stride 1, k3: one row each side; output = input.
  Conv2dPadding r = resolve_conv2d_padding(PadMode::kSame, 28, 28, 3, 3, 1, 1);
  EXPECT_EQ(r.top, 1);
  EXPECT_EQ(r.bottom, 1);
  EXPECT_EQ(r.out_h, 28);
  // Even kernel: 3 rows of padding needed, 1 on top, 2 at the bottom (TensorFlow / MindSpore).
  r = resolve_conv2d_padding(PadMode::kSame, 5, 5, 4, 4, 1, 1);
  EXPECT_EQ(r.top, 1);
  EXPECT_EQ(r.bottom, 2);
  EXPECT_EQ(r.left, 1);
  EXPECT_EQ(r.right, 2);
  EXPECT_EQ(r.out_h, 5);
  // Stride 2 on 6 with k3: out 3, needs (3-1)*2 + 3 - 6 = 1 row, at the bottom.
  r = resolve_conv2d_padding(PadMode::kSame, 6, 7, 3, 3, 2, 2);
  EXPECT_EQ(r.top, 0);
  EXPECT_EQ(r.bottom, 1);
  EXPECT_EQ(r.out_h, 3);
  // 7 wide: out 4, needs 3*2 + 3 - 7 = 2 columns, split 1 / 1.
  EXPECT_EQ(r.left, 1);
  EXPECT_EQ(r.right, 1);
  EXPECT_EQ(r.out_w, 4);
  // Stride larger than the kernel can need no padding at all.
  r = resolve_conv2d_padding(PadMode::kSame, 9, 9, 1, 1, 3, 3);
  EXPECT_EQ(r.top + r.bottom, 0);
  EXPECT_EQ(r.out_h, 3);
  // Dilation widens the kernel: k3 dilation 2 spans 5, so 4 rows of padding.
  r = resolve_conv2d_padding(PadMode::kSame, 10, 10, 3, 3, 1, 1, 2, 2);
  EXPECT_EQ(r.top, 2);
  EXPECT_EQ(r.bottom, 2);
  EXPECT_EQ(r.out_h, 10);
  // A kernel larger than the input still works: padding makes room.
  r = resolve_conv2d_padding(PadMode::kSame, 2, 2, 5, 5, 1, 1);
  EXPECT_EQ(r.out_h, 2);
  EXPECT_EQ(r.top + r.bottom, 4);
}

TEST(ConvPadMode, PadUsesTheGivenAsymmetricPadding) {
  Conv2dPadding r = resolve_conv2d_padding(PadMode::kPad, 28, 20, 3, 3, 1, 2, 1, 1, 1, 2, 0, 3);
  EXPECT_EQ(r.top, 1);
  EXPECT_EQ(r.bottom, 2);
  EXPECT_EQ(r.left, 0);
  EXPECT_EQ(r.right, 3);
  EXPECT_EQ(r.out_h, 29);  // 28 + 3 - 3 + 1
  EXPECT_EQ(r.out_w, (20 + 3 - 3) / 2 + 1);
}

TEST(ConvPadMode, ImpossibleConfigurationsAreClearErrors) {
  std::string msg = error_of([] { resolve_conv2d_padding(PadMode::kValid, 2, 8, 3, 3, 1, 1); });
  EXPECT_NE(msg.find("kernel height"), std::string::npos) << msg;
  EXPECT_NE(msg.find("larger than the padded input"), std::string::npos) << msg;
  msg = error_of([] { resolve_conv2d_padding(PadMode::kPad, 5, 5, 3, 7, 1, 1, 1, 1, 0, 0, 0, 1); });
  EXPECT_NE(msg.find("kernel width (7"), std::string::npos) << msg;
  msg = error_of([] { resolve_conv2d_padding(PadMode::kSame, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1); });
  EXPECT_NE(msg.find("padding must be 0 when pad_mode is \"same\""), std::string::npos) << msg;
  EXPECT_NE(error_of([] { resolve_conv2d_padding(PadMode::kValid, 5, 5, 3, 3, 0, 1); }), "");
  EXPECT_NE(error_of([] { resolve_conv2d_padding(PadMode::kValid, 5, 5, 3, 3, 1, 1, 0, 1); }), "");
  EXPECT_NE(error_of([] { resolve_conv2d_padding(PadMode::kPad, 5, 5, 3, 3, 1, 1, 1, 1, -1, 0, 0, 0); }), "");
}

TEST(Conv2dParams, OutputSizeAndChecks) {
  Conv2dParams p;
  p.n = 2;
  p.c = 6;
  p.h = 11;
  p.w = 9;
  p.oc = 4;
  p.kh = 3;
  p.kw = 2;
  p.stride_h = 2;
  p.pad_top = 0;
  p.pad_bottom = 1;
  p.groups = 2;
  EXPECT_EQ(p.out_h(), (11 + 1 - 3) / 2 + 1);
  EXPECT_EQ(p.out_w(), 8);
  EXPECT_EQ(p.w_numel(), 4 * 3 * 3 * 2);
  EXPECT_NO_THROW(check_conv2d_params(p, "conv2d forward"));

  Conv2dParams bad = p;
  bad.groups = 4;  // 6 channels are not divisible by 4
  std::string msg = error_of([&] { check_conv2d_params(bad, "conv2d forward"); });
  EXPECT_NE(msg.find("conv2d forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("groups (4) must divide both the input channels (6)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("x(2, 6, 11, 9) float32"), std::string::npos) << msg;

  bad = p;
  bad.kh = 13;
  EXPECT_NE(error_of([&] { check_conv2d_params(bad, "conv2d"); }).find("larger than the padded input"),
            std::string::npos);
  bad = p;
  bad.x_dtype = DType::kI32;
  EXPECT_NE(error_of([&] { check_conv2d_params(bad, "conv2d"); }).find("floating"), std::string::npos);
  bad = p;
  bad.x_dtype = DType::kF64;
  EXPECT_NE(error_of([&] { check_conv2d_params(bad, "conv2d"); }).find("float64 cannot be mixed"),
            std::string::npos);
  bad = p;
  bad.dilation_w = 0;
  EXPECT_NE(error_of([&] { check_conv2d_params(bad, "conv2d"); }), "");
}

}  // namespace
}  // namespace demi::kernels
