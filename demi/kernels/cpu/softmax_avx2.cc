// The AVX2 instantiation of the softmax kernels (bodies in internal/softmax_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/softmax_impl.h"

namespace demi::kernels::cpu_internal {

const SoftmaxKernels& softmax_kernels_avx2() {
  static const SoftmaxKernels k = make_softmax_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
