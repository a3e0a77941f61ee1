// AVX2 dropout kernels: Philox4x32-10 on 4 counters per vector (one per 64-bit lane, so each 32x32 -> 64
// multiply is one vpmuludq, as in dropout_avx512.cc), the keep mask as 8 bits per 8 elements, and the
// masked scale. Compiled with AVX2 flags only; dispatched from dropout.cc. The words are bit-identical to
// demi::philox4x32 (rng.cc): dropout_test.cc checks every variant's masks against the reference.
#include <cstring>

#include "demi/core/rng.h"
#include "demi/kernels/cpu/internal/dropout_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx2.h"

namespace demi::kernels::cpu_internal {
namespace {

using V = VecAvx2;

inline __m256i set1u(uint32_t v) { return _mm256_set1_epi32(static_cast<int32_t>(v)); }

// The round keys of one seed, broadcast: round r uses (k0 + r W0, k1 + r W1).
struct PhiloxKeys {
  __m256i k0[kPhiloxRounds], k1[kPhiloxRounds];
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

// Ten rounds on 4 counters, one per 64-bit lane; only the low 32 bits of a lane are the word (the high
// halves carry what nothing reads).
inline void philox_rounds(__m256i& x0, __m256i& x1, __m256i& x2, __m256i& x3, const PhiloxKeys& keys) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0), m1 = _mm256_set1_epi64x(kPhiloxM1);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    __m256i p0 = _mm256_mul_epu32(x0, m0);
    __m256i p1 = _mm256_mul_epu32(x2, m1);
    __m256i hi0 = _mm256_shuffle_epi32(p0, _MM_SHUFFLE(2, 3, 0, 1));
    __m256i hi1 = _mm256_shuffle_epi32(p1, _MM_SHUFFLE(2, 3, 0, 1));
    x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), keys.k0[r]);
    x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), keys.k1[r]);
    x1 = p1;
    x3 = p0;
  }
}

// The 16 words of counters base .. base + 3 in element order: out[0] elements 0-7 (counters 0 and 1,
// words 0-3 each), out[1] elements 8-15.
inline void philox_quad(uint64_t base, const PhiloxKeys& keys, __m256i out[2]) {
  __m256i c = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(base)), _mm256_setr_epi64x(0, 1, 2, 3));
  __m256i x0 = c, x1 = _mm256_srli_epi64(c, 32), x2 = _mm256_setzero_si256(), x3 = _mm256_setzero_si256();
  philox_rounds(x0, x1, x2, x3, keys);
  // Per counter (64-bit lane) the pairs (w0, w1) and (w2, w3), then counters interleaved into order.
  __m256i w01 = _mm256_blend_epi32(x0, _mm256_slli_epi64(x1, 32), 0xAA);
  __m256i w23 = _mm256_blend_epi32(x2, _mm256_slli_epi64(x3, 32), 0xAA);
  __m256i lo = _mm256_unpacklo_epi64(w01, w23);  // counters 0 | 2
  __m256i hi = _mm256_unpackhi_epi64(w01, w23);  // counters 1 | 3
  out[0] = _mm256_permute2x128_si256(lo, hi, 0x20);
  out[1] = _mm256_permute2x128_si256(lo, hi, 0x31);
}

// Lanes whose mask bit is set, as an all-ones / all-zero vector.
inline __m256 bits_to_lanes(uint32_t bits) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(bits)), bit);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, bit));
}

template <typename T>
void forward(const void* xv, void* yv, uint8_t* mask, int64_t first_block, int64_t end_block, int64_t n, uint64_t seed,
             uint64_t counter, uint32_t threshold, float scale) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const __m256 s = _mm256_set1_ps(scale);
  // (w >> 8) < threshold <= 2^24: both fit a signed 32-bit compare.
  const __m256i t = set1u(threshold);
  const PhiloxKeys keys(seed);
  for (int64_t block = first_block; block < end_block; ++block) {
    for (int q = 0; q < 4; ++q) {  // 16 elements (4 counters) at a time
      int64_t e0 = block * 64 + 16 * q;
      if (e0 >= n) return;
      __m256i words[2];
      philox_quad(counter + static_cast<uint64_t>(e0 / 4), keys, words);
      for (int j = 0; j < 2; ++j) {
        int64_t e = e0 + 8 * j;
        int64_t count = n - e;
        if (count <= 0) break;
        __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(t, _mm256_srli_epi32(words[j], 8)));
        uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(keep));
        if (count >= 8) {
          V::store(y + e, _mm256_and_ps(_mm256_mul_ps(V::load(x + e), s), keep));
        } else {
          bits &= (1u << count) - 1;
          V::store_n(y + e, _mm256_and_ps(_mm256_mul_ps(V::load_n(x + e, count), s), keep), count);
        }
        mask[e / 8] = static_cast<uint8_t>(bits);
      }
    }
  }
}

template <typename T>
void backward(const void* dyv, const uint8_t* mask, void* dxv, int64_t first_block, int64_t end_block, int64_t n,
              float scale) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const __m256 s = _mm256_set1_ps(scale);
  int64_t end = end_block * 64 < n ? end_block * 64 : n;
  int64_t e = first_block * 64;
  for (; e + 8 <= end; e += 8)
    V::store(dx + e, _mm256_and_ps(_mm256_mul_ps(V::load(dy + e), s), bits_to_lanes(mask[e / 8])));
  if (e < end) {
    int64_t count = end - e;
    V::store_n(dx + e, _mm256_and_ps(_mm256_mul_ps(V::load_n(dy + e, count), s), bits_to_lanes(mask[e / 8])), count);
  }
}

}  // namespace

const DropoutKernels& dropout_kernels_avx2(int slot) {
  static const DropoutKernels kernels[3] = {{&forward<float>, &backward<float>},
                                            {&forward<BFloat16>, &backward<BFloat16>},
                                            {&forward<Half>, &backward<Half>}};
  return kernels[slot];
}

}  // namespace demi::kernels::cpu_internal
