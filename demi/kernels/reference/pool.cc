#include "demi/kernels/reference/pool.h"

#include <cmath>

#include "demi/core/half.h"

namespace demi::kernels::ref {
namespace {

// The outputs along one axis whose windows contain input position i: [first, last] (empty if last < first).
void covering(int64_t i, int64_t k, int64_t s, int64_t pad_lo, int64_t out, int64_t& first, int64_t& last) {
  // o * s - pad_lo <= i <= o * s - pad_lo + k - 1
  int64_t lo = i + pad_lo - k + 1;
  first = lo <= 0 ? 0 : (lo + s - 1) / s;
  last = (i + pad_lo) / s;
  if (last > out - 1) last = out - 1;
}

template <typename T>
void max_pool_impl(const Pool2dParams& p, const T* x, T* y, uint8_t* argmax, bool relu) {
  using A = AccT<T>;
  for (int64_t plane = 0; plane < p.planes(); ++plane) {
    const T* xp = x + plane * p.h * p.w;
    for (int64_t oy = 0; oy < p.oh; ++oy) {
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        A best = 0;
        int64_t best_at = -1;
        for (int64_t dh = 0; dh < p.kh; ++dh) {
          int64_t iy = oy * p.sh - p.pad_top + dh;
          if (iy < 0 || iy >= p.h) continue;
          for (int64_t dw = 0; dw < p.kw; ++dw) {
            int64_t ix = ox * p.sw - p.pad_left + dw;
            if (ix < 0 || ix >= p.w) continue;
            A v = static_cast<A>(xp[iy * p.w + ix]);
            // The first maximum wins a tie; a NaN wins over any number.
            if (best_at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              best_at = dh * p.kw + dw;
            }
          }
        }
        int64_t o = (plane * p.oh + oy) * p.ow + ox;
        uint8_t idx = static_cast<uint8_t>(best_at);
        if (relu && !(best > 0)) {
          // relu(v) = (v < 0 ? 0 : v): keeps -0 and NaN as they are; no gradient passes either way.
          if (best < 0) best = 0;
          idx = kArgmaxNone;
        }
        y[o] = T(best);
        if (argmax) argmax[o] = idx;
      }
    }
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(const Pool2dParams& p, const T* x, T* y, uint8_t* argmax) {
  max_pool_impl(p, x, y, argmax, false);
}

template <typename T>
void relu_max_pool2d_forward(const Pool2dParams& p, const T* x, T* y, uint8_t* argmax) {
  max_pool_impl(p, x, y, argmax, true);
}

// Gathers, for every input element, the gradients of the windows that selected it (no scratch memory,
// and each dx is summed in the order of its windows).
template <typename T>
void max_pool2d_backward(const Pool2dParams& p, const T* dy, const uint8_t* argmax, T* dx) {
  using A = AccT<T>;
  for (int64_t plane = 0; plane < p.planes(); ++plane) {
    const T* dyp = dy + plane * p.oh * p.ow;
    const uint8_t* ap = argmax + plane * p.oh * p.ow;
    T* dxp = dx + plane * p.h * p.w;
    for (int64_t iy = 0; iy < p.h; ++iy) {
      int64_t oy0, oy1;
      covering(iy, p.kh, p.sh, p.pad_top, p.oh, oy0, oy1);
      for (int64_t ix = 0; ix < p.w; ++ix) {
        int64_t ox0, ox1;
        covering(ix, p.kw, p.sw, p.pad_left, p.ow, ox0, ox1);
        A sum = 0;
        for (int64_t oy = oy0; oy <= oy1; ++oy) {
          for (int64_t ox = ox0; ox <= ox1; ++ox) {
            int64_t at = (iy - (oy * p.sh - p.pad_top)) * p.kw + (ix - (ox * p.sw - p.pad_left));
            if (ap[oy * p.ow + ox] == at) sum += static_cast<A>(dyp[oy * p.ow + ox]);
          }
        }
        dxp[iy * p.w + ix] = T(sum);
      }
    }
  }
}

int64_t avg_pool2d_divisor(const Pool2dParams& p, int64_t oy, int64_t ox) {
  if (p.count_include_pad) return p.kh * p.kw;
  int64_t y0 = oy * p.sh - p.pad_top, x0 = ox * p.sw - p.pad_left;
  int64_t y1 = y0 + p.kh, x1 = x0 + p.kw;
  if (y0 < 0) y0 = 0;
  if (x0 < 0) x0 = 0;
  if (y1 > p.h) y1 = p.h;
  if (x1 > p.w) x1 = p.w;
  return (y1 - y0) * (x1 - x0);
}

template <typename T>
void avg_pool2d_forward(const Pool2dParams& p, const T* x, T* y) {
  using A = AccT<T>;
  for (int64_t plane = 0; plane < p.planes(); ++plane) {
    const T* xp = x + plane * p.h * p.w;
    for (int64_t oy = 0; oy < p.oh; ++oy) {
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        A sum = 0;
        for (int64_t dh = 0; dh < p.kh; ++dh) {
          int64_t iy = oy * p.sh - p.pad_top + dh;
          if (iy < 0 || iy >= p.h) continue;
          for (int64_t dw = 0; dw < p.kw; ++dw) {
            int64_t ix = ox * p.sw - p.pad_left + dw;
            if (ix < 0 || ix >= p.w) continue;
            sum += static_cast<A>(xp[iy * p.w + ix]);
          }
        }
        y[(plane * p.oh + oy) * p.ow + ox] = T(sum / static_cast<A>(avg_pool2d_divisor(p, oy, ox)));
      }
    }
  }
}

template <typename T>
void avg_pool2d_backward(const Pool2dParams& p, const T* dy, T* dx) {
  using A = AccT<T>;
  for (int64_t plane = 0; plane < p.planes(); ++plane) {
    const T* dyp = dy + plane * p.oh * p.ow;
    T* dxp = dx + plane * p.h * p.w;
    for (int64_t iy = 0; iy < p.h; ++iy) {
      int64_t oy0, oy1;
      covering(iy, p.kh, p.sh, p.pad_top, p.oh, oy0, oy1);
      for (int64_t ix = 0; ix < p.w; ++ix) {
        int64_t ox0, ox1;
        covering(ix, p.kw, p.sw, p.pad_left, p.ow, ox0, ox1);
        A sum = 0;
        for (int64_t oy = oy0; oy <= oy1; ++oy)
          for (int64_t ox = ox0; ox <= ox1; ++ox)
            sum += static_cast<A>(dyp[oy * p.ow + ox]) / static_cast<A>(avg_pool2d_divisor(p, oy, ox));
        dxp[iy * p.w + ix] = T(sum);
      }
    }
  }
}

#define DEMI_INSTANTIATE_POOL(T)                                                           \
  template void max_pool2d_forward<T>(const Pool2dParams&, const T*, T*, uint8_t*);        \
  template void relu_max_pool2d_forward<T>(const Pool2dParams&, const T*, T*, uint8_t*);   \
  template void max_pool2d_backward<T>(const Pool2dParams&, const T*, const uint8_t*, T*); \
  template void avg_pool2d_forward<T>(const Pool2dParams&, const T*, T*);                  \
  template void avg_pool2d_backward<T>(const Pool2dParams&, const T*, T*);
DEMI_INSTANTIATE_POOL(float)
DEMI_INSTANTIATE_POOL(double)
DEMI_INSTANTIATE_POOL(Half)
DEMI_INSTANTIATE_POOL(BFloat16)
#undef DEMI_INSTANTIATE_POOL

}  // namespace demi::kernels::ref
