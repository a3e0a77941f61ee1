// The AVX-512 instantiation of the layer-normalisation kernels (bodies in internal/layernorm_impl.h).
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/layernorm_impl.h"

namespace demi::kernels::cpu_internal {

const LayerNormKernels& layernorm_kernels_avx512() {
  static const LayerNormKernels k = make_layernorm_kernels<VecAvx512>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
