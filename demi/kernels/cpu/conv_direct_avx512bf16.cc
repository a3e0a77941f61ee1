// The AVX512-BF16 pieces of the direct convolution (internal/conv_direct_kernels.h): where the image and the
// gradient are both bf16, the weight gradient's dot products run vdpbf16ps on consecutive positions taken in
// pairs (each instruction two positions of 16 lanes into f32 accumulators: twice the FMA kernel's rate, half
// its bytes), on columns kept in bf16; where the image and the weights are both bf16, the forward tiles
// (plain and fused with the 2x2 max pool, internal/conv_direct_avx512_impl.h) take the taps in pairs the
// same way. Everything else is the AVX-512 table's.
//
// vdpbf16ps multiplies exactly and adds in f32, but takes bf16 subnormals (below 1.2e-38) as zero, as demi's
// bf16 GEMM kernel does: a loss-scaled gradient is never that small, and in the forward an image or weight
// value that small counts as 0 (its products would be below 1.2e-38 times the other factor).
#include <algorithm>
#include <cstring>

#include "demi/kernels/cpu/internal/vec_avx512.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/conv_direct_avx512_impl.h"
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

// col (K, OH * OW) in bf16 from the padded image, whose f32 values are widened bf16: the top halves
// (direct_avx512::narrow_row_bf16: 32 positions at a time by one word permute, where a shift and a
// narrowing store took 16; it made model A's first-layer backward at O2-bf16 faster, before its columns
// were built once per image; `demi train --profile` times that backward).
void columns_bf16(const DirectGeom& g, const float* xp, BFloat16* col) {
  for_each_column_row(g, xp, col,
                      [&](const float* src, BFloat16* out) { direct_avx512::narrow_row_bf16(src, out, g.ow); });
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

// The forward's pairs of taps (pair_plan). A tap's 16 positions come from the padded image's f32 row, whose
// values are widened bf16 (their top halves, exactly). Neighbours in a row are one load of the pair image
// (position q: q's bf16 in the low half, q + 1's in the high half); other pairs are built from two rows by
// one shift and one word blend, a tap alone with +0 in the high half.
inline __m512bh x_pair(const float* t0, const float* t1) {
  const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(t0)), 16);
  return as_bh(_mm512_mask_blend_epi16(0x55555555u, _mm512_castps_si512(_mm512_loadu_ps(t1)), lo));
}
inline __m512bh x_single(const float* t0) {
  return as_bh(_mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(t0)), 16));
}
inline __m512bh x_neighbours(const uint32_t* q) { return as_bh(_mm512_loadu_si512(q)); }
inline __m512bh w_pair(uint32_t w) { return as_bh(_mm512_set1_epi32(static_cast<int>(w))); }

void pair_image(const float* xp, int64_t n, uint32_t* xq) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t q = 0;
  for (; q + 17 <= n; q += 16) {
    const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(xp + q)), 16);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(xp + q + 1)), high);
    _mm512_storeu_si512(xq + q, _mm512_or_si512(lo, hi));
  }
  for (; q < n; ++q) {
    uint32_t lo, hi = 0;
    std::memcpy(&lo, xp + q, 4);
    if (q + 1 < n) std::memcpy(&hi, xp + q + 1, 4);
    xq[q] = (lo >> 16) | (hi & 0xFFFF0000u);
  }
}

// Each pair s's vectors, read at xb / qb (the padded and pair images at the tile's first output; + stride per
// output row, + 16 per vector), go to mul(x, s): the neighbours as loads of the pair image, then the pairs
// built from two rows, then the tap alone. Three loops, so that none of them carries the others'
// temporaries (one loop with all three cases spilled accumulators to the stack).
template <int NV, class Mul>
inline void pairs_loop(const PairPlan& pp, const float* xb, const uint32_t* qb, int64_t stride, Mul&& mul) {
  const auto at = [&](int v) { return (v / 2) * stride + 16 * (v % 2); };
  int s = 0;
  for (; s < pp.neighbours; ++s) {
    __m512bh x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = x_neighbours(qb + pp.off0[s] + at(v));
    mul(x, s);
  }
  for (; s < pp.built_end; ++s) {
    __m512bh x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = x_pair(xb + pp.off0[s] + at(v), xb + pp.off1[s] + at(v));
    mul(x, s);
  }
  for (; s < pp.n; ++s) {
    __m512bh x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = x_single(xb + pp.off0[s] + at(v));
    mul(x, s);
  }
}

template <int NV>
void forward_row_pairs(const DirectGeom& g, const PairPlan& pp, const float* xp, const uint32_t* xq,
                       const uint32_t* wpairs, const float* bias, bool relu, float* y, int ocn, int64_t oy,
                       int64_t ox0, int64_t cols) {
  direct_avx512::forward_row<NV>(g, bias, relu, y, ocn, oy, ox0, cols, [&](__m512 (&acc)[kDirectOcb][NV]) {
    const int64_t base = oy * g.wp + ox0;
    pairs_loop<NV>(pp, xp + base, xq + base, 0, [&](const __m512bh (&x)[NV], int s) {  // (NV <= 2: one row)
      const uint32_t* w = wpairs + s * kDirectOcb;
#pragma GCC unroll 12
      for (int o = 0; o < kDirectOcb; ++o) {
        const __m512bh b = w_pair(w[o]);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_dpbf16_ps(acc[o][v], x[v], b);
      }
    });
  });
}

void forward_pairs(const DirectGeom& g, const PairPlan& pp, const float* xp, const uint32_t* xq,
                   const uint32_t* wpairs, const float* bias, bool relu, float* y, int ocn) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox0 = 0; ox0 < g.ow; ox0 += 32) {
      const int64_t cols = std::min<int64_t>(32, g.ow - ox0);
      if (cols > 16)
        forward_row_pairs<2>(g, pp, xp, xq, wpairs, bias, relu, y, ocn, oy, ox0, cols);
      else
        forward_row_pairs<1>(g, pp, xp, xq, wpairs, bias, relu, y, ocn, oy, ox0, cols);
    }
}

// The fused forward's pairs: 6 channels x 2 output rows x 32 columns, per pair of taps 4 vectors (loads of
// the pair image for neighbours; else 8 loads, 4 shifts and 4 blends) and 6 broadcast weight pairs for 24
// vdpbf16ps (the FMA tile: 8 loads, 12 broadcasts, 48 FMAs).
template <bool kRoundBf16>
void forward_pool2x2_pairs_t(const DirectGeom& g, const PairPlan& pp, const float* xp, const uint32_t* xq,
                             const uint32_t* wpairs, const float* bias, float* pooled, uint8_t* argmax, int ocn,
                             int64_t ph, int64_t pw) {
  constexpr int kOcb = kDirectPoolOcb;
  direct_avx512::forward_pool2x2<kRoundBf16>(
      bias, pooled, argmax, ocn, ph, pw, [&](__m512 (&acc)[kOcb][2][2], int64_t py, int64_t px0) {
        const int64_t base = 2 * py * g.wp + 2 * px0;
        // x[2 r + v]: output row r, vector v.
        pairs_loop<4>(pp, xp + base, xq + base, g.wp, [&](const __m512bh (&x)[4], int s) {
          const uint32_t* w = wpairs + s * kOcb;
#pragma GCC unroll 6
          for (int o = 0; o < kOcb; ++o) {
            const __m512bh b = w_pair(w[o]);
            acc[o][0][0] = _mm512_dpbf16_ps(acc[o][0][0], x[0], b);
            acc[o][0][1] = _mm512_dpbf16_ps(acc[o][0][1], x[1], b);
            acc[o][1][0] = _mm512_dpbf16_ps(acc[o][1][0], x[2], b);
            acc[o][1][1] = _mm512_dpbf16_ps(acc[o][1][1], x[3], b);
          }
        });
      });
}

void forward_pool2x2_pairs(const DirectGeom& g, const PairPlan& pp, const float* xp, const uint32_t* xq,
                           const uint32_t* wpairs, const float* bias, bool round_bf16, float* pooled, uint8_t* argmax,
                           int ocn, int64_t ph, int64_t pw) {
  if (round_bf16) return forward_pool2x2_pairs_t<true>(g, pp, xp, xq, wpairs, bias, pooled, argmax, ocn, ph, pw);
  forward_pool2x2_pairs_t<false>(g, pp, xp, xq, wpairs, bias, pooled, argmax, ocn, ph, pw);
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_avx512bf16() {
  static const DirectConvKernels k = [] {
    DirectConvKernels t = direct_conv_kernels_avx512();
    t.name = "avx512_bf16";
    t.columns_bf16 = columns_bf16;
    t.dot_rows_bf16 = dot_rows_bf16;
    t.pair_image = pair_image;
    t.forward_pairs = forward_pairs;
    t.forward_pool2x2_pairs = forward_pool2x2_pairs;
    return t;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
