// AVX-512 bodies of the strided pooling kernels (pool.h): 16 channels at a time from a layout whose channels
// are contiguous (NHWC, nChw16c). Forward: the window's maximum and its position per lane with the
// reference's tie and NaN rules, then ReLU; the 16 results go to their NCHW planes. Backward: each window's
// kh x kw positions are written (the selected one gets dy, the others 0) when the windows tile dx exactly,
// so no separate zeroing pass is needed; otherwise only the selected positions (dx was zeroed).
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/cpu/internal/pool_strided_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal {
namespace {

using V = VecAvx512;

// Tiles of 16 channels x 16 output columns move between the conv layout (16 channels per vector) and
// NCHW (16 columns per vector) through a transpose in registers (VecAvx512::transpose16): 32 gathers a
// tile, values and window indices, took most of model A's pooling after oneDNN's bf16 convolution.

template <typename TX, typename TY>
void forward_rows(const Pool2dParams& p, const TX* x, const StridedLayout4& xl, TY* y, uint8_t* argmax, int64_t r0,
                  int64_t r1) {
  const int64_t plane = p.oh * p.ow, kk = p.kh * p.kw;
  const __m512i none = _mm512_set1_epi32(kArgmaxNone);
  __m512 tv[16];  // [ox] = the 16 channels' values at column ox of the tile
  __m512 ta[16];  // [ox] = their window indices (int32 lanes)
  for (int j = 0; j < 16; ++j) tv[j] = ta[j] = _mm512_setzero_ps();  // (columns past `cols` are not stored)
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.oh, oy = r % p.oh;
    for (int64_t c0 = 0; c0 < p.c; c0 += 16) {
      for (int64_t ox0 = 0; ox0 < p.ow; ox0 += 16) {
        const int64_t cols = p.ow - ox0 < 16 ? p.ow - ox0 : 16;
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t ox = ox0 + j;
          const TX* base = x + xl.offset(n, c0, oy * p.sh, ox * p.sw);
          __m512 best = V::load(base);
          __m512i at = _mm512_setzero_si512();
          // A later value wins where it is not <= the best so far (greater, or NaN) and the best is not NaN.
          __mmask16 best_ordered = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
          for (int64_t k = 1; k < kk; ++k) {
            const __m512 v = V::load(base + (k / p.kw) * xl.sh + (k % p.kw) * xl.sw);
            const __mmask16 take = _mm512_mask_cmp_ps_mask(best_ordered, v, best, _CMP_NLE_UQ);
            best = _mm512_mask_mov_ps(best, take, v);
            at = _mm512_mask_mov_epi32(at, take, _mm512_set1_epi32(static_cast<int>(k)));
            best_ordered = _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
          }
          const __mmask16 pos = _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_GT_OQ);
          const __mmask16 neg = _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_LT_OQ);
          tv[j] = _mm512_mask_blend_ps(neg, best, _mm512_setzero_ps());
          ta[j] = _mm512_castsi512_ps(_mm512_mask_blend_epi32(pos, none, at));
        }
        // Transpose: channel l's row of `cols` outputs is column l of the tile.
        const int64_t o = (n * p.c + c0) * plane + oy * p.ow + ox0;
        // (In place: a later tile overwrites only its `cols` columns; the rest reach only lanes not stored.)
        V::transpose16(tv);
        for (int l = 0; l < 16; ++l) V::store_n(y + o + l * plane, tv[l], cols);
        if (argmax) {
          V::transpose16(ta);
          for (int l = 0; l < 16; ++l)
            _mm_mask_storeu_epi8(argmax + o + l * plane, static_cast<__mmask16>((1u << cols) - 1u),
                                 _mm512_cvtepi32_epi8(_mm512_castps_si512(ta[l])));
        }
      }
    }
  }
}

template <typename TDY, typename TDX>
void backward_rows(const Pool2dParams& p, const TDY* dy, const uint8_t* argmax, TDX* dx, const StridedLayout4& dxl,
                   bool tiles, int64_t r0, int64_t r1) {
  const int64_t plane = p.oh * p.ow, kk = p.kh * p.kw;
  __m512 tg[16];  // [channel] = dy's 16 columns of the tile, then (transposed) [ox] = the 16 channels' dy
  __m512 ta[16];  // the same of the window indices (int32 lanes)
  alignas(64) float g[16];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.oh, oy = r % p.oh;
    for (int64_t c0 = 0; c0 < p.c; c0 += 16) {
      for (int64_t ox0 = 0; ox0 < p.ow; ox0 += 16) {
        const int64_t cols = p.ow - ox0 < 16 ? p.ow - ox0 : 16;
        const __mmask16 m = static_cast<__mmask16>((1u << cols) - 1u);
        const int64_t o = (n * p.c + c0) * plane + oy * p.ow + ox0;
        for (int l = 0; l < 16; ++l) {
          tg[l] = V::load_n(dy + o + l * plane, cols);
          ta[l] = _mm512_castsi512_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, argmax + o + l * plane)));
        }
        V::transpose16(tg);
        V::transpose16(ta);
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t ox = ox0 + j;
          const __m512 gv = tg[j];
          const __m512i av = _mm512_castps_si512(ta[j]);
          TDX* base = dx + dxl.offset(n, c0, oy * p.sh, ox * p.sw);
          for (int64_t k = 0; k < kk; ++k) {
            const __mmask16 sel = _mm512_cmpeq_epi32_mask(av, _mm512_set1_epi32(static_cast<int>(k)));
            if (!tiles && sel == 0) continue;
            TDX* dst = base + (k / p.kw) * dxl.sh + (k % p.kw) * dxl.sw;
            if (tiles) {
              V::store(dst, _mm512_maskz_mov_ps(sel, gv));
            } else {
              _mm512_store_ps(g, gv);
              for (int l = 0; l < 16; ++l)
                if (sel >> l & 1) dst[l] = TDX(g[l]);
            }
          }
        }
      }
    }
  }
}

}  // namespace

void relu_max_pool_strided_rows_avx512(const Pool2dParams& p, DType x_dtype, const void* x,
                                       const StridedLayout4& xl, DType y_dtype, void* y, uint8_t* argmax,
                                       int64_t r0, int64_t r1) {
  visit_float<V>(x_dtype, [&](auto tx) {
    visit_float<V>(y_dtype, [&](auto ty) {
      using TX = decltype(tx);
      using TY = decltype(ty);
      forward_rows(p, static_cast<const TX*>(x), xl, static_cast<TY*>(y), argmax, r0, r1);
    });
  });
}

void max_pool_backward_strided_rows_avx512(const Pool2dParams& p, DType dy_dtype, const void* dy,
                                           const uint8_t* argmax, DType dx_dtype, void* dx,
                                           const StridedLayout4& dxl, bool tiles, int64_t r0, int64_t r1) {
  visit_float<V>(dy_dtype, [&](auto tdy) {
    visit_float<V>(dx_dtype, [&](auto tdx) {
      using TDY = decltype(tdy);
      using TDX = decltype(tdx);
      backward_rows(p, static_cast<const TDY*>(dy), argmax, static_cast<TDX*>(dx), dxl, tiles, r0, r1);
    });
  });
}

const PoolStridedKernels& pool_strided_kernels_avx512() {
  static const PoolStridedKernels k{relu_max_pool_strided_rows_avx512, max_pool_backward_strided_rows_avx512};
  return k;
}

}  // namespace demi::kernels::cpu_internal
