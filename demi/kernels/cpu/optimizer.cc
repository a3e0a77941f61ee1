// Dispatch of the optimizers' updates (optimizer.h) and their portable variant.
#include "demi/kernels/cpu/optimizer.h"

#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/optimizer_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const OptimizerKernels& optimizer_kernels_scalar() {
  static const OptimizerKernels k = make_optimizer_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

const cpu_internal::OptimizerKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<OptimizerKernels> table{DEMI_KERNEL_TABLE_ENTRIES(optimizer)};
  return table.get();
}

}  // namespace

void momentum_update(const MomentumStep& s, float* v, float* p, const float* g, int64_t n) {
  kernels().momentum(s, v, p, g, n);
}

void momentum_update_mixed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n) {
  kernels().momentum_mixed(s, x, p, n);
}

void sgd_update(const SgdStep& s, float* p, const float* g, int64_t n) { kernels().sgd(s, p, g, n); }

void adam_update(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n) {
  kernels().adam(s, m, v, p, g, n);
}

}  // namespace demi::kernels
