// The AVX-512 step of the exact f16 -> bf16 hi + lo split (../f16_split.h): 16 f16 values widened with
// vcvtph2ps (which quiets NaNs as the scalar conversion does), hi their f32 bits truncated to the top 16
// (the top 8 significant bits), lo = x - hi (the remaining 3, exact in bf16), 0 where hi is not finite so that
// Inf stays Inf through the four products. Shared by the split kernel (f16_split_avx512.cc), the tile
// convolutions' pair images (conv_amx.cc) and the direct convolution's f16 weight gradient
// (conv_direct_amx.cc); include only from files compiled for AVX-512.
#pragma once

#include <cstdint>

#include "demi/core/half.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"  // (immintrin.h under its warning pragmas)

namespace demi::kernels::cpu_internal {

// 16 f32 values that are f16 values (or bf16 ones) widened, split with both parts as f32: *hi their top 16
// bits, *lo the rest (x - hi, exact: its low 16 bits 0), 0 where hi is not finite.
inline void split_f32_parts(__m512 x, __m512i* hi, __m512i* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  *hi = _mm512_and_si512(_mm512_castps_si512(x), top);
  const __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(*hi, exp_mask), exp_mask);
  *lo = _mm512_castps_si512(_mm512_maskz_sub_ps(finite, x, _mm512_castsi512_ps(*hi)));
}

// 32 such values, a's 16 then b's, split: *hi and *lo, 32 bf16 each in order (the parts' top halves).
inline void split_f32x32(__m512 a, __m512 b, __m512i* hi, __m512i* lo) {
  __m512i ha, la, hb, lb;
  split_f32_parts(a, &ha, &la);
  split_f32_parts(b, &hb, &lb);
  *hi = VecAvx512::top_halves(ha, hb);
  *lo = VecAvx512::top_halves(la, lb);
}

// 32 f16 values (16-bit words, in any order) split: *hi and *lo, 32 bf16 each in the same order.
inline void split_f16x32(__m512i x, __m512i* hi, __m512i* lo) {
  split_f32x32(_mm512_cvtph_ps(_mm512_castsi512_si256(x)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1)), hi, lo);
}

// mask lanes of src (the others 0) split: *hi and *lo, 16 bf16 each.
inline void split_f16x16(const Half* src, __mmask16 mask, __m256i* hi, __m256i* lo) {
  __m512i h, l;
  split_f32_parts(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src)), &h, &l);
  *hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16));
  *lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16));
}

}  // namespace demi::kernels::cpu_internal
