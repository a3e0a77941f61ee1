// The AVX-512 pieces of the direct convolution (internal/conv_direct_kernels.h): the forward tile (12 output
// channels x up to 32 columns of one output row in 24 zmm accumulators; per tap 2 loads of the padded input
// row and 12 broadcast weights for 24 FMAs), the transposed columns by 16 x 16 register transposes, and the
// weight-gradient accumulation over compressed lists of nonzero gradients.
#include <algorithm>

#include "demi/kernels/cpu/internal/conv_direct_kernels.h"
#include "demi/kernels/cpu/internal/gemm_avx512_impl.h"

namespace demi::kernels::cpu_internal {
namespace {

// Columns ox0 .. ox0 + 16 * NV - 1 of output row oy for the tile's channels; `cols` of them are stored.
template <int NV>
void forward_row(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y,
                 int ocn, int64_t oy, int64_t ox0, int64_t cols) {
  __m512 acc[kDirectOcb][NV];
#pragma GCC unroll 12
  for (int o = 0; o < kDirectOcb; ++o)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_setzero_ps();
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
  const __m512 zero = _mm512_setzero_ps();
  for (int o = 0; o < ocn; ++o) {
    float* out = y + (o * g.oh + oy) * g.ow + ox0;
    const __m512 b = _mm512_set1_ps(bias[o]);
    for (int v = 0; v < NV; ++v) {
      const int64_t n = std::min<int64_t>(16, cols - 16 * v);
      if (n <= 0) break;
      __m512 r = _mm512_add_ps(acc[o][v], b);
      if (relu) r = _mm512_max_ps(zero, r);  // zero first: -0 and NaN pass as relu(v) = v < 0 ? 0 : v keeps them
      _mm512_mask_storeu_ps(out + 16 * v, static_cast<__mmask16>((1u << n) - 1u), r);
    }
  }
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

void columns(const DirectGeom& g, const float* xp, float* colT) {
  __m512 r[16];
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t kb = 0; kb < g.kpad; kb += 16)
      for (int64_t ox0 = 0; ox0 < g.ow; ox0 += 16) {
        for (int t = 0; t < 16; ++t) {
          const int64_t k = kb + t;
          if (k >= g.k) {
            r[t] = _mm512_setzero_ps();
            continue;
          }
          const int64_t c = k / (g.kh * g.kw), i = k / g.kw % g.kh, j = k % g.kw;
          r[t] = _mm512_loadu_ps(xp + (c * g.hp + oy + i) * g.wp + ox0 + j);
        }
        gemm512::transpose16(r);
        const int64_t cols = std::min<int64_t>(16, g.ow - ox0);
        for (int64_t t = 0; t < cols; ++t) _mm512_storeu_ps(colT + (oy * g.ow + ox0 + t) * g.kpad + kb, r[t]);
      }
}

template <int NV>
void accumulate_n(const float* colT, int64_t kpad, const int32_t* pos, const float* val, int64_t count, float* dw) {
  __m512 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_loadu_ps(dw + 16 * v);
  for (int64_t i = 0; i < count; ++i) {
    const float* col = colT + static_cast<int64_t>(pos[i]) * kpad;
    const __m512 gv = _mm512_set1_ps(val[i]);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_fmadd_ps(gv, _mm512_loadu_ps(col + 16 * v), acc[v]);
  }
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dw + 16 * v, acc[v]);
}

void accumulate(const float* colT, int64_t kpad, const int32_t* pos, const float* val, int64_t count, float* dw) {
  switch (kpad / 16) {
    case 1: return accumulate_n<1>(colT, kpad, pos, val, count, dw);
    case 2: return accumulate_n<2>(colT, kpad, pos, val, count, dw);
    case 3: return accumulate_n<3>(colT, kpad, pos, val, count, dw);
    default: return accumulate_n<4>(colT, kpad, pos, val, count, dw);  // kDirectMaxK = 64
  }
}

int64_t nonzeros(const float* row, int64_t n, int32_t* pos, float* val) {
  int64_t count = 0;
  const __m512 zero = _mm512_setzero_ps();
  const __m512i step = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __mmask16 in = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(in, row + i);
    const __mmask16 m = _mm512_mask_cmp_ps_mask(in, v, zero, _CMP_NEQ_UQ);  // NaN counts as nonzero
    // Compressed in registers and stored whole (a compressing store to memory is microcoded on AMD cores):
    // the lists have 16 entries of room past their last.
    _mm512_storeu_si512(pos + count, _mm512_maskz_compress_epi32(m, idx));
    _mm512_storeu_ps(val + count, _mm512_maskz_compress_ps(m, v));
    count += __builtin_popcount(m);
  }
  return count;
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_avx512() {
  static const DirectConvKernels k{"avx512", forward, columns, accumulate, nonzeros};
  return k;
}

}  // namespace demi::kernels::cpu_internal
