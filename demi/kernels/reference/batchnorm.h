// Batch normalisation, reference twins: training forward (batch statistics and the running-statistics
// update), inference forward (running statistics), backward. x is (N, C, S): BatchNorm1d's (N, C) is
// S = 1, BatchNorm2d's (N, C, H, W) is S = H * W; statistics are per channel over N and S. Statistics,
// gamma, beta and their gradients are AccT<T> (f32 for f32/bf16/f16 data, f64 for f64); x, y, dy, dx are T.
// Two passes (mean, then the mean of squared deviations) keep the variance accurate when |mean| >> std.
// Kept forever as the oracle for demi/kernels/cpu/batchnorm.h and as the f64 path.
//
//   y = (x - mean) * invstd * gamma + beta,  invstd = 1 / sqrt(var + eps),  var biased (divides by N*S)
//   running = momentum * running + (1 - momentum) * batch      (MindSpore's convention, momentum 0.9)
//
// MindSpore's nn.BatchNorm1d/2d (docs r2.3-r2.6) default momentum=0.9, eps=1e-5 and document exactly that
// update, with "the batch variance" left unqualified. Its CPU kernel (oneDNN, batch_norm_cpu_kernel.cc)
// feeds the biased variance in; its GPU kernel (cuDNN, which applies Bessel's correction) and PyTorch
// (momentum 0.1, weighting the other side) feed the unbiased one, N*S / (N*S - 1) times the biased. demi
// follows PyTorch and cuDNN — a checkpoint's running_var then means what PyTorch's means — and keeps
// MindSpore-CPU's choice one flag away (unbiased_running_var = false).
#pragma once

#include <cstdint>

#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

struct BatchNormParams {
  int64_t n = 0;        // batch
  int64_t c = 0;        // channels
  int64_t spatial = 1;  // H * W (1 for BatchNorm1d)
  float eps = 1e-5f;
  float momentum = 0.9f;              // MindSpore's: the weight of the old running value
  bool unbiased_running_var = true;   // running_var takes var * M / (M - 1), M = n * spatial
  int64_t numel() const { return n * c * spatial; }
};

namespace ref {

// x (N, C, S) T, gamma, beta (C) AccT<T> (null: 1 and 0) -> y (N, C, S) T; save_mean, save_invstd (C)
// AccT<T> for backward; running_mean, running_var (C) updated in place (null: not tracked).
// N * S must be at least 2 (the unbiased variance), as in PyTorch.
template <typename T>
void batch_norm_forward_training(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const BatchNormParams& p,
                                 T* y, AccT<T>* save_mean, AccT<T>* save_invstd, AccT<T>* running_mean,
                                 AccT<T>* running_var);

// x (N, C, S) T, gamma, beta, running_mean, running_var (C) AccT<T> -> y (N, C, S) T
template <typename T>
void batch_norm_forward_inference(const T* x, const AccT<T>* gamma, const AccT<T>* beta, const AccT<T>* running_mean,
                                  const AccT<T>* running_var, const BatchNormParams& p, T* y);

// x, dy (N, C, S) T, gamma (C) (null: 1), mean, invstd (C) the statistics forward normalised with (the
// saved batch statistics in training; running_mean and 1/sqrt(running_var + eps) in inference)
// -> dx (N, C, S) T, dgamma, dbeta (C) AccT<T> (null: not computed).
// training: the statistics depend on x (the full formula); otherwise they are constants, dx = dy*gamma*invstd.
template <typename T>
void batch_norm_backward(const T* x, const T* dy, const AccT<T>* gamma, const AccT<T>* mean, const AccT<T>* invstd,
                         const BatchNormParams& p, bool training, T* dx, AccT<T>* dgamma, AccT<T>* dbeta);

}  // namespace ref
}  // namespace demi::kernels
