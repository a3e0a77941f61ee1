// The AVX2 instantiation of the AMP kernels (bodies in internal/amp_kernels_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/amp_kernels_impl.h"

namespace demi::kernels::cpu_internal {

const AmpKernels& amp_kernels_avx2() {
  static const AmpKernels k = make_amp_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
