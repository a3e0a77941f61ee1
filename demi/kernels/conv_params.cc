#include "demi/kernels/conv_params.h"

#include <algorithm>
#include <cctype>

#include "demi/core/error.h"

namespace demi::kernels {

std::string describe(const Conv2dParams& p) {
  return str_cat("x(", p.n, ", ", p.c, ", ", p.h, ", ", p.w, ") ", dtype_name(p.x_dtype),
                 p.x_round == DType::kF32 ? "" : str_cat(" read as ", dtype_name(p.x_round)), ", w(", p.oc, ", ",
                 p.groups > 0 ? p.c / p.groups : p.c, ", ", p.kh, ", ", p.kw, ") ", dtype_name(p.w_dtype),
                 " -> y(", p.n, ", ", p.oc, ", ", p.out_h(), ", ", p.out_w(), ") ", dtype_name(p.y_dtype),
                 ", stride ", p.stride_h, "x", p.stride_w, ", pad (top ", p.pad_top, ", bottom ",
                 p.pad_bottom, ", left ", p.pad_left, ", right ", p.pad_right, "), dilation ", p.dilation_h,
                 "x", p.dilation_w, ", groups ", p.groups);
}

namespace {

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}

// Output size along one axis, or a demi::Error when the dilated kernel does not fit the padded input.
int64_t out_size(const char* op, const char* axis, int64_t in, int64_t k, int64_t stride, int64_t dilation,
                 int64_t pad_lo, int64_t pad_hi) {
  int64_t span = (k - 1) * dilation + 1;
  int64_t padded = in + pad_lo + pad_hi;
  DEMI_CHECK(span <= padded, op, ": the kernel ", axis, " (", k, ", dilation ", dilation, ", spanning ", span,
             ") is larger than the padded input ", axis, " (", in, " + padding ", pad_lo, " + ", pad_hi,
             " = ", padded, ")");
  return (padded - span) / stride + 1;
}

}  // namespace

void check_conv2d_params(const Conv2dParams& p, const char* op) {
  DEMI_CHECK(p.n >= 1 && p.c >= 1 && p.h >= 1 && p.w >= 1 && p.oc >= 1 && p.kh >= 1 && p.kw >= 1, op,
             ": every size must be positive, got ", describe(p));
  DEMI_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1, op,
             ": strides and dilations must be >= 1, got ", describe(p));
  DEMI_CHECK(p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0, op,
             ": padding must be non-negative, got ", describe(p));
  DEMI_CHECK(p.groups >= 1 && p.c % p.groups == 0 && p.oc % p.groups == 0, op, ": groups (", p.groups,
             ") must divide both the input channels (", p.c, ") and the output channels (", p.oc, "), got ",
             describe(p));
  out_size(op, "height", p.h, p.kh, p.stride_h, p.dilation_h, p.pad_top, p.pad_bottom);
  out_size(op, "width", p.w, p.kw, p.stride_w, p.dilation_w, p.pad_left, p.pad_right);
  DEMI_CHECK(is_float(p.x_dtype) && is_float(p.w_dtype) && is_float(p.y_dtype) && is_float(p.bias_dtype), op,
             ": expected floating dtypes (float32, bfloat16, float16, float64), got ", describe(p), ", bias ",
             dtype_name(p.bias_dtype));
  bool any_f64 = p.x_dtype == DType::kF64 || p.w_dtype == DType::kF64 || p.y_dtype == DType::kF64;
  bool all_f64 = p.x_dtype == DType::kF64 && p.w_dtype == DType::kF64 && p.y_dtype == DType::kF64;
  DEMI_CHECK(!any_f64 || all_f64, op, ": float64 cannot be mixed with other dtypes, got ", describe(p));
  DEMI_CHECK(p.x_round == DType::kF32 || ((p.x_round == DType::kBF16 || p.x_round == DType::kF16) &&
                                          p.x_dtype == DType::kF32),
             op, ": x can be read as bfloat16 or float16 values only when it is float32, got ", describe(p));
}

PadMode parse_pad_mode(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lower == "valid") return PadMode::kValid;
  if (lower == "same") return PadMode::kSame;
  if (lower == "pad") return PadMode::kPad;
  DEMI_CHECK(false, "conv2d: pad_mode must be one of \"same\", \"valid\", \"pad\", got \"", name, "\"");
  return PadMode::kValid;
}

std::string_view pad_mode_name(PadMode mode) {
  switch (mode) {
    case PadMode::kValid: return "valid";
    case PadMode::kSame: return "same";
    case PadMode::kPad: return "pad";
  }
  return "?";
}

Conv2dPadding resolve_conv2d_padding(PadMode mode, int64_t h, int64_t w, int64_t kh, int64_t kw,
                                     int64_t stride_h, int64_t stride_w, int64_t dilation_h,
                                     int64_t dilation_w, int64_t pad_top, int64_t pad_bottom,
                                     int64_t pad_left, int64_t pad_right) {
  const char* op = "conv2d";
  DEMI_CHECK(h >= 1 && w >= 1 && kh >= 1 && kw >= 1, op, ": input (", h, "x", w, ") and kernel (", kh, "x",
             kw, ") sizes must be positive");
  DEMI_CHECK(stride_h >= 1 && stride_w >= 1 && dilation_h >= 1 && dilation_w >= 1, op, ": stride (", stride_h,
             ", ", stride_w, ") and dilation (", dilation_h, ", ", dilation_w, ") must be >= 1");
  DEMI_CHECK(pad_top >= 0 && pad_bottom >= 0 && pad_left >= 0 && pad_right >= 0, op,
             ": padding must be non-negative, got (top ", pad_top, ", bottom ", pad_bottom, ", left ",
             pad_left, ", right ", pad_right, ")");
  bool any_pad = pad_top || pad_bottom || pad_left || pad_right;
  DEMI_CHECK(mode == PadMode::kPad || !any_pad, op, ": padding must be 0 when pad_mode is \"",
             pad_mode_name(mode), "\" (as in MindSpore), got (top ", pad_top, ", bottom ", pad_bottom,
             ", left ", pad_left, ", right ", pad_right, "); use pad_mode \"pad\" for explicit padding");
  Conv2dPadding r;
  if (mode == PadMode::kSame) {
    // TensorFlow's and MindSpore's rule: the output covers ceil(in / stride) windows; the padding that
    // needs is split evenly, the odd one going to the bottom / right.
    auto split = [](int64_t in, int64_t k, int64_t stride, int64_t dilation, int64_t& lo, int64_t& hi) {
      int64_t out = (in + stride - 1) / stride;
      int64_t needed = std::max<int64_t>(0, (out - 1) * stride + (k - 1) * dilation + 1 - in);
      lo = needed / 2;
      hi = needed - lo;
    };
    split(h, kh, stride_h, dilation_h, r.top, r.bottom);
    split(w, kw, stride_w, dilation_w, r.left, r.right);
  } else if (mode == PadMode::kPad) {
    r.top = pad_top;
    r.bottom = pad_bottom;
    r.left = pad_left;
    r.right = pad_right;
  }
  r.out_h = out_size(op, "height", h, kh, stride_h, dilation_h, r.top, r.bottom);
  r.out_w = out_size(op, "width", w, kw, stride_w, dilation_w, r.left, r.right);
  return r;
}

}  // namespace demi::kernels
