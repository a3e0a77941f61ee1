#include "demi/kernels/reference/batchnorm.h"

#include <cmath>

#include "demi/core/error.h"

namespace demi::kernels::ref {

template <typename T>
void batch_norm_forward_training(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const BatchNormParams& p,
                                 T* y, AccT<T>* save_mean, AccT<T>* save_invstd, AccT<T>* running_mean,
                                 AccT<T>* running_var) {
  using A = AccT<T>;
  const int64_t m = p.n * p.spatial;
  DEMI_CHECK(m >= 2, "batch_norm: training needs more than one value per channel, got N=", p.n,
             " x spatial=", p.spatial);
  for (int64_t c = 0; c < p.c; ++c) {
    auto at = [&](int64_t i, int64_t s) { return (i * p.c + c) * p.spatial + s; };
    SumT sum = 0;
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s) sum += static_cast<A>(x[at(i, s)]);
    A mean = static_cast<A>(sum / static_cast<SumT>(m));
    SumT sq = 0;
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s) {
        A d = static_cast<A>(x[at(i, s)]) - mean;
        sq += d * d;
      }
    A var = static_cast<A>(sq / static_cast<SumT>(m));
    A invstd = A(1) / std::sqrt(var + static_cast<A>(p.eps));
    A g = gamma ? gamma[c] : A(1), b = beta ? beta[c] : A(0);
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s)
        y[at(i, s)] = T((static_cast<A>(x[at(i, s)]) - mean) * invstd * g + b);
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    A mom = static_cast<A>(p.momentum);
    if (running_mean) running_mean[c] = mom * running_mean[c] + (A(1) - mom) * mean;
    if (running_var) {
      A v = p.unbiased_running_var ? var * static_cast<A>(m) / static_cast<A>(m - 1) : var;
      running_var[c] = mom * running_var[c] + (A(1) - mom) * v;
    }
  }
}

template <typename T>
void batch_norm_forward_inference(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const AccT<T>* running_mean,
                                  const AccT<T>* running_var, const BatchNormParams& p, T* y) {
  using A = AccT<T>;
  for (int64_t c = 0; c < p.c; ++c) {
    A invstd = A(1) / std::sqrt(running_var[c] + static_cast<A>(p.eps));
    A g = gamma ? gamma[c] : A(1), b = beta ? beta[c] : A(0);
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s) {
        int64_t k = (i * p.c + c) * p.spatial + s;
        y[k] = T((static_cast<A>(x[k]) - running_mean[c]) * invstd * g + b);
      }
  }
}

template <typename T>
void batch_norm_backward(const T* x, const T* dy, const AccT<T>* gamma, const AccT<T>* mean, const AccT<T>* invstd,
                         const BatchNormParams& p, bool training, T* dx, AccT<T>* dgamma, AccT<T>* dbeta) {
  using A = AccT<T>;
  const A m = static_cast<A>(p.n * p.spatial);
  for (int64_t c = 0; c < p.c; ++c) {
    auto at = [&](int64_t i, int64_t s) { return (i * p.c + c) * p.spatial + s; };
    SumT sums[2] = {0, 0};  // sum(dy), sum(dy * xhat)
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s) {
        A g = static_cast<A>(dy[at(i, s)]);
        sums[0] += g;
        sums[1] += g * (static_cast<A>(x[at(i, s)]) - mean[c]) * invstd[c];
      }
    A sum_dy = static_cast<A>(sums[0]), sum_dy_xhat = static_cast<A>(sums[1]);
    if (dgamma) dgamma[c] = sum_dy_xhat;
    if (dbeta) dbeta[c] = sum_dy;
    A gi = (gamma ? gamma[c] : A(1)) * invstd[c];
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t s = 0; s < p.spatial; ++s) {
        A g = static_cast<A>(dy[at(i, s)]);
        if (!training) {
          dx[at(i, s)] = T(g * gi);
          continue;
        }
        A xhat = (static_cast<A>(x[at(i, s)]) - mean[c]) * invstd[c];
        dx[at(i, s)] = T(gi * (g - sum_dy / m - xhat * sum_dy_xhat / m));
      }
  }
}

#define DEMI_INSTANTIATE(T)                                                                                    \
  template void batch_norm_forward_training<T>(const T*, const AccT<T>*, const AccT<T>*, const BatchNormParams&, \
                                               T*, AccT<T>*, AccT<T>*, AccT<T>*, AccT<T>*);                    \
  template void batch_norm_forward_inference<T>(const T*, const AccT<T>*, const AccT<T>*, const AccT<T>*,       \
                                                const AccT<T>*, const BatchNormParams&, T*);                  \
  template void batch_norm_backward<T>(const T*, const T*, const AccT<T>*, const AccT<T>*, const AccT<T>*,      \
                                       const BatchNormParams&, bool, T*, AccT<T>*, AccT<T>*);
DEMI_INSTANTIATE(float)
DEMI_INSTANTIATE(double)
DEMI_INSTANTIATE(Half)
DEMI_INSTANTIATE(BFloat16)
#undef DEMI_INSTANTIATE

}  // namespace demi::kernels::ref
