// The AVX-512 instantiation of the elementwise kernels (bodies in internal/elementwise_impl.h).
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/elementwise_impl.h"

namespace demi::kernels::cpu_internal {

const ElementwiseKernels& elementwise_kernels_avx512() {
  static const ElementwiseKernels k = make_elementwise_kernels<VecAvx512>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
