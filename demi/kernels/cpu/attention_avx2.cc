// The AVX2 instantiation of the attention-softmax kernels (bodies in internal/attention_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/attention_impl.h"

namespace demi::kernels::cpu_internal {

const AttentionKernels& attention_kernels_avx2() {
  static const AttentionKernels k = make_attention_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
