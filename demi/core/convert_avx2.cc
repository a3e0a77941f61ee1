// AVX2 + F16C bulk conversion kernels: f32 <-> f16 with vcvtps2ph / vcvtph2ps, f32 <-> bf16 with integer
// rounding. Compiled with -mavx2 -mf16c only (cmake/demi_module.cmake); dispatched from convert.cc.
//
// Every kernel is bit-identical to the scalar conversions in half.h. Tails (n % 16) go to the scalar
// kernels in convert.cc rather than to half.h's inline functions: an inline function compiled here
// could be emitted with AVX2 instructions and chosen by the linker for portable callers too.
#include <immintrin.h>

#include <cstdint>

#include "demi/core/convert.h"

namespace demi::internal {

void f32_to_f16_avx2(const float* src, Half* dst, int64_t n);
void f16_to_f32_avx2(const Half* src, float* dst, int64_t n);
void f32_to_bf16_avx2(const float* src, BFloat16* dst, int64_t n);
void bf16_to_f32_avx2(const BFloat16* src, float* dst, int64_t n);

namespace {

// The imm8 of vcvtps2ph: round to nearest even whatever MXCSR's rounding mode says.
constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT;

// x (8, f32 bits) -> (8, bf16 bits in the low half of each u32 lane): round to nearest even by adding
// 0x7fff plus the lsb that survives (a carry out of the mantissa lands in the exponent, so the largest
// values round to inf as IEEE says); a NaN keeps its top bits and gets the quiet bit instead, because
// the rounding carry could turn a NaN into inf or flip its sign.
inline __m256i round_to_bf16(__m256i x) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), odd), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);  // signed is fine: both >= 0
  __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
  return _mm256_blendv_epi8(rounded, nan_bits, nan);
}

// b (8, bf16 bits widened to u32) -> (8, f32 bits): exact, with a NaN's quiet bit set as half.h does.
inline __m256i widen_bf16(__m256i b) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x400000);
  __m256i x = _mm256_slli_epi32(b, 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
  return _mm256_or_si256(x, _mm256_and_si256(nan, quiet));
}

}  // namespace

// src (n, f32) -> dst (n, f16)
void f32_to_f16_avx2(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRoundNearest);
    __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), kRoundNearest);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 8), hi);
  }
  f32_to_f16_scalar(src + i, dst + i, n - i);
}

// src (n, f16) -> dst (n, f32); vcvtph2ps is exact and quiets a signalling NaN, like half.h.
void f16_to_f32_avx2(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(lo));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(hi));
  }
  f16_to_f32_scalar(src + i, dst + i, n - i);
}

// src (n, f32) -> dst (n, bf16)
void f32_to_bf16_avx2(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i lo = round_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    __m256i hi = round_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit lane (lo0 hi0 lo1 hi1); the permute restores element order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  f32_to_bf16_scalar(src + i, dst + i, n - i);
}

// src (n, bf16) -> dst (n, f32)
void bf16_to_f32_avx2(const BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), widen_bf16(_mm256_cvtepu16_epi32(lo)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 8), widen_bf16(_mm256_cvtepu16_epi32(hi)));
  }
  bf16_to_f32_scalar(src + i, dst + i, n - i);
}

const ConvertKernels& convert_kernels_avx2() {
  static const ConvertKernels k{f32_to_f16_avx2, f16_to_f32_avx2, f32_to_bf16_avx2, bf16_to_f32_avx2};
  return k;
}

}  // namespace demi::internal
