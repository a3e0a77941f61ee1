// The AVX2 instantiation of the embedding kernels (bodies in internal/embedding_impl.h).
#include "demi/kernels/cpu/internal/vec_avx2.h"
#include "demi/kernels/cpu/internal/embedding_impl.h"

namespace demi::kernels::cpu_internal {

const EmbeddingKernels& embedding_kernels_avx2() {
  static const EmbeddingKernels k = make_embedding_kernels<VecAvx2>();
  return k;
}

}  // namespace demi::kernels::cpu_internal
