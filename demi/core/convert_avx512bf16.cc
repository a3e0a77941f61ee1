// AVX512-BF16 bulk conversion: f32 -> bf16 with vcvtneps2bf16. Compiled with AVX512-BF16 flags only
// (cmake/demi_module.cmake); dispatched from convert.cc. The other three directions have no better
// instruction at this level and reuse the AVX-512 kernels.
//
// vcvtneps2bf16 rounds to nearest even and makes NaNs quiet exactly as half.h does, but it always treats
// f32 denormal inputs as zero (whatever MXCSR.DAZ says): 0x007fffff gives 0x0000 where round to nearest
// even gives 0x0080. Those lanes are redone with integer rounding, on a branch that normal data (zeros
// included) never takes, so the kernel stays bit-identical to half.h. It runs faster than AVX-512 integer
// rounding (bench/convert_bench.cc measures both variants).

// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// reports at every inlined use (GCC bug 105593, fixed in 13); the location is inside the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "demi/core/convert.h"

namespace demi::internal {

void f32_to_bf16_avx512bf16(const float* src, BFloat16* dst, int64_t n);

namespace {

inline __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// The lanes of x that hold f32 denormals. vfpclassps is one instruction but obeys MXCSR.DAZ (it calls a
// denormal zero then), so with DAZ set the test is integer: 0 < |x| < 2^-126, i.e. |x| - 1 < 0x007fffff
// as unsigned (zero wraps to the top). The integer test costs a noticeable share of the kernel's L1 throughput.
template <bool kDaz>
inline __mmask16 denormal_lanes(__m512 x) {
  if constexpr (kDaz) {
    __m512i abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    __m512i abs_minus_one = _mm512_sub_epi32(abs, _mm512_set1_epi32(1));
    return _mm512_cmplt_epu32_mask(abs_minus_one, _mm512_set1_epi32(0x007fffff));
  } else {
    return _mm512_fpclass_ps_mask(x, 0x20);  // category 0x20: denormal
  }
}

// x (16, f32) rounded to bf16 with plain integer rounding: the rule for the denormal lanes, which hold
// no NaN (so the NaN rule is not needed). Off the fast path.
inline __m256i round_denormals(__m512 x) {
  __m512i bits = _mm512_castps_si512(x);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i biased = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(biased, 16));
}

// x (16, f32) -> (16, bf16), denormals kept.
template <bool kDaz>
inline __m256i to_bf16(__m512 x) {
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  __mmask16 d = denormal_lanes<kDaz>(x);
  return d ? _mm256_mask_blend_epi16(d, r, round_denormals(x)) : r;
}

// src (n, f32) -> dst (n, bf16). Steps as in convert_avx512.cc: a masked head that aligns src to 64
// bytes, 32 elements at a time with vcvtne2ps2bf16 (one instruction for 32), masked tail steps.
template <bool kDaz>
void f32_to_bf16_steps(const float* src, BFloat16* dst, int64_t n) {
  auto head = static_cast<int64_t>((0u - (reinterpret_cast<uintptr_t>(src) >> 2)) & 15u);
  if (head > n) head = n;
  if (head > 0) {
    __mmask16 m = first_lanes(head);
    _mm256_mask_storeu_epi16(dst, m, to_bf16<kDaz>(_mm512_maskz_loadu_ps(m, src)));
  }
  int64_t i = head;
  for (; i + 32 <= n; i += 32) {
    __m512 lo = _mm512_loadu_ps(src + i);
    __m512 hi = _mm512_loadu_ps(src + i + 16);
    __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lo's results first
    __mmask16 dlo = denormal_lanes<kDaz>(lo);
    __mmask16 dhi = denormal_lanes<kDaz>(hi);
    if (__builtin_expect(!_kortestz_mask16_u8(dlo, dhi), 0)) {
      __m512i fixed = _mm512_inserti64x4(_mm512_castsi256_si512(round_denormals(lo)), round_denormals(hi), 1);
      r = _mm512_mask_blend_epi16(_mm512_kunpackw(dhi, dlo), r, fixed);
    }
    _mm512_storeu_si512(dst + i, r);
  }
  for (; i < n; i += 16) {
    __mmask16 m = first_lanes(n - i < 16 ? n - i : 16);
    _mm256_mask_storeu_epi16(dst + i, m, to_bf16<kDaz>(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

}  // namespace

// src (n, f32) -> dst (n, bf16)
void f32_to_bf16_avx512bf16(const float* src, BFloat16* dst, int64_t n) {
  constexpr unsigned kDazBit = 0x40;
  if (_mm_getcsr() & kDazBit) {
    f32_to_bf16_steps<true>(src, dst, n);
  } else {
    f32_to_bf16_steps<false>(src, dst, n);
  }
}

// AVX512-BF16 adds only an f32 -> bf16 instruction; the rest is AVX-512's.
void f32_to_f16_avx512(const float* src, Half* dst, int64_t n);
void f16_to_f32_avx512(const Half* src, float* dst, int64_t n);
void bf16_to_f32_avx512(const BFloat16* src, float* dst, int64_t n);

const ConvertKernels& convert_kernels_avx512bf16() {
  static const ConvertKernels k{f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512bf16, bf16_to_f32_avx512};
  return k;
}

}  // namespace demi::internal
