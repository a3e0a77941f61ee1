// The AVX512-BF16 pieces of the direct convolution (internal/conv_direct_kernels.h): where the image and the
// gradient are both bf16, the weight gradient's dot products run vdpbf16ps on consecutive positions taken in
// pairs (each instruction two positions of 16 lanes into f32 accumulators: twice the FMA kernel's rate, half
// its bytes), on columns kept in bf16. Everything else is the AVX-512 table's.
//
// vdpbf16ps multiplies exactly and adds in f32, but takes bf16 subnormals (below 1.2e-38) as zero, as demi's
// bf16 GEMM kernel does; a loss-scaled gradient is never that small.
#include <algorithm>

#include "demi/kernels/cpu/internal/vec_avx512.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/conv_direct_kernels.h"

#if !defined(__AVX512BF16__)
#error "conv_direct_avx512bf16.cc needs -mavx512bf16 (files named *_avx512bf16.cc get it)"
#endif

namespace demi::kernels::cpu_internal {
namespace {

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// 32 positions (16 pairs) at a time; the tail's missing positions are +0.
inline __mmask32 pair_mask(int64_t left) {
  return left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << left) - 1u);
}

// col (K, OH * OW) in bf16 from the padded image, whose f32 values are widened bf16: the top halves, exactly
// (their bits: a NaN's payload and a subnormal stay as they are), 32 positions at a time picked from two
// vectors of f32 by one word permute (vpermt2w), where a shift and a narrowing store took 16 (model A's
// first-layer backward at O2-bf16: 0.40 -> 0.38 ms a step on a Zen 4, before its columns were built once
// per image).
void columns_bf16(const DirectGeom& g, const float* xp, BFloat16* col) {
  // Word 2i + 1 of the pair (lo, hi) is the top half of element i: lo's for i < 16, hi's (index 32 + ...) after.
  alignas(64) static constexpr uint16_t kTopHalves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                          23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                          45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i top = _mm512_load_si512(kTopHalves);
  for_each_column_row(g, xp, col, [&](const float* src, BFloat16* out) {
    for (int64_t ox = 0; ox < g.ow; ox += 32) {
      const __mmask32 m = pair_mask(g.ow - ox);
      const __m512i lo = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m), src + ox);
      const __m512i hi = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m >> 16), src + ox + 16);
      _mm512_mask_storeu_epi16(out + ox, m, _mm512_permutex2var_epi16(lo, top, hi));
    }
  });
}

template <int KB>
void dot_tile_bf16(const BFloat16* dz, const BFloat16* col, int64_t positions, float* lanes, int64_t k) {
  __m512 acc[4][KB];
#pragma GCC unroll 4
  for (int o = 0; o < 4; ++o)
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) acc[o][t] = _mm512_loadu_ps(lanes + (o * k + t) * 16);
  for (int64_t p = 0; p < positions; p += 32) {
    const __mmask32 m = pair_mask(positions - p);
    __m512bh d[4];
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) d[o] = as_bh(_mm512_maskz_loadu_epi16(m, dz + o * positions + p));
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) {
      const __m512bh x = as_bh(_mm512_maskz_loadu_epi16(m, col + t * positions + p));
#pragma GCC unroll 4
      for (int o = 0; o < 4; ++o) acc[o][t] = _mm512_dpbf16_ps(acc[o][t], d[o], x);
    }
  }
#pragma GCC unroll 4
  for (int o = 0; o < 4; ++o)
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) _mm512_storeu_ps(lanes + (o * k + t) * 16, acc[o][t]);
}

using DotTileBf16 = void (*)(const BFloat16*, const BFloat16*, int64_t, float*, int64_t);
constexpr DotTileBf16 kDotTiles[7] = {nullptr,          dot_tile_bf16<1>, dot_tile_bf16<2>, dot_tile_bf16<3>,
                                      dot_tile_bf16<4>, dot_tile_bf16<5>, dot_tile_bf16<6>};

// One row pair product into one accumulator (the channels past the last full tile of 4).
__m512 dot_row(__m512 acc, const BFloat16* a, const BFloat16* b, int64_t positions) {
  for (int64_t p = 0; p < positions; p += 32) {
    const __mmask32 m = pair_mask(positions - p);
    acc = _mm512_dpbf16_ps(acc, as_bh(_mm512_maskz_loadu_epi16(m, a + p)), as_bh(_mm512_maskz_loadu_epi16(m, b + p)));
  }
  return acc;
}

void dot_rows_bf16(const BFloat16* dz, const BFloat16* col, int64_t oc, int64_t k, int64_t positions, float* lanes,
                   int64_t lanes_k, float* db_lanes) {
  int64_t o = 0;
  for (; o + 4 <= oc; o += 4)
    for (int64_t t = 0; t < k; t += 6)
      kDotTiles[std::min<int64_t>(6, k - t)](dz + o * positions, col + t * positions, positions,
                                             lanes + (o * lanes_k + t) * 16, lanes_k);
  for (; o < oc; ++o)
    for (int64_t t = 0; t < k; ++t) {
      float* l = lanes + (o * lanes_k + t) * 16;
      _mm512_storeu_ps(l, dot_row(_mm512_loadu_ps(l), dz + o * positions, col + t * positions, positions));
    }
  // The bias gradient: each pair of dz times (1, 1), exact products, the same pairing.
  if (!db_lanes) return;
  const __m512bh ones = as_bh(_mm512_set1_epi16(0x3F80));
  for (o = 0; o < oc; ++o) {
    __m512 acc = _mm512_loadu_ps(db_lanes + o * 16);
    for (int64_t p = 0; p < positions; p += 32)
      acc = _mm512_dpbf16_ps(acc, as_bh(_mm512_maskz_loadu_epi16(pair_mask(positions - p), dz + o * positions + p)),
                             ones);
    _mm512_storeu_ps(db_lanes + o * 16, acc);
  }
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_avx512bf16() {
  static const DirectConvKernels k = [] {
    DirectConvKernels t = direct_conv_kernels_avx512();
    t.name = "avx512_bf16";
    t.columns_bf16 = columns_bf16;
    t.dot_rows_bf16 = dot_rows_bf16;
    return t;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
