// The geometry of one 2-D pooling (MaxPool2d, AvgPool2d), shared by the fast kernels (cpu/pool.h) and
// their reference twins (reference/pool.h), and the resolution of MindSpore's pad_mode into explicit
// padding and an output size.
//
//   x (N, C, H, W) -> y (N, C, OH, OW), NCHW, contiguous; window (KH, KW), stride (SH, SW)
//   OH = (H + pad_top + pad_bottom - KH) / SH + 1   (floor: ceil_mode is false), OW alike
//
// MindSpore's pad_mode (nn.MaxPool2d / nn.AvgPool2d, both default "valid"):
//   "valid": no padding; OH = floor((H - KH) / SH) + 1.
//   "same":  OH = ceil(H / SH); the padding needed, max((OH - 1) * SH + KH - H, 0), is split evenly with
//            the odd one at the bottom/right. AvgPool divides by the number of real (unpadded) elements
//            in the window: MindSpore runs "same" through ops.AvgPool, whose CPU kernel is oneDNN's
//            pooling_avg (= pooling_avg_exclude_padding), as TensorFlow does.
//   "pad":   explicit padding (padding=int or (h, w)); AvgPool's count_include_pad decides the divisor,
//            default true as in MindSpore (ops.AvgPool3D, oneDNN pooling_avg_include_padding) and PyTorch.
// MaxPool ignores padded positions (they act as -inf).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "demi/kernels/conv_params.h"  // PadMode, parse_pad_mode, pad_mode_name (shared with Conv2d)

namespace demi::kernels {

struct Pool2dParams {
  int64_t n = 1, c = 1, h = 0, w = 0;  // input x (N, C, H, W)
  int64_t kh = 1, kw = 1;              // window
  int64_t sh = 1, sw = 1;              // stride
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t oh = 0, ow = 0;  // output y (N, C, OH, OW)
  // AvgPool only: divide by KH * KW (true) or by the number of unpadded elements in the window (false).
  bool count_include_pad = true;

  int64_t planes() const { return n * c; }
  int64_t x_numel() const { return n * c * h * w; }
  int64_t y_numel() const { return n * c * oh * ow; }
  // The 2x2 window with stride 2 that models A and B use (the kernels' fast path).
  bool is_2x2_stride_2() const { return kh == 2 && kw == 2 && sh == 2 && sw == 2; }
  // Windows do not overlap: every input element lies in at most one window (backward writes, never adds).
  bool non_overlapping() const { return sh >= kh && sw >= kw; }
};

// Builds the geometry of a pooling with MindSpore's arguments: pad_h and pad_w are used in kPad mode
// only (they must be 0 otherwise, as MindSpore requires). count_include_pad applies to kPad; kSame
// always excludes the padding (see the top of this file). Throws a demi::Error naming `op` if the
// window does not fit or an argument is out of range.
Pool2dParams make_pool2d_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                int64_t sw, PadMode mode, int64_t pad_h = 0, int64_t pad_w = 0,
                                bool count_include_pad = true, std::string_view op = "pool2d");

// Checks a geometry the kernels are handed: positive sizes, 0 <= padding < window, output size equal
// to the formula above. Throws a demi::Error naming `op` and the geometry otherwise.
void check_pool2d_params(const Pool2dParams& p, std::string_view op);

// "x (N, C, H, W) k (KH, KW) s (SH, SW) pad (T, B, L, R) -> y (N, C, OH, OW)" for error messages.
std::string describe(const Pool2dParams& p);

}  // namespace demi::kernels
