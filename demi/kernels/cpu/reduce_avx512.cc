// The AVX-512 instantiation of the reduction kernels (bodies in internal/reduce_impl.h).
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/reduce_impl.h"

namespace demi::kernels::cpu_internal {

const ReduceKernels& reduce_kernels_avx512() {
  static const ReduceKernels k = make_reduce_kernels<VecAvx512>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
