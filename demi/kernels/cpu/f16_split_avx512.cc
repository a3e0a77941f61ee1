// AVX-512 split of f16 values into bf16 hi + lo (f16_split.h): 16 values per step
// (internal/f16_split_avx512.h).
#include "demi/kernels/cpu/f16_split.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"  // <immintrin.h>, with GCC 12's false warnings silenced
#include "demi/kernels/cpu/internal/f16_split_avx512.h"

namespace demi::kernels::cpu_internal {

namespace {

void split_rows_avx512(const Half* src, int64_t r0, int64_t r1, int64_t cols, BFloat16* dst,
                           int64_t row_stride, int64_t seg_stride, unsigned lo_segments) {
  for (int64_t i = r0; i < r1; ++i) {
    const Half* s = src + i * cols;
    BFloat16* d = dst + i * row_stride;
    for (int64_t j = 0; j < cols; j += 16) {
      const int64_t w = cols - j < 16 ? cols - j : 16;
      const __mmask16 m = static_cast<__mmask16>((1u << w) - 1u);
      __m256i hi16, lo16;
      split_f16x16(s + j, m, &hi16, &lo16);
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
