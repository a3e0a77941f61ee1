// The geometry and dtypes of one 2-D convolution, shared by the oneDNN kernels (onednn/conv.h) and their
// reference twins (reference/conv.h), and the resolution of MindSpore's pad_mode into explicit padding.
//
//   x (N, C, H, W)   w (OC, C/groups, KH, KW)   bias (OC)   y (N, OC, OH, OW), all NCHW, contiguous
//   OH = (H + pad_top + pad_bottom - ((KH - 1) * dilation_h + 1)) / stride_h + 1   (floor), OW alike
//
// Input channel c of group g = c / (C/groups) meets only the OC/groups output channels of that group
// (groups == C == OC is a depthwise convolution). Padding is explicit and may be asymmetric; padding
// rows that no window reaches (floor in OH) are allowed and ignored, as in oneDNN and PyTorch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "demi/core/dtype.h"

namespace demi::kernels {

// How the oneDNN convolution lays its operands out internally. Tensors are always plain NCHW at the
// interface; kBlocked lets oneDNN pick its blocked layouts (nChw16c, ...) and reorders within the call,
// kPlain runs on NCHW directly (gemm-based), kAuto picks by measurement (see onednn/conv.cc).
// The result is the same up to summation order; tests pin each choice.
enum class ConvLayout : uint8_t { kAuto, kPlain, kBlocked };

struct Conv2dParams {
  int64_t n = 1, c = 0, h = 0, w = 0;  // input x (N, C, H, W)
  int64_t oc = 0, kh = 0, kw = 0;      // weights (OC, C/groups, KH, KW)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // 1: dense kernel (PyTorch's convention, not oneDNN's d-1)
  int64_t groups = 1;
  // The dtype of each tensor as the call sees it: forward reads x, w (and bias) and writes y;
  // backward-data reads dy (y_dtype) and w and writes dx (x_dtype); backward-weights reads x and dy and
  // writes dw (w_dtype) and db (bias_dtype), e.g. bf16 x and dy with f32 dw for AMP's master gradients.
  // Each is f32, bf16 or f16 (f64 only when all are f64). Accumulation is in f32 (f64 for f64).
  DType x_dtype = DType::kF32;
  DType w_dtype = DType::kF32;
  DType y_dtype = DType::kF32;
  DType bias_dtype = DType::kF32;
  // An f32 x read as the values of this dtype (bf16 or f16): each value rounded as Tensor::to rounds it,
  // as it is read (AMP's cast of the data batch fused into the read: the direct kernels round while they
  // pad each image, every other path reads a rounded copy). kF32: x's own values. Forward and
  // backward-weights only (x_values(p) is the dtype the call computes with).
  DType x_round = DType::kF32;
  bool relu = false;        // forward: fused ReLU after the bias
  bool accumulate = false;  // backward: dx += ..., dw += ..., db += ... instead of overwriting
  ConvLayout layout = ConvLayout::kAuto;

  int64_t out_h() const { return (h + pad_top + pad_bottom - ((kh - 1) * dilation_h + 1)) / stride_h + 1; }
  int64_t out_w() const { return (w + pad_left + pad_right - ((kw - 1) * dilation_w + 1)) / stride_w + 1; }
  DType x_values() const { return x_round == DType::kF32 ? x_dtype : x_round; }
  int64_t x_numel() const { return n * c * h * w; }
  int64_t w_numel() const { return oc * (c / groups) * kh * kw; }
  int64_t y_numel() const { return n * oc * out_h() * out_w(); }
};

// The fused Conv2d -> ReLU -> MaxPool2d backward's dense gradient (the convolution output's, dy unpooled):
// dy's values in dy's dtype, or rounded to bf16 where the convolution's output is bf16 (p.y_dtype) and dy
// is not, as the separate convolution would read it (an f16 layer whose products are bf16's: its f16
// pooled gradient is rounded as it is unpooled, with no rounded copy of it).
inline DType fused_dense_gradient_dtype(const Conv2dParams& p, DType dy_dtype) {
  return p.y_dtype == DType::kBF16 ? DType::kBF16 : dy_dtype;
}

// "conv2d x(2, 3, 32, 32) bf16, w(32, 3, 3, 3) bf16 -> y(2, 32, 30, 30) bf16, stride 1x1, pad
// (t0, b0, l0, r0), dilation 1x1, groups 1": for error messages.
std::string describe(const Conv2dParams& p);

// Throws demi::Error naming `op`, the shapes and the dtypes unless p is a valid convolution: positive
// sizes, strides and dilations, non-negative padding, C and OC divisible by groups, a dilated kernel that
// fits in the padded input, floating dtypes.
void check_conv2d_params(const Conv2dParams& p, const char* op);

// MindSpore's pad_mode: "valid" (no padding, windows that fit), "same" (OH = ceil(H / stride), the
// padding split evenly with the odd row or column at the bottom / right, as TensorFlow), "pad" (the
// padding given). Parsed case-insensitively; anything else is a demi::Error listing the choices.
enum class PadMode : uint8_t { kValid, kSame, kPad };
PadMode parse_pad_mode(std::string_view name);
std::string_view pad_mode_name(PadMode mode);  // "valid", "same", "pad"

struct Conv2dPadding {
  int64_t top = 0, bottom = 0, left = 0, right = 0;
  int64_t out_h = 0, out_w = 0;
};

// Explicit padding and output size for an input of h x w and a kernel kh x kw. `pad_*` must be zero
// unless mode is kPad (as MindSpore requires). Throws demi::Error on an impossible configuration (a
// dilated kernel larger than the padded input, non-positive stride or dilation, negative padding).
Conv2dPadding resolve_conv2d_padding(PadMode mode, int64_t h, int64_t w, int64_t kh, int64_t kw,
                                     int64_t stride_h, int64_t stride_w, int64_t dilation_h = 1,
                                     int64_t dilation_w = 1, int64_t pad_top = 0, int64_t pad_bottom = 0,
                                     int64_t pad_left = 0, int64_t pad_right = 0);

}  // namespace demi::kernels
