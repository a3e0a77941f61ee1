// The AVX2 instantiation of the layer-normalisation kernels (bodies in internal/layernorm_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/layernorm_impl.h"

namespace demi::kernels::cpu_internal {

const LayerNormKernels& layernorm_kernels_avx2() {
  static const LayerNormKernels k = make_layernorm_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
