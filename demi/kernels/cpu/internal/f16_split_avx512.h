// The AVX-512 step of the exact f16 -> bf16 hi + lo split (../f16_split.h): 16 f16 values widened with
// vcvtph2ps (which quiets NaNs as the scalar conversion does), hi their f32 bits truncated to the top 16
// (the top 8 significant bits), lo = x - hi (the remaining 3, exact in bf16), 0 where hi is not finite so that
// Inf stays Inf through the four products. Shared by the split kernel (f16_split_avx512.cc) and the tile
// convolutions' pair images (conv_amx.cc); include only from files compiled for AVX-512.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

// mask lanes of src (the others 0) split: *hi and *lo, 16 bf16 each.
inline void split_f16x16(const Half* src, __mmask16 mask, __m256i* hi, __m256i* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512 x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src));
  const __m512i hb = _mm512_and_si512(_mm512_castps_si512(x), top);
  const __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(hb, exp_mask), exp_mask);
  const __m512 l = _mm512_maskz_sub_ps(finite, x, _mm512_castsi512_ps(hb));
  *hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(hb, 16));
  *lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(l), 16));
}

}  // namespace demi::kernels::cpu_internal
