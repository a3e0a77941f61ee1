#include "demi/kernels/cpu/batchnorm.h"

#include <cmath>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/batchnorm_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {

const BatchNormKernels& batchnorm_kernels_scalar() {
  static const BatchNormKernels k = make_batchnorm_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

using cpu_internal::Workspace;

const cpu_internal::BatchNormKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<BatchNormKernels> table{DEMI_KERNEL_TABLE_ENTRIES(batchnorm)};
  return table.get();
}

void check(std::string_view op, DType dtype, const BatchNormParams& p, bool want_f64) {
  cpu_internal::check_float_entry(op, "x", dtype, want_f64);
  DEMI_CHECK(p.n >= 0 && p.c >= 1 && p.spatial >= 1, op, ": expected x of shape (N, C, H*W) with C, H*W >= 1, got (",
             p.n, ", ", p.c, ", ", p.spatial, ")");
  DEMI_CHECK(p.eps > 0.0f, op, ": eps must be positive, got ", p.eps);
}

void check_training(std::string_view op, const BatchNormParams& p) {
  DEMI_CHECK(p.n * p.spatial >= 2, op, ": training needs more than one value per channel, got N=", p.n,
             " x H*W=", p.spatial, " for input (", p.n, ", ", p.c, ", ", p.spatial, ")");
}

}  // namespace

void batch_norm_forward_training(const void* x, DType dtype, const float* gamma, const float* beta,
                                 const BatchNormParams& p, void* y, float* save_mean, float* save_invstd,
                                 float* running_mean, float* running_var) {
  check("batch_norm", dtype, p, false);
  check_training("batch_norm", p);
  // var (C), then the S == 1 path's scratch (2C).
  Workspace ws(static_cast<size_t>(3 * p.c) * sizeof(float));
  float* var = ws.f32();
  kernels().train_forward(x, dtype, p.n, p.c, p.spatial, gamma, beta, p.eps, y, save_mean, save_invstd, var,
                          var + p.c);
  const float m = static_cast<float>(p.n * p.spatial);
  const float mom = p.momentum;
  for (int64_t c = 0; c < p.c; ++c) {
    if (running_mean) running_mean[c] = mom * running_mean[c] + (1.0f - mom) * save_mean[c];
    if (running_var) {
      float v = p.unbiased_running_var ? var[c] * m / (m - 1.0f) : var[c];
      running_var[c] = mom * running_var[c] + (1.0f - mom) * v;
    }
  }
}

void batch_norm_forward_inference(const void* x, DType dtype, const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, const BatchNormParams& p,
                                  void* y, float* save_invstd) {
  check("batch_norm", dtype, p, false);
  Workspace ws(static_cast<size_t>(2 * p.c) * sizeof(float));
  float* scale = ws.f32();
  float* shift = scale + p.c;
  for (int64_t c = 0; c < p.c; ++c) {
    float invstd = 1.0f / std::sqrt(running_var[c] + p.eps);
    if (save_invstd) save_invstd[c] = invstd;
    scale[c] = (gamma ? gamma[c] : 1.0f) * invstd;
    shift[c] = beta ? beta[c] : 0.0f;
  }
  if (p.numel() == 0) return;
  kernels().apply(x, dtype, p.n, p.c, p.spatial, running_mean, scale, shift, y);
}

void batch_norm_backward(const void* x, const void* dy, DType dtype, const float* gamma, const float* mean,
                         const float* invstd, const BatchNormParams& p, bool training, void* dx, float* dgamma,
                         float* dbeta) {
  check("batch_norm_backward", dtype, p, false);
  if (training) check_training("batch_norm_backward", p);
  Workspace ws(p.spatial == 1 ? static_cast<size_t>(5 * p.c) * sizeof(float) : 0);
  kernels().backward(x, dy, dtype, p.n, p.c, p.spatial, gamma, mean, invstd, training, dx, dgamma, dbeta, ws.f32());
}

void batch_norm_forward_training(const void* x, DType dtype, const double* gamma, const double* beta,
                                 const BatchNormParams& p, void* y, double* save_mean, double* save_invstd,
                                 double* running_mean, double* running_var) {
  check("batch_norm", dtype, p, true);
  ref::batch_norm_forward_training(static_cast<const double*>(x), gamma, beta, p, static_cast<double*>(y), save_mean,
                                   save_invstd, running_mean, running_var);
}

void batch_norm_forward_inference(const void* x, DType dtype, const double* gamma, const double* beta,
                                  const double* running_mean, const double* running_var, const BatchNormParams& p,
                                  void* y) {
  check("batch_norm", dtype, p, true);
  ref::batch_norm_forward_inference(static_cast<const double*>(x), gamma, beta, running_mean, running_var, p,
                                    static_cast<double*>(y));
}

void batch_norm_backward(const void* x, const void* dy, DType dtype, const double* gamma, const double* mean,
                         const double* invstd, const BatchNormParams& p, bool training, void* dx, double* dgamma,
                         double* dbeta) {
  check("batch_norm_backward", dtype, p, true);
  ref::batch_norm_backward(static_cast<const double*>(x), static_cast<const double*>(dy), gamma, mean, invstd, p,
                           training, static_cast<double*>(dx), dgamma, dbeta);
}

}  // namespace demi::kernels
