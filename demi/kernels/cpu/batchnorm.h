// Batch normalisation, fast: training forward (batch statistics, running-statistics update), inference
// forward (running statistics), backward (dx, dgamma, dbeta). x is (N, C, S): BatchNorm1d's (N, C) is
// S = 1, BatchNorm2d's (N, C, H, W) is S = H * W. x, y, dy, dx may be f32, bf16 or f16; gamma, beta, the
// statistics and dgamma, dbeta are f32, and every statistic accumulates in f32, two-pass (mean, then the
// mean of squared deviations). The f64 overloads run the reference. BatchNormParams, the formulas and the
// running-statistics convention (MindSpore's momentum 0.9 as the weight of the old value; unbiased
// variance into running_var, as PyTorch and cuDNN) are documented in demi/kernels/reference/batchnorm.h.
// Vectorised per CPU level (the variants: demi/core/kernel_registry.h; `demi info` prints them);
// channels (or rows, for S = 1) run in parallel.
#pragma once

#include "demi/core/dtype.h"
#include "demi/kernels/reference/batchnorm.h"

namespace demi::kernels {

// x (N, C, S) f32|bf16|f16, gamma, beta (C) f32 (null: 1 and 0) -> y (N, C, S) in x's dtype;
// save_mean, save_invstd (C) f32 for backward; running_mean, running_var (C) f32 updated in place
// (null: not tracked). N * S must be at least 2.
void batch_norm_forward_training(const void* x, DType dtype, const float* gamma, const float* beta,
                                 const BatchNormParams& p, void* y, float* save_mean, float* save_invstd,
                                 float* running_mean, float* running_var);

// x (N, C, S), gamma, beta (C) (nullable), running_mean, running_var (C) f32 -> y (N, C, S) in x's dtype;
// save_invstd (C) f32 = 1 / sqrt(running_var + eps), for an inference-mode backward (nullable)
void batch_norm_forward_inference(const void* x, DType dtype, const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, const BatchNormParams& p,
                                  void* y, float* save_invstd = nullptr);

// x, dy (N, C, S) in dtype, gamma (C) (null: 1), mean, invstd (C) the statistics forward normalised with
// (training: save_mean/save_invstd; inference: running_mean and its save_invstd) -> dx (N, C, S) in dtype,
// dgamma, dbeta (C) f32 (nullable). training: the full gradient through the batch statistics;
// otherwise dx = dy * gamma * invstd.
void batch_norm_backward(const void* x, const void* dy, DType dtype, const float* gamma, const float* mean,
                         const float* invstd, const BatchNormParams& p, bool training, void* dx, float* dgamma,
                         float* dbeta);

// The f64 versions (dtype must be float64): the reference kernels.
void batch_norm_forward_training(const void* x, DType dtype, const double* gamma, const double* beta,
                                 const BatchNormParams& p, void* y, double* save_mean, double* save_invstd,
                                 double* running_mean, double* running_var);
void batch_norm_forward_inference(const void* x, DType dtype, const double* gamma, const double* beta,
                                  const double* running_mean, const double* running_var, const BatchNormParams& p,
                                  void* y);
void batch_norm_backward(const void* x, const void* dy, DType dtype, const double* gamma, const double* mean,
                         const double* invstd, const BatchNormParams& p, bool training, void* dx, double* dgamma,
                         double* dbeta);

}  // namespace demi::kernels
