// AVX-512 bulk conversion kernels: f32 <-> f16 with 512-bit vcvtps2ph / vcvtph2ps, f32 <-> bf16 with
// integer rounding. Compiled with AVX-512 F/BW/VL/DQ flags only (cmake/demi_module.cmake); dispatched
// from convert.cc. Heads and tails use masked loads and stores, so there is no scalar code here.
//
// Every kernel is bit-identical to the scalar conversions in half.h. Only functions with internal
// linkage are defined here: an inline function shared with portable code could be emitted with AVX-512
// instructions and chosen by the linker for the portable callers too.

// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// reports at every inlined use (GCC bug 105593, fixed in 13); the location is inside the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "demi/core/convert.h"

namespace demi::internal {

void f32_to_f16_avx512(const float* src, Half* dst, int64_t n);
void f16_to_f32_avx512(const Half* src, float* dst, int64_t n);
void f32_to_bf16_avx512(const float* src, BFloat16* dst, int64_t n);
void bf16_to_f32_avx512(const BFloat16* src, float* dst, int64_t n);

namespace {

// The imm8 of vcvtps2ph: round to nearest even whatever MXCSR's rounding mode says.
constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT;

// The first `count` lanes (0 <= count <= 16).
inline __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// Walks [0, n) for a kernel: one masked step of up to 15 elements that brings the f32 side to a 64-byte
// boundary (a zmm access split across two cache lines costs two, which halves L1 throughput), then
// pair(i) on 32 elements at a time, then masked(i, lanes) steps of up to 16 for the tail.
template <typename Pair, typename Masked>
inline void for_each_step(const float* f32_side, int64_t n, Pair pair, Masked masked) {
  auto head = static_cast<int64_t>((0u - (reinterpret_cast<uintptr_t>(f32_side) >> 2)) & 15u);
  if (head > n) head = n;
  if (head > 0) masked(0, first_lanes(head));
  int64_t i = head;
  for (; i + 32 <= n; i += 32) pair(i);
  for (; i < n; i += 16) masked(i, first_lanes(n - i < 16 ? n - i : 16));
}

// vfpclassps categories.
constexpr int kQuietNan = 0x01;
constexpr int kSignallingNan = 0x80;

// x (16, f32 bits) -> (16, bf16 bits in the low half of each u32 lane): round to nearest even by adding
// 0x7fff plus the lsb that survives (a carry out of the mantissa lands in the exponent, so the largest
// values round to inf as IEEE says); a NaN keeps its top bits and gets the quiet bit instead, because the
// carry could make it inf or flip its sign.
inline __m512i round_to_bf16(__m512i x) {
  __m512i top = _mm512_srli_epi32(x, 16);
  __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
  __m512i biased = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd);
  __m512i rounded = _mm512_srli_epi32(biased, 16);
  __mmask16 nan = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(x), kQuietNan | kSignallingNan);
  return _mm512_mask_or_epi32(rounded, nan, top, _mm512_set1_epi32(0x40));
}

// lo, hi (16 each, bf16 bits in u32 lanes) -> (32, bf16) in order. packus interleaves 64-bit blocks per
// 128-bit lane (lo0 hi0 lo1 hi1 ...); one qword permute restores the order. Two shuffles per 32 elements
// instead of four for two vpmovdw.
inline __m512i pack_bf16(__m512i lo, __m512i hi) {
  __m512i packed = _mm512_packus_epi32(lo, hi);  // every lane is <= 0xffff: no saturation
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

// b (16, bf16 bits) -> (16, f32 bits): exact, with a signalling NaN made quiet as half.h does.
inline __m512i widen_bf16(__m256i b) {
  __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
  __mmask16 snan = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(x), kSignallingNan);
  return _mm512_mask_or_epi32(x, snan, x, _mm512_set1_epi32(0x400000));
}

}  // namespace

// src (n, f32) -> dst (n, f16)
void f32_to_f16_avx512(const float* src, Half* dst, int64_t n) {
  for_each_step(
      src, n,
      [&](int64_t i) {
        __m256i lo = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRoundNearest);
        __m256i hi = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), kRoundNearest);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), hi);
      },
      [&](int64_t i, __mmask16 m) {
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), kRoundNearest);
        _mm256_mask_storeu_epi16(dst + i, m, h);
      });
}

// src (n, f16) -> dst (n, f32); vcvtph2ps is exact and quiets a signalling NaN, like half.h.
void f16_to_f32_avx512(const Half* src, float* dst, int64_t n) {
  for_each_step(
      dst, n,
      [&](int64_t i) {
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 16));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(lo));
        _mm512_storeu_ps(dst + i + 16, _mm512_cvtph_ps(hi));
      },
      [&](int64_t i, __mmask16 m) {
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
      });
}

// src (n, f32) -> dst (n, bf16)
void f32_to_bf16_avx512(const float* src, BFloat16* dst, int64_t n) {
  for_each_step(
      src, n,
      [&](int64_t i) {
        __m512i lo = round_to_bf16(_mm512_loadu_si512(src + i));
        __m512i hi = round_to_bf16(_mm512_loadu_si512(src + i + 16));
        _mm512_storeu_si512(dst + i, pack_bf16(lo, hi));
      },
      [&](int64_t i, __mmask16 m) {
        __m256i r = _mm512_cvtepi32_epi16(round_to_bf16(_mm512_maskz_loadu_epi32(m, src + i)));
        _mm256_mask_storeu_epi16(dst + i, m, r);
      });
}

// src (n, bf16) -> dst (n, f32)
void bf16_to_f32_avx512(const BFloat16* src, float* dst, int64_t n) {
  for_each_step(
      dst, n,
      [&](int64_t i) {
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 16));
        _mm512_storeu_si512(dst + i, widen_bf16(lo));
        _mm512_storeu_si512(dst + i + 16, widen_bf16(hi));
      },
      [&](int64_t i, __mmask16 m) {
        _mm512_mask_storeu_epi32(dst + i, m, widen_bf16(_mm256_maskz_loadu_epi16(m, src + i)));
      });
}

const ConvertKernels& convert_kernels_avx512() {
  static const ConvertKernels k{f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512, bf16_to_f32_avx512};
  return k;
}

}  // namespace demi::internal
