// The AVX-512 pieces of the direct convolution (internal/conv_direct_kernels.h): the forward tile (12 output
// channels x up to 32 columns of one output row in 24 zmm accumulators; per tap 2 loads of the padded input
// row and 12 broadcast weights for 24 FMAs), the fused forward with ReLU -> 2x2 MaxPool2d pooled in
// registers, an image's columns, and the weight gradient's dot products (4 channels x 6 taps a tile).
#include <algorithm>

#include "demi/kernels/cpu/internal/vec_avx512.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/conv_direct_avx512_impl.h"
#include "demi/kernels/cpu/internal/conv_direct_kernels.h"

namespace demi::kernels::cpu_internal {
namespace {

// The taps of output row oy, columns ox0 ..., into acc (kDirectOcb channels x NV vectors): per tap NV loads of
// the padded row and kDirectOcb broadcast weights, fma(w, x, acc) in (c, i, j) order.
template <int NV>
void forward_row(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y,
                 int ocn, int64_t oy, int64_t ox0, int64_t cols) {
  direct_avx512::forward_row<NV>(g, bias, relu, y, ocn, oy, ox0, cols, [&](__m512 (&acc)[kDirectOcb][NV]) {
    const float* w = wp;
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.kh; ++i) {
        const float* row = xp + (c * g.hp + oy + i) * g.wp + ox0;
        for (int64_t j = 0; j < g.kw; ++j, w += kDirectOcb) {
          __m512 x[NV];
#pragma GCC unroll 2
          for (int v = 0; v < NV; ++v) x[v] = _mm512_loadu_ps(row + j + 16 * v);
#pragma GCC unroll 12
          for (int o = 0; o < kDirectOcb; ++o) {
            const __m512 b = _mm512_set1_ps(w[o]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_fmadd_ps(b, x[v], acc[o][v]);
          }
        }
      }
  });
}

void forward(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y, int ocn) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox0 = 0; ox0 < g.ow; ox0 += 32) {
      const int64_t cols = std::min<int64_t>(32, g.ow - ox0);
      if (cols > 16)
        forward_row<2>(g, xp, wp, bias, relu, y, ocn, oy, ox0, cols);
      else
        forward_row<1>(g, xp, wp, bias, relu, y, ocn, oy, ox0, cols);
    }
}

// The fused forward's taps: 6 channels x 2 output rows x 32 columns, per tap 4 loads and 6 broadcast weights
// for 24 FMAs.
template <bool kRoundBf16>
void forward_pool2x2_t(const DirectGeom& g, const float* xp, const float* wp, const float* bias, float* pooled,
                       uint8_t* argmax, int ocn, int64_t ph, int64_t pw) {
  constexpr int kOcb = kDirectPoolOcb;
  direct_avx512::forward_pool2x2<kRoundBf16>(
      bias, pooled, argmax, ocn, ph, pw, [&](__m512 (&acc)[kOcb][2][2], int64_t py, int64_t px0) {
        const float* w = wp;
        for (int64_t c = 0; c < g.c; ++c)
          for (int64_t i = 0; i < g.kh; ++i) {
            const float* row0 = xp + (c * g.hp + 2 * py + i) * g.wp + 2 * px0;
            const float* row1 = row0 + g.wp;
            for (int64_t j = 0; j < g.kw; ++j, w += kOcb) {
              const __m512 x00 = _mm512_loadu_ps(row0 + j), x01 = _mm512_loadu_ps(row0 + j + 16);
              const __m512 x10 = _mm512_loadu_ps(row1 + j), x11 = _mm512_loadu_ps(row1 + j + 16);
#pragma GCC unroll 6
              for (int o = 0; o < kOcb; ++o) {
                const __m512 b = _mm512_set1_ps(w[o]);
                acc[o][0][0] = _mm512_fmadd_ps(b, x00, acc[o][0][0]);
                acc[o][0][1] = _mm512_fmadd_ps(b, x01, acc[o][0][1]);
                acc[o][1][0] = _mm512_fmadd_ps(b, x10, acc[o][1][0]);
                acc[o][1][1] = _mm512_fmadd_ps(b, x11, acc[o][1][1]);
              }
            }
          }
      });
}

void forward_pool2x2(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool round_bf16,
                     float* pooled, uint8_t* argmax, int ocn, int64_t ph, int64_t pw) {
  if (round_bf16) return forward_pool2x2_t<true>(g, xp, wp, bias, pooled, argmax, ocn, ph, pw);
  forward_pool2x2_t<false>(g, xp, wp, bias, pooled, argmax, ocn, ph, pw);
}

void columns(const DirectGeom& g, const float* xp, float* col) {
  for_each_column_row(g, xp, col, [&](const float* src, float* out) {
    int64_t ox = 0;
    for (; ox + 16 <= g.ow; ox += 16) _mm512_storeu_ps(out + ox, _mm512_loadu_ps(src + ox));
    if (ox < g.ow) {
      const __mmask16 m = static_cast<__mmask16>((1u << (g.ow - ox)) - 1u);
      _mm512_mask_storeu_ps(out + ox, m, _mm512_maskz_loadu_ps(m, src + ox));
    }
  });
}

// col in f16 from a padded image whose f32 values are widened f16 (exact both ways).
void columns_f16(const DirectGeom& g, const float* xp, Half* col) {
  for_each_column_row(g, xp, col, [&](const float* src, Half* out) {
    for (int64_t ox = 0; ox < g.ow; ox += 16) {
      const int64_t n = std::min<int64_t>(16, g.ow - ox);
      VecAvx512::store_n(out + ox, _mm512_maskz_loadu_ps(VecAvx512::tail_mask(n), src + ox), n);
    }
  });
}

// 16 positions of a column from p on (m: those that exist; the others 0).
inline __m512 load_col(const float* col, __mmask16 m) { return _mm512_maskz_loadu_ps(m, col); }
inline __m512 load_col(const Half* col, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, col)); }

// A tile of 4 output channels x KB taps: 4 + KB loads per 4 * KB FMAs, over the positions in 16-lane vectors.
template <int KB, typename TC>
void dot_tile(const float* dz, const TC* col, int64_t positions, float* lanes, int64_t k) {
  // Every loop over acc by constant bounds and unrolled, so that it lives in registers only.
  __m512 acc[4][KB];
#pragma GCC unroll 4
  for (int o = 0; o < 4; ++o)
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) acc[o][t] = _mm512_loadu_ps(lanes + (o * k + t) * 16);
  for (int64_t p = 0; p < positions; p += 16) {
    const __mmask16 m = positions - p >= 16 ? static_cast<__mmask16>(0xFFFF)
                                            : static_cast<__mmask16>((1u << (positions - p)) - 1u);
    __m512 d[4];
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) d[o] = _mm512_maskz_loadu_ps(m, dz + o * positions + p);
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) {
      const __m512 x = load_col(col + t * positions + p, m);
#pragma GCC unroll 4
      for (int o = 0; o < 4; ++o) acc[o][t] = _mm512_fmadd_ps(d[o], x, acc[o][t]);
    }
  }
#pragma GCC unroll 4
  for (int o = 0; o < 4; ++o)
#pragma GCC unroll 6
    for (int t = 0; t < KB; ++t) _mm512_storeu_ps(lanes + (o * k + t) * 16, acc[o][t]);
}

template <typename TC>
void dot_rows_t(const float* dz, const TC* col, int64_t oc, int64_t k, int64_t positions, float* lanes,
                int64_t lanes_k, float* db_lanes) {
  using DotTile = void (*)(const float*, const TC*, int64_t, float*, int64_t);
  constexpr DotTile kDotTiles[7] = {nullptr,         dot_tile<1, TC>, dot_tile<2, TC>, dot_tile<3, TC>,
                                    dot_tile<4, TC>, dot_tile<5, TC>, dot_tile<6, TC>};
  int64_t o = 0;
  for (; o + 4 <= oc; o += 4)
    for (int64_t t = 0; t < k; t += 6)
      kDotTiles[std::min<int64_t>(6, k - t)](dz + o * positions, col + t * positions, positions,
                                             lanes + (o * lanes_k + t) * 16, lanes_k);
  for (; o < oc; ++o)  // the last channels, one at a time
    for (int64_t t = 0; t < k; ++t) {
      __m512 acc = _mm512_loadu_ps(lanes + (o * lanes_k + t) * 16);
      for (int64_t p = 0; p < positions; p += 16) {
        const __mmask16 m = positions - p >= 16 ? static_cast<__mmask16>(0xFFFF)
                                                : static_cast<__mmask16>((1u << (positions - p)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, dz + o * positions + p), load_col(col + t * positions + p, m),
                              acc);
      }
      _mm512_storeu_ps(lanes + (o * lanes_k + t) * 16, acc);
    }
  if (!db_lanes) return;
  for (o = 0; o < oc; ++o) {
    __m512 acc = _mm512_loadu_ps(db_lanes + o * 16);
    for (int64_t p = 0; p < positions; p += 16) {
      const __mmask16 m = positions - p >= 16 ? static_cast<__mmask16>(0xFFFF)
                                              : static_cast<__mmask16>((1u << (positions - p)) - 1u);
      acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, dz + o * positions + p));
    }
    _mm512_storeu_ps(db_lanes + o * 16, acc);
  }
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_avx512() {
  static const DirectConvKernels k = [] {
    DirectConvKernels t{"avx512", forward, columns, dot_rows_t<float>, forward_pool2x2};
    t.columns_f16 = columns_f16;
    t.dot_rows_f16 = dot_rows_t<Half>;
    return t;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
