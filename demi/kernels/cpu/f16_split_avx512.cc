// AVX-512 split of f16 values into bf16 hi + lo (f16_split.h): 16 values per step, widened with vcvtph2ps
// (which quiets NaNs as the scalar conversion does), hi truncated to 16 bits, lo = x - hi masked to 0
// where hi is not finite, both narrowed with vpmovdw.
#include "demi/kernels/cpu/f16_split.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"  // <immintrin.h>, with GCC 12's false warnings silenced

namespace demi::kernels::cpu_internal {

namespace {

void split_rows_avx512(const Half* src, int64_t r0, int64_t r1, int64_t cols, BFloat16* dst,
                           int64_t row_stride, int64_t seg_stride, unsigned lo_segments) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = r0; i < r1; ++i) {
    const Half* s = src + i * cols;
    BFloat16* d = dst + i * row_stride;
    for (int64_t j = 0; j < cols; j += 16) {
      const int64_t w = cols - j < 16 ? cols - j : 16;
      const __mmask16 m = static_cast<__mmask16>((1u << w) - 1u);
      const __m256i h = _mm256_maskz_loadu_epi16(m, s + j);
      const __m512 x = _mm512_cvtph_ps(h);
      const __m512i hb = _mm512_and_si512(_mm512_castps_si512(x), top);
      const __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(hb, exp_mask), exp_mask);
      const __m512 lo = _mm512_maskz_sub_ps(finite, x, _mm512_castsi512_ps(hb));
      const __m256i hi16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(hb, 16));
      const __m256i lo16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
      for (int seg = 0; seg < kSplitSegments; ++seg)
        _mm256_mask_storeu_epi16(d + seg * seg_stride + j, m, (lo_segments >> seg) & 1u ? lo16 : hi16);
    }
  }
}

}  // namespace

const F16SplitKernels& f16_split_kernels_avx512() {
  static const F16SplitKernels k{split_rows_avx512};
  return k;
}

}  // namespace demi::kernels::cpu_internal
