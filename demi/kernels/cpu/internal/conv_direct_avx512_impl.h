// The AVX-512 forward tiles of the direct convolution (conv_direct_kernels.h) with their accumulation left to
// the caller: the tiles' blocking and epilogues (bias, ReLU, the fused 2x2 max pool with its argmax) are
// shared by the f32 FMA tiles (conv_direct_avx512.cc) and the bf16 pair tiles (conv_direct_avx512bf16.cc), so
// the two differ only in how they sum the taps. `accumulate(acc, ...)` adds every tap into accumulators that
// start at +0.
//
// Only AVX-512 translation units include this header (after vec_avx512.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "demi/kernels/cpu/internal/conv_direct_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal {
namespace direct_avx512 {

// n values of a row of widened bf16 (f32 holding bf16 values) as bf16: their top halves, exactly (their bits:
// a NaN's payload and a subnormal stay as they are), 32 at a time picked from two vectors of f32 by one word
// permute (vpermt2w). The columns of the bf16 dot products and of the tile unit's weight gradient.
inline void narrow_row_bf16(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t left = n - i;
    const __mmask32 m = left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << left) - 1u);
    const __m512i lo = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m), src + i);
    const __m512i hi = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(m >> 16), src + i + 16);
    _mm512_mask_storeu_epi16(dst + i, m, VecAvx512::top_halves(lo, hi));
  }
}

// Columns ox0 .. ox0 + 16 * NV - 1 of output row oy for the tile's channels; `cols` of them are stored.
// accumulate(acc) with acc: __m512[kDirectOcb][NV].
template <int NV, class Accumulate>
inline void forward_row(const DirectGeom& g, const float* bias, bool relu, float* y, int ocn, int64_t oy, int64_t ox0,
                        int64_t cols, Accumulate&& accumulate) {
  __m512 acc[kDirectOcb][NV];
#pragma GCC unroll 12
  for (int o = 0; o < kDirectOcb; ++o)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_setzero_ps();
  accumulate(acc);
  const __m512 zero = _mm512_setzero_ps();
  // Over the tile's channels by a constant bound (a runtime one would index the accumulators from memory).
#pragma GCC unroll 12
  for (int o = 0; o < kDirectOcb; ++o) {
    if (o >= ocn) break;
    float* out = y + (o * g.oh + oy) * g.ow + ox0;
    const __m512 b = _mm512_set1_ps(bias[o]);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const int64_t n = std::min<int64_t>(16, cols - 16 * v);
      if (n <= 0) break;
      __m512 r = _mm512_add_ps(acc[o][v], b);
      if (relu) r = _mm512_max_ps(zero, r);  // zero first: -0 and NaN pass as relu(v) = v < 0 ? 0 : v keeps them
      _mm512_mask_storeu_ps(out + 16 * v, static_cast<__mmask16>((1u << n) - 1u), r);
    }
  }
}

// The fused Conv2d -> ReLU -> 2x2/2 MaxPool2d: 6 channels x 2 output rows x 32 columns in 24 accumulators,
// then each channel's two rows pooled in registers: even and odd columns split by permutes, the window's
// four values taken in relu_max_pool2d_forward's order (the first maximum wins a tie, a NaN wins over a
// number), ReLU, and 16 pooled values with their window indices stored. accumulate(acc, py, px0) with acc:
// __m512[kDirectPoolOcb][2][2] (channel, output row 2 py + r, columns 2 px0 + 16 v ...).
// The pooled rows [py0, py1) only: forward_pool2x2_rows.
template <bool kRoundBf16, class Accumulate>
inline void forward_pool2x2_rows(const float* bias, float* pooled, uint8_t* argmax, int ocn, int64_t py0, int64_t py1,
                                 int64_t ph, int64_t pw, Accumulate&& accumulate) {
  using V = VecAvx512;
  constexpr int kOcb = kDirectPoolOcb;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t py = py0; py < py1; ++py)
    for (int64_t px0 = 0; px0 < pw; px0 += 16) {
      __m512 acc[kOcb][2][2];
#pragma GCC unroll 6
      for (int o = 0; o < kOcb; ++o)
#pragma GCC unroll 2
        for (int r = 0; r < 2; ++r)
#pragma GCC unroll 2
          for (int v = 0; v < 2; ++v) acc[o][r][v] = _mm512_setzero_ps();
      accumulate(acc, py, px0);
      const int64_t cols = std::min<int64_t>(16, pw - px0);
      const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
#pragma GCC unroll 6
      for (int o = 0; o < kOcb; ++o) {
        if (o >= ocn) break;
        const __m512 b = _mm512_set1_ps(bias[o]);
        __m512 r[2][2];
#pragma GCC unroll 2
        for (int rr = 0; rr < 2; ++rr)
#pragma GCC unroll 2
          for (int v = 0; v < 2; ++v) {
            r[rr][v] = _mm512_add_ps(acc[o][rr][v], b);
            // The separate ops pool the bf16 values the convolution stores.
            if (kRoundBf16) r[rr][v] = _mm512_castsi512_ps(_mm512_slli_epi32(V::round_bf16(r[rr][v]), 16));
          }
        // The window's values in its order: (0,0), (0,1), (1,0), (1,1).
        const __m512 win[4] = {_mm512_permutex2var_ps(r[0][0], even, r[0][1]),
                               _mm512_permutex2var_ps(r[0][0], odd, r[0][1]),
                               _mm512_permutex2var_ps(r[1][0], even, r[1][1]),
                               _mm512_permutex2var_ps(r[1][0], odd, r[1][1])};
        // A later value wins where it is not <= the best so far (greater, or NaN) and the best is not NaN.
        __m512 best = win[0];
        __m512i at = _mm512_setzero_si512();
        __mmask16 best_ordered = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
#pragma GCC unroll 3
        for (int k = 1; k < 4; ++k) {
          const __mmask16 take = _mm512_mask_cmp_ps_mask(best_ordered, win[k], best, _CMP_NLE_UQ);
          best = _mm512_mask_mov_ps(best, take, win[k]);
          at = _mm512_mask_mov_epi32(at, take, _mm512_set1_epi32(k));
          best_ordered = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
        }
        // ReLU: no gradient where the maximum is not > 0 (NaN included); a negative maximum becomes 0.
        const __mmask16 positive = _mm512_cmp_ps_mask(best, zero, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, _mm512_cmp_ps_mask(best, zero, _CMP_LT_OQ), zero);
        at = _mm512_mask_mov_epi32(_mm512_set1_epi32(255), positive, at);
        const int64_t out = (o * ph + py) * pw + px0;
        _mm512_mask_storeu_ps(pooled + out, keep, best);
        if (argmax) _mm512_mask_cvtepi32_storeu_epi8(argmax + out, keep, at);
      }
    }
}

template <bool kRoundBf16, class Accumulate>
inline void forward_pool2x2(const float* bias, float* pooled, uint8_t* argmax, int ocn, int64_t ph, int64_t pw,
                            Accumulate&& accumulate) {
  forward_pool2x2_rows<kRoundBf16>(bias, pooled, argmax, ocn, 0, ph, ph, pw, accumulate);
}

}  // namespace direct_avx512
}  // namespace demi::kernels::cpu_internal
