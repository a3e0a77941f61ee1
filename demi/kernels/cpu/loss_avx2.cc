// The AVX2 instantiation of the loss kernels (bodies in internal/loss_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/loss_impl.h"

namespace demi::kernels::cpu_internal {

const LossKernels& loss_kernels_avx2() {
  static const LossKernels k = make_loss_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
