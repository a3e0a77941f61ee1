// The AVX-512 instantiation of the AMP kernels (bodies in internal/amp_kernels_impl.h).
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/amp_kernels_impl.h"

namespace demi::kernels::cpu_internal {

const AmpKernels& amp_kernels_avx512() {
  static const AmpKernels k = make_amp_kernels<VecAvx512>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
