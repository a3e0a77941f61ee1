// 12 independent ymm FMA chains.
#include <immintrin.h>

#include "demi/kernels/cpu/internal/peak_kernels.h"

namespace demi::kernels::cpu_internal {

double fma_loop_avx2(int64_t iters, float* sink) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  alignas(32) float v[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(v, s);
  for (float f : v) *sink += f;
  return static_cast<double>(iters) * 12 * 8 * 2;
}

const PeakKernels& peak_kernels_avx2() {
  static const PeakKernels k{fma_loop_avx2, nullptr};
  return k;
}

}  // namespace demi::kernels::cpu_internal
