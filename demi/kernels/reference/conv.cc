#include "demi/kernels/reference/conv.h"

#include <algorithm>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/reference/internal/widen.h"

namespace demi::kernels::ref {
namespace {

// Calls f(n, oc, oy, ox, ci, ky, kx, x_index, w_index, y_index) for every multiply of the convolution
// whose input tap lies inside the (unpadded) input: the one loop nest all three directions share, so they
// are adjoint by construction.
template <typename F>
void for_each_tap(const Conv2dParams& p, F&& f) {
  const int64_t OH = p.out_h(), OW = p.out_w();
  const int64_t cg = p.c / p.groups, ocg = p.oc / p.groups;
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t oc = 0; oc < p.oc; ++oc) {
      const int64_t g = oc / ocg;
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          const int64_t yi = ((n * p.oc + oc) * OH + oy) * OW + ox;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < p.kh; ++ky) {
              const int64_t iy = oy * p.stride_h - p.pad_top + ky * p.dilation_h;
              if (iy < 0 || iy >= p.h) continue;
              for (int64_t kx = 0; kx < p.kw; ++kx) {
                const int64_t ix = ox * p.stride_w - p.pad_left + kx * p.dilation_w;
                if (ix < 0 || ix >= p.w) continue;
                const int64_t xi = ((n * p.c + g * cg + ci) * p.h + iy) * p.w + ix;
                const int64_t wi = ((oc * cg + ci) * p.kh + ky) * p.kw + kx;
                f(xi, wi, yi);
              }
            }
        }
    }
}

bool is_f64(const Conv2dParams& p) { return p.x_dtype == DType::kF64; }

// x widened, each value read as if cast to p.x_round first.
template <typename Acc>
std::vector<Acc> widen_x(const Conv2dParams& p, const void* x) {
  std::vector<Acc> X = internal::widen<Acc>(x, p.x_dtype, p.x_numel());
  internal::round_values(X, p.x_round);
  return X;
}

template <typename Acc>
void forward_impl(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  std::vector<Acc> X = widen_x<Acc>(p, x);
  std::vector<Acc> W = internal::widen<Acc>(w, p.w_dtype, p.w_numel());
  std::vector<Acc> Y(static_cast<size_t>(p.y_numel()), Acc(0));
  for_each_tap(p, [&](int64_t xi, int64_t wi, int64_t yi) { Y[yi] += X[xi] * W[wi]; });
  const int64_t plane = p.out_h() * p.out_w();
  std::vector<Acc> B = bias ? internal::widen<Acc>(bias, p.bias_dtype, p.oc) : std::vector<Acc>(p.oc, Acc(0));
  for (int64_t i = 0; i < p.y_numel(); ++i) {
    Acc v = Y[i] + B[(i / plane) % p.oc];
    Y[i] = p.relu ? std::max(v, Acc(0)) : v;
  }
  internal::narrow<Acc>(Y.data(), y, p.y_dtype, p.y_numel());
}

template <typename Acc>
void backward_data_impl(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  std::vector<Acc> DY = internal::widen<Acc>(dy, p.y_dtype, p.y_numel());
  std::vector<Acc> W = internal::widen<Acc>(w, p.w_dtype, p.w_numel());
  std::vector<Acc> DX(static_cast<size_t>(p.x_numel()), Acc(0));
  for_each_tap(p, [&](int64_t xi, int64_t wi, int64_t yi) { DX[xi] += DY[yi] * W[wi]; });
  internal::narrow<Acc>(DX.data(), dx, p.x_dtype, p.x_numel(), p.accumulate);
}

template <typename Acc>
void backward_weights_impl(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  std::vector<Acc> X = widen_x<Acc>(p, x);
  std::vector<Acc> DY = internal::widen<Acc>(dy, p.y_dtype, p.y_numel());
  std::vector<Acc> DW(static_cast<size_t>(p.w_numel()), Acc(0));
  for_each_tap(p, [&](int64_t xi, int64_t wi, int64_t yi) { DW[wi] += DY[yi] * X[xi]; });
  internal::narrow<Acc>(DW.data(), dw, p.w_dtype, p.w_numel(), p.accumulate);
  if (db) {
    std::vector<Acc> DB(static_cast<size_t>(p.oc), Acc(0));
    const int64_t plane = p.out_h() * p.out_w();
    for (int64_t i = 0; i < p.y_numel(); ++i) DB[(i / plane) % p.oc] += DY[i];
    internal::narrow<Acc>(DB.data(), db, p.bias_dtype, p.oc, p.accumulate);
  }
}

}  // namespace

void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  check_conv2d_params(p, "conv2d forward (reference)");
  is_f64(p) ? forward_impl<double>(p, x, w, bias, y) : forward_impl<float>(p, x, w, bias, y);
}

void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  DEMI_CHECK(p.x_round == DType::kF32, "conv2d backward data: an x read as ", dtype_name(p.x_round),
             " values has no data gradient here (", describe(p), ")");
  check_conv2d_params(p, "conv2d backward-data (reference)");
  is_f64(p) ? backward_data_impl<double>(p, dy, w, dx) : backward_data_impl<float>(p, dy, w, dx);
}

void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  check_conv2d_params(p, "conv2d backward-weights (reference)");
  is_f64(p) ? backward_weights_impl<double>(p, x, dy, dw, db)
            : backward_weights_impl<float>(p, x, dy, dw, db);
}

}  // namespace demi::kernels::ref
