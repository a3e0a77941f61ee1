// The AVX2 + FMA + F16C vector of 8 f32 lanes that the kernel templates in *_impl.h are instantiated with
// (same interface as VecAvx512 in vec_avx512.h and VecScalar in vec_scalar.h). Loads convert bf16/f16
// storage to f32 exactly; stores round to nearest even, bit-identical to demi::BFloat16(float) and
// demi::Half(float). AVX2 has no masked 16-bit loads or stores: tails go through a small stack buffer,
// copying only the given lanes, so they never touch memory outside them either. Masks are vectors of
// all-ones / all-zero lanes.
//
// Only translation units compiled with AVX2 flags (*_avx2.cc, and the avx2 variants CMake generates from
// core/kernel_registry.h) include this header. Every function here is a member of VecAvx2, a name no portable file
// uses, so the linker never hands an AVX2 body to a portable caller.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "demi/core/half.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "vec_avx2.h needs -mavx2 -mfma -mf16c (files named *_avx2.cc get them)"
#endif

namespace demi::kernels::cpu_internal {

struct VecAvx2 {
  static constexpr int kWidth = 8;
  using F = __m256;
  using M = __m256;
  using I = __m256i;

  static constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F load(const BFloat16* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // The first n (< 8) lanes from p, the others `fill`.
  template <typename T>
  static F load_n(const T* p, int64_t n, float fill = 0.0f) {
    alignas(32) T buf[kWidth] = {};
    std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
    return _mm256_blendv_ps(_mm256_set1_ps(fill), load(buf), lanes_below(n));
  }

  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(Half* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRoundNearest)); }
  static void store(BFloat16* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow_bf16(v)); }
  template <typename T>
  static void store_n(T* p, F v, int64_t n) {
    alignas(32) T buf[kWidth];
    store(buf, v);
    std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(T));
  }

  static float to_float(float v) { return v; }
  static float to_float(Half v) { return _cvtsh_ss(v.bits); }
  static float to_float(BFloat16 v) {
    const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }

  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  // vmaxps returns its second operand when either is NaN: a NaN in `a` is ignored, as VecScalar does.
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  static F abs(F a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }

  // e^x as VecAvx512::exp (Cephes' polynomial; results below FLT_MIN flushed to +0; inf and NaN kept).
  static F exp(F x) {
    const F lo = _mm256_set1_ps(-87.3f);
    const F tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_set1_ps(89.0f), x));
    F n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    F p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    F s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    F s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
  }

  // ln x as VecAvx512::log (Cephes' logf); ln 0 = -inf, ln of a negative = NaN, ln inf = inf, NaN stays.
  static F log(F x) {
    const F zero = _mm256_setzero_ps();
    const F subnormal = _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    F xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), subnormal);  // 2^23
    __m256i e_adjust = _mm256_and_si256(_mm256_castps_si256(subnormal), _mm256_set1_epi32(23));
    __m256i bits = _mm256_castps_si256(xs);
    __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126));
    e = _mm256_sub_epi32(e, e_adjust);
    F m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                              _mm256_set1_epi32(0x3f000000)));  // [0.5, 1)
    const F small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
    e = _mm256_sub_epi32(e, _mm256_and_si256(_mm256_castps_si256(small), _mm256_set1_epi32(1)));
    m = _mm256_sub_ps(_mm256_blendv_ps(m, _mm256_add_ps(m, m), small), _mm256_set1_ps(1.0f));
    F z = _mm256_mul_ps(m, m);
    F y = _mm256_set1_ps(7.0376836292e-2f);
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.1514610310e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.1676998740e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.2420140846e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.4249322787e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.6668057665e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(2.0000714765e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-2.4999993993e-1f));
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(3.3333331174e-1f));
    y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
    F fe = _mm256_cvtepi32_ps(e);
    y = _mm256_fmadd_ps(fe, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, y);
    F r = _mm256_add_ps(m, y);
    r = _mm256_fmadd_ps(fe, _mm256_set1_ps(0.693359375f), r);
    r = _mm256_blendv_ps(r, _mm256_set1_ps(-__builtin_inff()), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_nanf("")), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
    r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }

  static float reduce_add(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(F a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // a * 0 + acc: stays finite exactly while every a seen is finite (inf * 0 and NaN give NaN).
  static F nonfinite_acc(F acc, F a) { return _mm256_fmadd_ps(a, _mm256_setzero_ps(), acc); }
  static bool is_finite_acc(F acc) { return _mm256_movemask_ps(_mm256_cmp_ps(acc, acc, _CMP_UNORD_Q)) == 0; }

  // Masks and index vectors (argmax).
  static M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M is_nan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static bool any(M m) { return _mm256_movemask_ps(m) != 0; }
  static M mask_or(M a, M b) { return _mm256_or_ps(a, b); }
  static M mask_andnot(M a, M b) { return _mm256_andnot_ps(a, b); }  // ~a & b
  static F select(M m, F a, F b) { return _mm256_blendv_ps(a, b, m); }
  // A mask as kWidth bits (lane i: bit i) and back (ReLU's mask kept as bits).
  static uint32_t mask_bits(M m) { return static_cast<uint32_t>(_mm256_movemask_ps(m)); }
  static M mask_from_bits(uint32_t bits) {
    const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(bits)), lane);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane));
  }
  static I iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static I seti(int32_t v) { return _mm256_set1_epi32(v); }
  static I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  static I selecti(M m, I a, I b) { return _mm256_blendv_epi8(a, b, _mm256_castps_si256(m)); }
  static void storei(int32_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

  // Lanes i < n all-ones.
  static M lanes_below(int64_t n) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), iota()));
  }
  // b (8, bf16 bits) -> (8, f32), exact.
  static F widen_bf16(__m128i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)); }
  // x (8, f32) -> (8, bf16 bits), rounded to nearest even; a NaN keeps its top bits and gets the quiet bit
  // (the rounding carry could turn it into inf).
  static __m128i narrow_bf16(F v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i top = _mm256_srli_epi32(x, 16);
    const __m256i odd = _mm256_and_si256(top, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
    // 32 -> 16 bits: packus works within 128-bit halves; the permute puts the halves' results together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
  }
};

}  // namespace demi::kernels::cpu_internal
