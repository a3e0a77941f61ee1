// The AVX2 instantiation of the elementwise kernels (bodies in internal/elementwise_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/elementwise_impl.h"

namespace demi::kernels::cpu_internal {

const ElementwiseKernels& elementwise_kernels_avx2() {
  static const ElementwiseKernels k = make_elementwise_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
