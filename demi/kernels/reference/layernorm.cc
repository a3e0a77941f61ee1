#include "demi/kernels/reference/layernorm.h"

#include <cmath>
#include <vector>

namespace demi::kernels::ref {

template <typename T>
void layer_norm_forward(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const LayerNormParams& p, T* y,
                        AccT<T>* mean, AccT<T>* rstd) {
  using A = AccT<T>;
  const int64_t d = p.dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* xr = x + r * d;
    SumT sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += static_cast<A>(xr[j]);
    const A m = static_cast<A>(sum / static_cast<SumT>(d));
    SumT sq = 0;
    for (int64_t j = 0; j < d; ++j) {
      A dev = static_cast<A>(xr[j]) - m;
      sq += dev * dev;
    }
    const A var = static_cast<A>(sq / static_cast<SumT>(d));
    const A rs = A(1) / std::sqrt(var + static_cast<A>(p.eps));
    for (int64_t j = 0; j < d; ++j) {
      A g = gamma ? gamma[j] : A(1), b = beta ? beta[j] : A(0);
      y[r * d + j] = T((static_cast<A>(xr[j]) - m) * rs * g + b);
    }
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <typename T>
void layer_norm_backward(const T* x, const T* dy, const AccT<T>* gamma, const AccT<T>* mean, const AccT<T>* rstd,
                         const LayerNormParams& p, T* dx, AccT<T>* dgamma, AccT<T>* dbeta) {
  using A = AccT<T>;
  const int64_t d = p.dim;
  std::vector<SumT> dg(static_cast<size_t>(d), 0), db(static_cast<size_t>(d), 0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    SumT sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < d; ++j) {
      A xhat = (static_cast<A>(xr[j]) - mean[r]) * rstd[r];
      A g = static_cast<A>(gr[j]) * (gamma ? gamma[j] : A(1));
      sum_g += g;
      sum_gx += g * xhat;
      dg[static_cast<size_t>(j)] += static_cast<A>(gr[j]) * xhat;
      db[static_cast<size_t>(j)] += static_cast<A>(gr[j]);
    }
    const A mg = static_cast<A>(sum_g / static_cast<SumT>(d)), mgx = static_cast<A>(sum_gx / static_cast<SumT>(d));
    for (int64_t j = 0; j < d; ++j) {
      A xhat = (static_cast<A>(xr[j]) - mean[r]) * rstd[r];
      A g = static_cast<A>(gr[j]) * (gamma ? gamma[j] : A(1));
      dx[r * d + j] = T(rstd[r] * (g - mg - xhat * mgx));
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    if (dgamma) dgamma[j] = static_cast<A>(dg[static_cast<size_t>(j)]);
    if (dbeta) dbeta[j] = static_cast<A>(db[static_cast<size_t>(j)]);
  }
}

#define DEMI_INSTANTIATE(T)                                                                                      \
  template void layer_norm_forward<T>(const T*, const AccT<T>*, const AccT<T>*, const LayerNormParams&, T*,      \
                                      AccT<T>*, AccT<T>*);                                                       \
  template void layer_norm_backward<T>(const T*, const T*, const AccT<T>*, const AccT<T>*, const AccT<T>*,       \
                                       const LayerNormParams&, T*, AccT<T>*, AccT<T>*);
DEMI_INSTANTIATE(float)
DEMI_INSTANTIATE(double)
DEMI_INSTANTIATE(Half)
DEMI_INSTANTIATE(BFloat16)
#undef DEMI_INSTANTIATE

}  // namespace demi::kernels::ref
