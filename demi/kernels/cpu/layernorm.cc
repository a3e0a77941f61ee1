#include "demi/kernels/cpu/layernorm.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/layernorm_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {

const LayerNormKernels& layernorm_kernels_scalar() {
  static const LayerNormKernels k = make_layernorm_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

const cpu_internal::LayerNormKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<LayerNormKernels> table{DEMI_KERNEL_TABLE_ENTRIES(layernorm)};
  return table.get();
}

void check(std::string_view op, DType dtype, const LayerNormParams& p, bool want_f64) {
  cpu_internal::check_float_entry(op, "x", dtype, want_f64);
  DEMI_CHECK(p.rows >= 0 && p.dim >= 1, op, ": expected x of shape (R, D) with D >= 1, got (", p.rows, ", ", p.dim,
             ")");
  DEMI_CHECK(p.eps > 0.0f, op, ": eps must be positive, got ", p.eps);
}

}  // namespace

void layer_norm_forward(const void* x, DType dtype, const float* gamma, const float* beta, const LayerNormParams& p,
                        void* y, float* mean, float* rstd) {
  check("layer_norm", dtype, p, false);
  kernels().forward(x, dtype, p.rows, p.dim, gamma, beta, p.eps, y, mean, rstd);
}

void layer_norm_backward(const void* x, const void* dy, DType dtype, const float* gamma, const float* mean,
                         const float* rstd, const LayerNormParams& p, void* dx, float* dgamma, float* dbeta) {
  check("layer_norm_backward", dtype, p, false);
  const int64_t blocks = (p.rows + cpu_internal::kRowBlock - 1) / cpu_internal::kRowBlock;
  const bool sums = dgamma != nullptr || dbeta != nullptr;
  cpu_internal::Workspace ws(sums ? static_cast<size_t>(2 * p.dim * blocks) * sizeof(float) : 0);
  kernels().backward(x, dy, dtype, p.rows, p.dim, gamma, mean, rstd, dx, dgamma, dbeta, ws.f32());
  if (sums && p.rows == 0)
    for (int64_t j = 0; j < p.dim; ++j) {
      if (dgamma) dgamma[j] = 0.0f;
      if (dbeta) dbeta[j] = 0.0f;
    }
}

void layer_norm_forward(const void* x, DType dtype, const double* gamma, const double* beta, const LayerNormParams& p,
                        void* y, double* mean, double* rstd) {
  check("layer_norm", dtype, p, true);
  ref::layer_norm_forward(static_cast<const double*>(x), gamma, beta, p, static_cast<double*>(y), mean, rstd);
}

void layer_norm_backward(const void* x, const void* dy, DType dtype, const double* gamma, const double* mean,
                         const double* rstd, const LayerNormParams& p, void* dx, double* dgamma, double* dbeta) {
  check("layer_norm_backward", dtype, p, true);
  ref::layer_norm_backward(static_cast<const double*>(x), static_cast<const double*>(dy), gamma, mean, rstd, p,
                           static_cast<double*>(dx), dgamma, dbeta);
}

}  // namespace demi::kernels
