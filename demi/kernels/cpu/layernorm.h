// Layer normalisation over the last axis, fast: forward (y, and the per-row mean and rstd for backward) and
// backward (dx, dgamma, dbeta). x is (R, D) — every leading axis flattened into R rows of D values. x, y,
// dy, dx may be f32, bf16 or f16 (one dtype for all four); gamma, beta, the statistics and dgamma, dbeta
// are f32, and every statistic accumulates in f32, two-pass, so a low-precision activation is normalised
// exactly as its f32 widening would be. The f64 overloads run the reference. LayerNormParams and the
// formulas are in demi/kernels/reference/layernorm.h. Vectorised per CPU level (the variants:
// demi/core/kernel_registry.h; `demi info` prints them); rows run in parallel.
#pragma once

#include "demi/core/dtype.h"
#include "demi/kernels/reference/layernorm.h"

namespace demi::kernels {

// x (R, D) f32|bf16|f16, gamma, beta (D) f32 (nullable: 1 and 0) -> y (R, D) in x's dtype; mean, rstd (R) f32
void layer_norm_forward(const void* x, DType dtype, const float* gamma, const float* beta, const LayerNormParams& p,
                        void* y, float* mean, float* rstd);

// x, dy (R, D) in dtype, gamma (D) f32 (nullable), mean, rstd (R) f32 from forward -> dx (R, D) in dtype;
// dgamma, dbeta (D) f32 (nullable: not computed)
void layer_norm_backward(const void* x, const void* dy, DType dtype, const float* gamma, const float* mean,
                         const float* rstd, const LayerNormParams& p, void* dx, float* dgamma, float* dbeta);

// The f64 versions (dtype must be float64): the reference kernels.
void layer_norm_forward(const void* x, DType dtype, const double* gamma, const double* beta, const LayerNormParams& p,
                        void* y, double* mean, double* rstd);
void layer_norm_backward(const void* x, const void* dy, DType dtype, const double* gamma, const double* mean,
                         const double* rstd, const LayerNormParams& p, void* dx, double* dgamma, double* dbeta);

}  // namespace demi::kernels
