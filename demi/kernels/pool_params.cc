#include "demi/kernels/pool_params.h"

#include "demi/core/error.h"

namespace demi::kernels {

std::string describe(const Pool2dParams& p) {
  return str_cat("x (", p.n, ", ", p.c, ", ", p.h, ", ", p.w, ") kernel (", p.kh, ", ", p.kw, ") stride (", p.sh, ", ",
                 p.sw, ") pad (top ", p.pad_top, ", bottom ", p.pad_bottom, ", left ", p.pad_left, ", right ",
                 p.pad_right, ") -> y (", p.n, ", ", p.c, ", ", p.oh, ", ", p.ow, ")");
}

namespace {

// One axis: padding and output size. `pad` is the explicit padding of kPad (applied on both sides).
void resolve_axis(std::string_view op, const char* axis, PadMode mode, int64_t in, int64_t k, int64_t s, int64_t pad,
                  int64_t& lo, int64_t& hi, int64_t& out) {
  DEMI_CHECK(in >= 1 && k >= 1 && s >= 1, op, ": input ", axis, " (", in, "), kernel ", axis, " (", k, ") and stride (",
             s, ") must be positive");
  DEMI_CHECK(mode == PadMode::kPad || pad == 0, op, ": padding must be 0 when pad_mode is \"", pad_mode_name(mode),
             "\" (as in MindSpore), got ", pad, " along the ", axis, "; use pad_mode \"pad\" for explicit padding");
  lo = hi = 0;
  if (mode == PadMode::kSame) {
    // ceil(in / s) windows; the padding they need is split evenly, the odd one at the bottom / right.
    int64_t o = (in + s - 1) / s;
    int64_t needed = (o - 1) * s + k - in;
    if (needed < 0) needed = 0;
    lo = needed / 2;
    hi = needed - lo;
  } else if (mode == PadMode::kPad) {
    DEMI_CHECK(pad >= 0 && pad < k, op, ": padding along the ", axis, " must be in [0, kernel ", axis, " = ", k,
               "), got ", pad, " (a window of padding alone has no maximum and no mean)");
    lo = hi = pad;
  }
  DEMI_CHECK(k <= in + lo + hi, op, ": the kernel ", axis, " (", k, ") is larger than the padded input ", axis, " (",
             in, " + padding ", lo, " + ", hi, ")");
  out = (in + lo + hi - k) / s + 1;
}

}  // namespace

Pool2dParams make_pool2d_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                int64_t sw, PadMode mode, int64_t pad_h, int64_t pad_w, bool count_include_pad,
                                std::string_view op) {
  DEMI_CHECK(n >= 1 && c >= 1, op, ": batch (", n, ") and channels (", c, ") must be positive");
  Pool2dParams p;
  p.n = n;
  p.c = c;
  p.h = h;
  p.w = w;
  p.kh = kh;
  p.kw = kw;
  p.sh = sh;
  p.sw = sw;
  resolve_axis(op, "height", mode, h, kh, sh, pad_h, p.pad_top, p.pad_bottom, p.oh);
  resolve_axis(op, "width", mode, w, kw, sw, pad_w, p.pad_left, p.pad_right, p.ow);
  // MindSpore runs "same" through ops.AvgPool (oneDNN pooling_avg: padding excluded) whatever the flag.
  p.count_include_pad = mode == PadMode::kPad ? count_include_pad : false;
  return p;
}

void check_pool2d_params(const Pool2dParams& p, std::string_view op) {
  DEMI_CHECK(p.n >= 1 && p.c >= 1 && p.h >= 1 && p.w >= 1 && p.kh >= 1 && p.kw >= 1 && p.sh >= 1 && p.sw >= 1, op,
             ": sizes, kernel and stride must be positive, got ", describe(p));
  DEMI_CHECK(p.pad_top >= 0 && p.pad_top < p.kh && p.pad_bottom >= 0 && p.pad_bottom < p.kh && p.pad_left >= 0 &&
                 p.pad_left < p.kw && p.pad_right >= 0 && p.pad_right < p.kw,
             op, ": padding must be in [0, kernel) on every side, got ", describe(p));
  DEMI_CHECK(p.kh <= p.h + p.pad_top + p.pad_bottom && p.kw <= p.w + p.pad_left + p.pad_right, op,
             ": the window is larger than the padded input, got ", describe(p));
  int64_t oh = (p.h + p.pad_top + p.pad_bottom - p.kh) / p.sh + 1;
  int64_t ow = (p.w + p.pad_left + p.pad_right - p.kw) / p.sw + 1;
  DEMI_CHECK(p.oh == oh && p.ow == ow, op, ": expected an output of (", oh, ", ", ow, ") for ", describe(p));
}

}  // namespace demi::kernels
