// The AVX512-BF16 pieces of demi's GEMM (internal/gemm_kernels.h): a 6 x 64 micro-kernel of vdpbf16ps
// (each instruction two k steps of 16 columns into f32 accumulators: twice the FMA kernel's rate), the
// VNNI-2 packing of b it reads (pairs of k interleaved per column, as AOCL's and oneDNN's bf16 kernels),
// and the pair packing of a transposed a. Everything else is the AVX-512 table's.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "demi/kernels/cpu/internal/gemm_avx512_impl.h"

#if !defined(__AVX512BF16__)
#error "gemm_avx512bf16.cc needs -mavx512bf16 (files named *_avx512bf16.cc get it)"
#endif

namespace demi::kernels::cpu_internal {
namespace {

using namespace gemm512;

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

inline int32_t pair_at(const BFloat16* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int32_t single_at(const BFloat16* p) { return static_cast<int32_t>(p->bits); }  // partner +0

// One k pair of the 6 x 64 tile: the first kV (of 4) vectors of packed b pairs (the next ones prefetched),
// row r's pair load_a(a + off[r]) broadcast.
template <int kV = kVecs, typename LoadA>
[[gnu::always_inline]] inline void dpbf16_step(Acc& acc, const BFloat16* a, const int64_t (&off)[kMr],
                                               const BFloat16* b, LoadA load_a) {
  __m512bh bv[kV];
#pragma GCC unroll 4
  for (int v = 0; v < kV; ++v) bv[v] = as_bh(_mm512_load_si512(b + 32 * v));
  _mm_prefetch(reinterpret_cast<const char*>(b + 8 * 2 * kNr), _MM_HINT_T0);
  if constexpr (kV > 2) _mm_prefetch(reinterpret_cast<const char*>(b + 8 * 2 * kNr + 64), _MM_HINT_T0);
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    const __m512bh x = as_bh(_mm512_set1_epi32(load_a(a + off[r])));
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, bv[v]);
  }
}

// The k pairs over the tile's first kV vectors of columns (the rest of the accumulators stay zero).
template <int kV>
[[gnu::always_inline]] inline void dpbf16_loop(Acc& acc, int64_t kc, const BFloat16* a, int64_t cs,
                                               const int64_t (&off)[kMr], const BFloat16* b) {
  const int64_t pairs = kc / 2;
  for (int64_t p = 0; p < pairs; ++p, a += cs, b += 2 * kNr) dpbf16_step<kV>(acc, a, off, b, pair_at);
  if (kc & 1) dpbf16_step<kV>(acc, a, off, b, single_at);
}

void ukr_bf16(int64_t kc, const BFloat16* a, int64_t rs, int64_t cs, const BFloat16* b, const GemmTile& t) {
  fill_and_store(t, [&](Acc& acc) __attribute__((always_inline)) {
    int64_t off[kMr];
    start_tile(acc, off, t, rs);
    with_vectors(t.n, [&](auto v) __attribute__((always_inline)) { dpbf16_loop<v()>(acc, kc, a, cs, off, b); });
  });
}

// The indirect pair tile (GemmKernels::bf16_indirect): row r's pair kp at base + roff[r] + koff[kp].
void ukr_bf16_indirect(int64_t pairs, const BFloat16* base, const int64_t* roff, const int64_t* koff,
                       const BFloat16* b, const GemmTile& t) {
  fill_and_store(t, [&](Acc& acc) __attribute__((always_inline)) {
    int64_t off[kMr];
    start_tile(acc, off, t, 0);
    for (int r = 0; r < kMr; ++r) off[r] = roff[std::min(r, t.m - 1)];
    const BFloat16* bk = b;
    for (int64_t p = 0; p < pairs; ++p, bk += 2 * kNr) dpbf16_step(acc, base + koff[p], off, bk, pair_at);
  });
}

// The narrow indirect pair tile: 12 rows, b's first 32 columns (2 vectors of pairs of the 64-wide panel row).
void ukr_bf16_indirect_narrow(int64_t pairs, const BFloat16* base, const int64_t* roff, const int64_t* koff,
                              const BFloat16* b, const GemmTile& t) {
  NarrowAcc acc;
  int64_t off[kNarrowMr];
  start_narrow(acc, off, roff, t);
  for (int64_t p = 0; p < pairs; ++p, b += 2 * kNr) {
    const __m512bh b0 = as_bh(_mm512_load_si512(b)), b1 = as_bh(_mm512_load_si512(b + 32));
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * 2 * kNr), _MM_HINT_T0);
    const BFloat16* a = base + koff[p];
#pragma GCC unroll 12
    for (int r = 0; r < kNarrowMr; ++r) {
      const __m512bh x = as_bh(_mm512_set1_epi32(pair_at(a + off[r])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
  store_narrow(acc, t);
}

// Pairs (x[i], y[i]) for i < total, 32-bit each, into dst; pairs at i >= valid, and y where y is null,
// are +0. 32 columns at a time: unpack lo/hi interleaves within 128-bit lanes, the permute restores
// column order.
void interleave(const BFloat16* x, const BFloat16* y, int64_t valid, int64_t total, BFloat16* dst) {
  const __m512i idx0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i idx1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t j = 0; j < total; j += 32) {
    const int64_t w = std::clamp<int64_t>(valid - j, 0, 32);
    const __mmask32 m = w == 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << w) - 1);
    const __m512i xv = _mm512_maskz_loadu_epi16(m, x + j);
    const __m512i yv = y ? _mm512_maskz_loadu_epi16(m, y + j) : _mm512_setzero_si512();
    const __m512i lo = _mm512_unpacklo_epi16(xv, yv), hi = _mm512_unpackhi_epi16(xv, yv);
    const __m512i out0 = _mm512_permutex2var_epi64(lo, idx0, hi), out1 = _mm512_permutex2var_epi64(lo, idx1, hi);
    const int64_t left = total - j;  // pairs still to write here: 32, or fewer at the end
    if (left >= 32) {
      _mm512_storeu_si512(dst + 2 * j, out0);
      _mm512_storeu_si512(dst + 2 * j + 32, out1);
    } else {
      const auto mask16 = [](int64_t n) {
        return static_cast<__mmask16>(n >= 16 ? 0xffff : (n <= 0 ? 0 : (1u << n) - 1u));
      };
      _mm512_mask_storeu_epi32(dst + 2 * j, mask16(left), out0);
      _mm512_mask_storeu_epi32(dst + 2 * j + 32, mask16(left - 16), out1);
    }
  }
}

void pack_b_bf16(const BFloat16* b, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                 BFloat16* dst, int64_t stride) {
  const int64_t pairs = (kc + 1) / 2, panels = (nc + kNr - 1) / kNr;
  if (!trans) {
    for (int64_t p = 0; p < pairs; ++p) {
      const BFloat16* x = b + (k0 + 2 * p) * ld + j0;
      const BFloat16* y = 2 * p + 1 < kc ? x + ld : nullptr;
      for (int64_t pn = 0; pn < panels; ++pn)
        interleave(x + pn * kNr, y ? y + pn * kNr : nullptr, std::min<int64_t>(kNr, nc - pn * kNr), kNr,
                   dst + pn * stride + p * 2 * kNr);
    }
    return;
  }
  // b stored (N, K): each column's k pairs are adjacent already; 16 columns x 16 pairs at a time,
  // transposed as 32-bit lanes.
  __m512 r[16];
  for (int64_t jg = 0; jg < panels * kNr; jg += 16) {
    BFloat16* panel = dst + (jg / kNr) * stride + 2 * (jg % kNr);
    const int64_t cols = std::clamp<int64_t>(nc - jg, 0, 16);
    for (int64_t p = 0; p < pairs; p += 16) {
      const int64_t k = 2 * p, w = std::min<int64_t>(32, kc - k);  // bf16 elements in this block
      const __mmask32 m = w == 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << w) - 1);
      for (int i = 0; i < 16; ++i)
        r[i] = i >= cols ? _mm512_setzero_ps()
                         : _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, b + (j0 + jg + i) * ld + k0 + k));
      if (cols > 0) VecAvx512::transpose16(r);
      const int64_t np = std::min<int64_t>(16, pairs - p);
      for (int64_t i = 0; i < np; ++i) _mm512_store_ps(reinterpret_cast<float*>(panel + (p + i) * 2 * kNr), r[i]);
    }
  }
}

void pack_a_pairs(const BFloat16* a, int64_t ld, int64_t k0, int64_t kc, int64_t i0, int64_t mc, BFloat16* dst) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const BFloat16* x = a + (k0 + 2 * p) * ld + i0;
    interleave(x, 2 * p + 1 < kc ? x + ld : nullptr, mc, mc, dst + p * 2 * mc);
  }
}

// n f16 values (t = f16), or f32 ones read as f16 (t = f32: rounded to f16 first), into bf16 in one pass in
// registers: bit for bit the chain through the conversion kernels (f32 -> f16 -> f32 -> bf16, each rounding
// to nearest even), since a value widened from f16 is never an f32 denormal, the one case where
// vcvtne2ps2bf16 needs a fix-up (it flushes them).
inline __m512 f16_lanes(const void* src, DType t, int64_t i, __mmask16 m) {
  if (t == DType::kF32)
    return _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i),
                                           _MM_FROUND_TO_NEAREST_INT));
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const Half*>(src) + i));
}

void f16_to_bf16(const void* src, DType t, BFloat16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = f16_lanes(src, t, i, 0xffff), hi = f16_lanes(src, t, i + 16, 0xffff);
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));  // lo's first
  }
  for (; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f16_lanes(src, t, i, m))));
  }
}

}  // namespace

const GemmKernels& gemm_kernels_avx512bf16() {
  static const GemmKernels k = [] {
    GemmKernels g = gemm_kernels_avx512();
    g.name = "avx512_bf16";
    g.bf16 = ukr_bf16;
    g.bf16_indirect = ukr_bf16_indirect;
    g.bf16_indirect_narrow = ukr_bf16_indirect_narrow;
    g.pack_b_bf16 = pack_b_bf16;
    g.pack_a_pairs = pack_a_pairs;
    g.f16_to_bf16 = f16_to_bf16;
    return g;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
