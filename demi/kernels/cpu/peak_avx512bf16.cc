// 16 independent zmm vdpbf16ps chains; each instruction is 32 multiply-adds (64 FLOPs).
#include <immintrin.h>

#include "demi/kernels/cpu/internal/peak_kernels.h"

namespace demi::kernels::cpu_internal {

double bf16_loop_avx512bf16(int64_t iters, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // 2^-24
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  // Lanes summed through memory: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized (bug 105593).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  for (float lane : lanes) *sink += lane;
  return static_cast<double>(iters) * 16 * 16 * 4;
}

const PeakKernels& peak_kernels_avx512bf16() {
  static const PeakKernels k{fma_loop_avx512, bf16_loop_avx512bf16};
  return k;
}

}  // namespace demi::kernels::cpu_internal
