// Layer normalisation over the last axis, reference twins (forward, backward). x is viewed as (R, D): R rows
// (every leading axis flattened) of D values normalised together. Statistics (mean, rstd), gamma, beta and
// their gradients are AccT<T> (f32 for f32/bf16/f16 data, f64 for f64); row sums accumulate in SumT (f64).
// Two passes (mean, then the mean of squared deviations) keep the variance accurate when |mean| >> std.
// Kept forever as the oracle for demi/kernels/cpu/layernorm.h and as the f64 path.
//
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps),  var biased (divides by D)
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
//   dgamma = sum_rows(dy * xhat),  dbeta = sum_rows(dy)
#pragma once

#include <cstdint>

#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

struct LayerNormParams {
  int64_t rows = 0;  // R: the product of the leading axes
  int64_t dim = 0;   // D: the normalised (last) axis
  float eps = 1e-5f;
  int64_t numel() const { return rows * dim; }
};

namespace ref {

// x (R, D) T, gamma, beta (D) AccT<T> (null: 1 and 0) -> y (R, D) T; mean, rstd (R) AccT<T> for backward.
template <typename T>
void layer_norm_forward(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const LayerNormParams& p, T* y,
                        AccT<T>* mean, AccT<T>* rstd);

// x, dy (R, D) T, gamma (D) (null: 1), mean, rstd (R) from forward -> dx (R, D) T; dgamma, dbeta (D) AccT<T>
// (null: not computed).
template <typename T>
void layer_norm_backward(const T* x, const T* dy, const AccT<T>* gamma, const AccT<T>* mean, const AccT<T>* rstd,
                         const LayerNormParams& p, T* dx, AccT<T>* dgamma, AccT<T>* dbeta);

}  // namespace ref
}  // namespace demi::kernels
