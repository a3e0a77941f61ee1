// The AVX2 instantiation of the reduction kernels (bodies in internal/reduce_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/reduce_impl.h"

namespace demi::kernels::cpu_internal {

const ReduceKernels& reduce_kernels_avx2() {
  static const ReduceKernels k = make_reduce_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
