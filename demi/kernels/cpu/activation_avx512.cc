// The AVX-512 activation kernels: activation_impl.h instantiated with 16-lane vectors. Compiled with
// AVX-512 flags only (cmake/demi_module.cmake); dispatched from activation.cc.
#include "demi/kernels/cpu/internal/activation_impl.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal {

const ActivationKernels& activation_kernels_avx512() {
  static const ActivationKernels kernels = make_activation_kernels<VecAvx512>();
  return kernels;
}

}  // namespace demi::kernels::cpu_internal
