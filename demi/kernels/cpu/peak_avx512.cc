// 16 independent zmm FMA chains (latency 4 x 2 pipes needs 8; 16 leaves margin).
#include <immintrin.h>

#include "demi/kernels/cpu/internal/peak_kernels.h"

namespace demi::kernels::cpu_internal {

double fma_loop_avx512(int64_t iters, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  // Lanes summed through memory: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized (bug 105593).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  for (float lane : lanes) *sink += lane;
  return static_cast<double>(iters) * 16 * 16 * 2;
}

const PeakKernels& peak_kernels_avx512() {
  static const PeakKernels k{fma_loop_avx512, nullptr};
  return k;
}

}  // namespace demi::kernels::cpu_internal
