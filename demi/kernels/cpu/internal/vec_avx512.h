// The AVX-512 vector of 16 f32 lanes that the kernel templates in *_impl.h are instantiated with.
// Loads convert bf16/f16 storage to f32 exactly; stores round to nearest even, bit-identical to
// demi::BFloat16(float) and demi::Half(float) (integer rounding for bf16 rather than vcvtneps2bf16,
// which flushes subnormal inputs to zero; vcvtps2ph with an explicit rounding immediate for f16).
// Tails use masked loads and stores, which never touch memory outside the given lanes.
//
// Only translation units compiled with AVX-512 flags (*_avx512.cc, and the avx512 variants CMake generates from
// core/kernel_registry.h) include this header. Every function here is a member of VecAvx512, a name no portable
// file uses, and the kernel templates instantiated with it get names of their own, so the linker never hands an
// AVX-512 body to a portable caller.
#pragma once

// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// and -Wuninitialized report at every inlined use (GCC bug 105593, fixed in 13; _mm512_reduce_add_ps
// trips it); the location is inside the header, so silencing it there hides nothing of ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "demi/core/half.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__F16C__)
#error "vec_avx512.h needs -mavx512f -mavx512bw -mavx512vl -mf16c (files named *_avx512.cc get them)"
#endif

namespace demi::kernels::cpu_internal {

struct VecAvx512 {
  static constexpr int kWidth = 16;
  using F = __m512;
  using M = __mmask16;
  using I = __m512i;

  // vcvtps2ph's immediate: round to nearest even whatever MXCSR says, and raise nothing.
  static constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static M tail_mask(int64_t n) { return static_cast<M>((1u << n) - 1u); }  // 0 <= n <= 16

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load(const BFloat16* p) {
    return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // The first n (< 16) lanes from p, the others `fill`.
  static F load_n(const float* p, int64_t n, float fill = 0.0f) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), tail_mask(n), p);
  }
  static F load_n(const Half* p, int64_t n, float fill = 0.0f) {
    M m = tail_mask(n);
    F v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_mask_blend_ps(m, _mm512_set1_ps(fill), v);
  }
  static F load_n(const BFloat16* p, int64_t n, float fill = 0.0f) {
    M m = tail_mask(n);
    F v = widen_bf16(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_mask_blend_ps(m, _mm512_set1_ps(fill), v);
  }

  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(Half* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, kRoundNearest));
  }
  static void store(BFloat16* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(round_bf16(v)));
  }
  static void store_n(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  static void store_n(Half* p, F v, int64_t n) {
    _mm256_mask_storeu_epi16(p, tail_mask(n), _mm512_cvtps_ph(v, kRoundNearest));
  }
  static void store_n(BFloat16* p, F v, int64_t n) {
    _mm512_mask_cvtepi32_storeu_epi16(p, tail_mask(n), round_bf16(v));
  }

  // One element's conversions (for per-row scalars such as the label's logit); no half.h inline code.
  static float to_float(float v) { return v; }
  static float to_float(Half v) { return _cvtsh_ss(v.bits); }
  static float to_float(BFloat16 v) {
    return _mm_cvtss_f32(_mm512_castps512_ps128(widen_bf16(_mm256_set1_epi16(static_cast<int16_t>(v.bits)))));
  }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // vmaxps returns its second operand when either is NaN: a NaN in `a` is ignored, as VecScalar does.
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F neg(F a) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))); }
  static F abs(F a) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff))); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }

  // e^x to about 1 ulp (Cephes' polynomial on x - n ln2, |x - n ln2| <= ln2 / 2); overflow gives inf, NaN
  // stays NaN (vmaxps/vminps with the argument second pass a NaN through). Results below FLT_MIN (x < -87.3)
  // are flushed to +0 rather than computed as subnormals: each subnormal result costs a microcode assist on
  // this CPU (it tripled softmax rows, whose padded lanes are exp(-inf)), and a value under 1.2e-38 is
  // nothing next to the sums it joins. The 2^n scaling is one vscalefps (n up to 128: results up to FLT_MAX
  // come out finite).
  static F exp(F x) {
    const F lo = _mm512_set1_ps(-87.3f);
    const M tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    F n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    F p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    // p 2^n in one instruction (n is integral). The same bits as the other levels' p 2^(n/2) 2^(n - n/2):
    // for x >= -87.3 the result is normal (n >= -126 with p > 1 there), so both scalings are exact, and an
    // overflow is +inf in both.
    return _mm512_maskz_scalef_ps(static_cast<M>(~tiny), p, n);
  }

  // ln x to about 1 ulp (Cephes' logf); ln 0 = -inf, ln of a negative = NaN, ln inf = inf, NaN stays.
  static F log(F x) {
    const F zero = _mm512_setzero_ps();
    M subnormal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    F xs = _mm512_mask_mul_ps(x, subnormal, x, _mm512_set1_ps(8388608.0f));  // 2^23
    __m512i e_adjust = _mm512_maskz_set1_epi32(subnormal, 23);
    __m512i bits = _mm512_castps_si512(xs);
    __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(126));
    e = _mm512_sub_epi32(e, e_adjust);
    F m = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)),
                                              _mm512_set1_epi32(0x3f000000)));  // [0.5, 1)
    M small = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
    e = _mm512_mask_sub_epi32(e, small, e, _mm512_set1_epi32(1));
    m = _mm512_sub_ps(_mm512_mask_add_ps(m, small, m, m), _mm512_set1_ps(1.0f));
    F z = _mm512_mul_ps(m, m);
    F y = _mm512_set1_ps(7.0376836292e-2f);
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.1514610310e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.1676998740e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.2420140846e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.4249322787e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.6668057665e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(2.0000714765e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-2.4999993993e-1f));
    y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(3.3333331174e-1f));
    y = _mm512_mul_ps(_mm512_mul_ps(y, m), z);
    F fe = _mm512_cvtepi32_ps(e);
    y = _mm512_fmadd_ps(fe, _mm512_set1_ps(-2.12194440e-4f), y);
    y = _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z, y);
    F r = _mm512_add_ps(m, y);
    r = _mm512_fmadd_ps(fe, _mm512_set1_ps(0.693359375f), r);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), r, _mm512_set1_ps(-__builtin_inff()));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), r, _mm512_set1_ps(__builtin_nanf("")));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ), r, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
  }

  static float reduce_add(F a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(F a) { return _mm512_reduce_max_ps(a); }

  // a * 0 + acc: stays finite exactly while every a seen is finite (inf * 0 and NaN give NaN).
  static F nonfinite_acc(F acc, F a) { return _mm512_fmadd_ps(a, _mm512_setzero_ps(), acc); }
  static bool is_finite_acc(F acc) { return _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q) == 0; }

  // Masks and index vectors (argmax).
  static M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M is_nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static bool any(M m) { return m != 0; }
  static M mask_or(M a, M b) { return static_cast<M>(a | b); }
  static M mask_andnot(M a, M b) { return static_cast<M>(~a & b); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, a, b); }
  // A mask as kWidth bits (lane i: bit i) and back (ReLU's mask kept as bits).
  static uint32_t mask_bits(M m) { return m; }
  static M mask_from_bits(uint32_t bits) { return static_cast<M>(bits); }
  // ReLU's mask on 16-bit values as stored (bf16 or f16), 32 at a time, with no conversion: bits[i] = (y_i >
  // 0), i.e. 0 < y_i's bits <= `inf` (+inf's bits; a sign bit or a NaN's larger bits fail), and out_i = in_i
  // where bits[i] is set, +0 elsewhere. Exactly the f32 path's results (a kept NaN keeps its payload).
  static void positive_bits16(const void* y, uint8_t* bits, int64_t n, uint16_t inf) {
    const auto* s = static_cast<const uint16_t*>(y);
    const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi16(static_cast<int16_t>(inf));
    for (int64_t i = 0; i < n; i += 32) {
      const int64_t r = n - i < 32 ? n - i : 32;
      const __mmask32 valid = r == 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << r) - 1);
      const __m512i v = _mm512_maskz_loadu_epi16(valid, s + i);  // (lanes past n: 0, not positive)
      const uint32_t word = _mm512_cmpgt_epi16_mask(v, zero) & _mm512_cmple_epi16_mask(v, top);
      std::memcpy(bits + i / 8, &word, static_cast<size_t>((r + 7) / 8));
    }
  }
  static void keep_by_bits16(const uint8_t* bits, const void* in, void* out, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(in);
    auto* d = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; i += 32) {
      const int64_t r = n - i < 32 ? n - i : 32;
      uint32_t word = 0;
      std::memcpy(&word, bits + i / 8, static_cast<size_t>((r + 7) / 8));
      if (r == 32) {
        _mm512_storeu_si512(d + i, _mm512_maskz_loadu_epi16(word, s + i));
      } else {
        const __mmask32 valid = static_cast<__mmask32>((uint32_t{1} << r) - 1);
        _mm512_mask_storeu_epi16(d + i, valid, _mm512_maskz_loadu_epi16(word & valid, s + i));
      }
    }
  }
  static I iota() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static I seti(int32_t v) { return _mm512_set1_epi32(v); }
  static I addi(I a, I b) { return _mm512_add_epi32(a, b); }
  static I selecti(M m, I a, I b) { return _mm512_mask_blend_epi32(m, a, b); }
  static void storei(int32_t* p, I v) { _mm512_storeu_si512(p, v); }

  // x (16, f32) -> (16, bf16 bits in the low half of each lane), rounded to nearest even; a NaN keeps its
  // top bits and gets the quiet bit, because the rounding carry could turn it into inf.
  static __m512i round_bf16(F v) {
    __m512i x = _mm512_castps_si512(v);
    __m512i top = _mm512_srli_epi32(x, 16);
    __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
    M nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                    _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(rounded, nan, top, _mm512_set1_epi32(0x40));
  }
  // b (16, bf16 bits) -> (16, f32), exact.
  static F widen_bf16(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }
  // The top 16 bits of a's 16 lanes, then of b's, as 32 words in order (one vpermt2w): 32 f32 values that
  // are bf16 values (or bf16 parts) narrowed, bit for bit.
  static I top_halves(I a, I b) {
    // word 2i + 1 of the pair (a, b) is lane i's top half: a's for i < 16, b's (index 32 + ...) after
    alignas(64) static constexpr uint16_t kTopHalves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                            23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                            45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    return _mm512_permutex2var_epi16(a, _mm512_load_si512(kTopHalves), b);
  }

  // r[i] (16 lanes each) <- column i of the 16 x 16 matrix whose rows are r[0..15]; moves bits only (a
  // NaN's payload stays; int32 lanes may go through it cast).
  [[gnu::always_inline]] static void transpose16(F r[16]) {
    F t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Within each 128-bit lane L: r[4g + j] = column 4L + j of rows 4g .. 4g+3.
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const F u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
      const F u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
      const F v0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
      const F v1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
      t[j] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(2, 0, 2, 0));
      t[4 + j] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(3, 1, 3, 1));
      t[8 + j] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(2, 0, 2, 0));
      t[12 + j] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = t[i];
  }
};

}  // namespace demi::kernels::cpu_internal
