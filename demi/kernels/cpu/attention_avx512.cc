// The AVX-512 instantiation of the attention-softmax kernels (bodies in internal/attention_impl.h).
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/attention_impl.h"

namespace demi::kernels::cpu_internal {

const AttentionKernels& attention_kernels_avx512() {
  static const AttentionKernels k = make_attention_kernels<VecAvx512>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
