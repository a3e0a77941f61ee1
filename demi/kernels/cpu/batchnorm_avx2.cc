// The AVX2 instantiation of the batch-normalisation kernels (bodies in internal/batchnorm_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/batchnorm_impl.h"

namespace demi::kernels::cpu_internal {

const BatchNormKernels& batchnorm_kernels_avx2() {
  static const BatchNormKernels k = make_batchnorm_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
