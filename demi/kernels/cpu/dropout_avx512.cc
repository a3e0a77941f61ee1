// AVX-512 dropout kernels: Philox4x32-10 on 16 counters at once, the keep mask as 64 bits per block of
// 64 elements, and the masked scale. Compiled with AVX-512 flags only; dispatched from dropout.cc.
//
// Lane l of the 16-lane word vectors holds counter 4 (l % 4) + l / 4 of its block, so that the 4x4
// transposes within each 128-bit quarter (unpack) leave the 64 words in element order: vector j holds
// elements 16 j .. 16 j + 15, i.e. counters 4 j .. 4 j + 3, words 0..3 each. The rounds themselves run
// on 64-bit lanes (8 counters per vector), which makes each 32x32 -> 64 multiply one instruction. The
// words are bit-identical to demi::philox4x32 (rng.cc): dropout_test.cc checks the masks against the
// reference.
#include <cstring>

#include "demi/core/rng.h"
#include "demi/kernels/cpu/internal/dropout_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal {
namespace {

using V = VecAvx512;

inline __m512i set1u(uint32_t v) { return _mm512_set1_epi32(static_cast<int32_t>(v)); }

// The round keys of one seed, broadcast: round r uses (k0 + r W0, k1 + r W1).
struct PhiloxKeys {
  __m512i k0[kPhiloxRounds], k1[kPhiloxRounds];
  explicit PhiloxKeys(uint64_t seed) {
    uint32_t a = static_cast<uint32_t>(seed), b = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < kPhiloxRounds; ++r) {
      k0[r] = set1u(a);
      k1[r] = set1u(b);
      a += kPhiloxW0;
      b += kPhiloxW1;
    }
  }
};

// Ten Philox rounds on 8 counters held one per 64-bit lane: only the low 32 bits of each lane are the
// word; vpmuludq reads just those and yields the full 64-bit product, whose low half is the next "lo"
// word as it stands and whose high half a 32-bit swap (vpshufd, off the multiplier's port) brings down.
// The high halves carry garbage that nothing reads.
inline void philox_rounds(__m512i& x0, __m512i& x1, __m512i& x2, __m512i& x3, const PhiloxKeys& keys) {
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0), m1 = _mm512_set1_epi64(kPhiloxM1);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    __m512i p0 = _mm512_mul_epu32(x0, m0);
    __m512i p1 = _mm512_mul_epu32(x2, m1);
    __m512i hi0 = _mm512_shuffle_epi32(p0, _MM_PERM_CDAB);
    __m512i hi1 = _mm512_shuffle_epi32(p1, _MM_PERM_CDAB);
    x0 = _mm512_ternarylogic_epi32(hi1, x1, keys.k0[r], 0x96);  // hi1 ^ x1 ^ k0
    x2 = _mm512_ternarylogic_epi32(hi0, x3, keys.k1[r], 0x96);  // hi0 ^ x3 ^ k1
    x1 = p1;                                                    // lo1
    x3 = p0;                                                    // lo0
  }
}

// The 64 words of counters base .. base + 15 in element order (see the top of this file).
inline void philox_block(uint64_t base, const PhiloxKeys& keys, __m512i out[4]) {
  // Lane l of the 16-lane word vectors runs counter perm[l] = 4 (l % 4) + l / 4; lanes 0-7 come from
  // the first 8-counter half, 8-15 from the second.
  const __m512i off_a = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
  const __m512i off_b = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i low_halves = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512i ca = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(base)), off_a);
  __m512i cb = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(base)), off_b);
  __m512i a0 = ca, a1 = _mm512_srli_epi64(ca, 32), a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
  __m512i b0 = cb, b1 = _mm512_srli_epi64(cb, 32), b2 = _mm512_setzero_si512(), b3 = _mm512_setzero_si512();
  philox_rounds(a0, a1, a2, a3, keys);
  philox_rounds(b0, b1, b2, b3, keys);
  __m512i c0 = _mm512_permutex2var_epi32(a0, low_halves, b0);
  __m512i c1 = _mm512_permutex2var_epi32(a1, low_halves, b1);
  __m512i c2 = _mm512_permutex2var_epi32(a2, low_halves, b2);
  __m512i c3 = _mm512_permutex2var_epi32(a3, low_halves, b3);
  __m512i t0 = _mm512_unpacklo_epi32(c0, c1);
  __m512i t1 = _mm512_unpackhi_epi32(c0, c1);
  __m512i t2 = _mm512_unpacklo_epi32(c2, c3);
  __m512i t3 = _mm512_unpackhi_epi32(c2, c3);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

inline void store_mask_bits(uint8_t* p, __mmask16 m, int64_t count) {
  uint16_t bits = static_cast<uint16_t>(m);
  std::memcpy(p, &bits, count > 8 ? 2 : 1);
}

inline __mmask16 load_mask_bits(const uint8_t* p, int64_t count) {
  uint16_t bits = 0;
  std::memcpy(&bits, p, count > 8 ? 2 : 1);
  return static_cast<__mmask16>(bits);
}

template <typename T>
void forward(const void* xv, void* yv, uint8_t* mask, int64_t first_block, int64_t end_block, int64_t n, uint64_t seed,
             uint64_t counter, uint32_t threshold, float scale) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i t = set1u(threshold);
  const PhiloxKeys keys(seed);
  for (int64_t block = first_block; block < end_block; ++block) {
    __m512i words[4];
    philox_block(counter + static_cast<uint64_t>(block) * 16, keys, words);
    for (int j = 0; j < 4; ++j) {
      int64_t e = block * 64 + 16 * j;
      int64_t count = n - e;
      if (count <= 0) break;
      // Kept iff (w >> 8) < threshold: u32_to_unit_float(w) < keep_prob (reference/dropout.h).
      __mmask16 keep = _mm512_cmplt_epu32_mask(_mm512_srli_epi32(words[j], 8), t);
      if (count >= 16) {
        V::store(y + e, _mm512_maskz_mul_ps(keep, V::load(x + e), s));
        store_mask_bits(mask + e / 8, keep, 16);
      } else {
        keep = static_cast<__mmask16>(keep & V::tail_mask(count));
        V::store_n(y + e, _mm512_maskz_mul_ps(keep, V::load_n(x + e, count), s), count);
        store_mask_bits(mask + e / 8, keep, count);
      }
    }
  }
}

template <typename T>
void backward(const void* dyv, const uint8_t* mask, void* dxv, int64_t first_block, int64_t end_block, int64_t n,
              float scale) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const __m512 s = _mm512_set1_ps(scale);
  int64_t end = end_block * 64 < n ? end_block * 64 : n;
  int64_t e = first_block * 64;
  for (; e + 16 <= end; e += 16)
    V::store(dx + e, _mm512_maskz_mul_ps(load_mask_bits(mask + e / 8, 16), V::load(dy + e), s));
  if (e < end) {
    int64_t count = end - e;
    __mmask16 keep = static_cast<__mmask16>(load_mask_bits(mask + e / 8, count) & V::tail_mask(count));
    V::store_n(dx + e, _mm512_maskz_mul_ps(keep, V::load_n(dy + e, count), s), count);
  }
}

}  // namespace

const DropoutKernels& dropout_kernels_avx512(int slot) {
  static const DropoutKernels kernels[3] = {{&forward<float>, &backward<float>},
                                            {&forward<BFloat16>, &backward<BFloat16>},
                                            {&forward<Half>, &backward<Half>}};
  return kernels[slot];
}

}  // namespace demi::kernels::cpu_internal
