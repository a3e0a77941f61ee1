// The AVX2 activation kernels: activation_impl.h instantiated with 8-lane vectors. Compiled with
// AVX2 flags only (cmake/demi_module.cmake); dispatched from activation.cc.
#include "demi/kernels/cpu/internal/activation_impl.h"
#include "demi/kernels/cpu/internal/vec_avx2.h"

namespace demi::kernels::cpu_internal {

const ActivationKernels& activation_kernels_avx2() {
  static const ActivationKernels kernels = make_activation_kernels<VecAvx2>();
  return kernels;
}

}  // namespace demi::kernels::cpu_internal
