// The pieces of the direct convolution (../conv_direct.h) that differ per ISA: the forward tiles (plain, and
// fused with ReLU -> 2x2 MaxPool2d), an image's columns and the weight gradient's dot products. Blocking,
// padding, threading and the final sums are portable (../conv_direct.cc).
//
// Layouts (f32 unless said):
//   xp    one image zero-padded: (C, HP, WP), row stride WP, followed by at least kDirectSlack floats (the
//         forward and the columns load 16 or 32 columns at a time past a row's end; those lanes are dropped);
//   wp    one forward tile's weights: [K][kDirectOcb] (the fused one's [K][kDirectPoolOcb]), output channels
//         past the tile's last zero;
//   xq    the pair image (bf16 forward in pairs): xp's positions as words, each position's bf16 in the low
//         half and the next position's in the high half;
//   col   one image's columns: (K, OH * OW), row k = (c, i, j) holding xp[c, oy + i, ox + j] at oy * OW + ox;
//   lanes the weight gradient's partial sums, 16 lanes per (oc, k) (and per oc for the bias), added across
//         the lanes only at the end.
#pragma once

#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kDirectOcb = 12;      // output channels per forward tile (12 x 2 vectors = 24 zmm)
inline constexpr int kDirectPoolOcb = 6;   // per fused forward tile (6 x 2 rows x 2 vectors)
inline constexpr int64_t kDirectSlack = 64;

struct DirectGeom {
  int64_t c = 0, kh = 0, kw = 0;  // input channels and kernel
  int64_t hp = 0, wp = 0;         // the padded image
  int64_t oh = 0, ow = 0;         // output (stride 1, dilation 1: OH = HP - KH + 1)
  int64_t k = 0;                  // C * KH * KW
};

// row(src, out) for each output row of each column row k = (c, i, j): src = xp[c, oy + i, j ...], out = the
// row's OW values at col + (k * OH + oy) * OW. The columns kernels differ only in how they copy a row.
template <typename T, typename Row>
inline void for_each_column_row(const DirectGeom& g, const float* xp, T* col, Row&& row) {
  int64_t k = 0;
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j, ++k)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          row(xp + (c * g.hp + oy + i) * g.wp + j, col + (k * g.oh + oy) * g.ow);
}

// The forward's taps in pairs (DirectConvKernels::forward_pairs): first the neighbours of each row, (c, i, j)
// and (c, i, j + 1) for even j, whose pair is one load of the pair image; then the rows' last taps (KW odd)
// two at a time, built from two rows of the padded image; and one alone when those are odd in number. Each
// tap with its offset in the padded image from its output position, (c * HP + i) * WP + j.
struct PairPlan {
  int n = 0;           // pairs (at most 32: K <= 64)
  int neighbours = 0;  // pairs [0, neighbours): (t, t + 1) within one row
  int built_end = 0;   // pairs [neighbours, built_end): two rows' last taps; [built_end, n): a tap alone
  int8_t tap0[32] = {}, tap1[32] = {};  // taps (c * KH + i) * KW + j; tap1 -1: alone
  int64_t off0[32] = {}, off1[32] = {};  // their offsets (off1 -1: alone)
};

inline PairPlan pair_plan(const DirectGeom& g) {
  PairPlan pp;
  const auto add = [&](int64_t t0, int64_t t1) {
    const auto off = [&](int64_t t) { return ((t / g.kw / g.kh) * g.hp + t / g.kw % g.kh) * g.wp + t % g.kw; };
    pp.tap0[pp.n] = static_cast<int8_t>(t0);
    pp.tap1[pp.n] = static_cast<int8_t>(t1);
    pp.off0[pp.n] = off(t0);
    pp.off1[pp.n] = t1 < 0 ? -1 : off(t1);
    ++pp.n;
  };
  int64_t last[64];
  int lasts = 0;
  for (int64_t r = 0; r < g.c * g.kh; ++r) {
    int64_t j = 0;
    for (; j + 1 < g.kw; j += 2) add(r * g.kw + j, r * g.kw + j + 1);
    if (j < g.kw) last[lasts++] = r * g.kw + j;
  }
  pp.neighbours = pp.n;
  for (int l = 0; l + 1 < lasts; l += 2) add(last[l], last[l + 1]);
  pp.built_end = pp.n;
  if (lasts % 2) add(last[lasts - 1], -1);
  return pp;
}

struct DirectConvKernels {
  const char* name = nullptr;
  // y (ocn, OH, OW) f32, y's channel planes OH * OW apart, = act(conv(xp, wp) + bias) for the tile's first ocn
  // (<= kDirectOcb) channels; bias: kDirectOcb values. Each output is fma(w, x, acc) over the taps in
  // (c, i, j) order from +0, then + bias, then max(v, 0) when relu (as relu: -0 and NaN stay).
  void (*forward)(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y,
                  int ocn) = nullptr;
  // col (K, OH * OW) of the padded image xp.
  void (*columns)(const DirectGeom& g, const float* xp, float* col) = nullptr;
  // lanes (OC, K, 16) += dz (OC, P) . col (K, P)^T and db_lanes (OC, 16) += dz's rows, P = OH * OW, summed over
  // p in 16-lane vectors in order (lane l takes p = l, l + 16, ...): a fixed order, so the fused op (dz
  // rebuilt from the pool's argmax) and the separate call (dz given) give the same bits. Output channel o's
  // lanes start lanes_k * 16 floats after o - 1's (lanes_k >= k: the k rows may be some of the taps, one input
  // channel's); db_lanes null: no bias sums.
  void (*dot_rows)(const float* dz, const float* col, int64_t oc, int64_t k, int64_t positions, float* lanes,
                   int64_t lanes_k, float* db_lanes) = nullptr;
  // The fused Conv2d -> ReLU -> 2x2 / stride-2 MaxPool2d for the tile's first ocn (<= kDirectPoolOcb)
  // channels: pooled (ocn, PH, PW) f32 and argmax (nullable) exactly as relu_max_pool2d_forward gives them on
  // forward()'s output (rounded to bf16 first when round_bf16); nullptr where a level has none (the driver
  // then pools forward()'s output).
  void (*forward_pool2x2)(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool round_bf16,
                          float* pooled, uint8_t* argmax, int ocn, int64_t ph, int64_t pw) = nullptr;
  // Where the image and dz are both bf16 (AVX512-BF16 only; nullptr elsewhere): col (K, OH * OW) in bf16, and
  // dot_rows on bf16 rows, positions taken in consecutive pairs (vdpbf16ps): another fixed order.
  void (*columns_bf16)(const DirectGeom& g, const float* xp, BFloat16* col) = nullptr;
  void (*dot_rows_bf16)(const BFloat16* dz, const BFloat16* col, int64_t oc, int64_t k, int64_t positions,
                        float* lanes, int64_t lanes_k, float* db_lanes) = nullptr;
  // Where the image and the weights are both bf16 (AVX512-BF16 only; nullptr elsewhere): forward and
  // forward_pool2x2 with the taps taken in pairs by vdpbf16ps (twice the FMA tile's multiply-adds per
  // instruction), in plan's order (pair_plan(g)). xq: pair_image(xp). wpairs: the tile's weights as [pairs][ocb]
  // words, the pair's first tap's bf16 in the low half and its second's (+0 for a tap alone) in the high half.
  // Another fixed order, the same in both: each output is dpbf16(acc, x pair, w pair) over the pairs from +0
  // (products exact, sums in f32, bf16 subnormals read as 0), then + bias and the epilogue as above.
  void (*pair_image)(const float* xp, int64_t n, uint32_t* xq) = nullptr;
  void (*forward_pairs)(const DirectGeom& g, const PairPlan& plan, const float* xp, const uint32_t* xq,
                        const uint32_t* wpairs, const float* bias, bool relu, float* y, int ocn) = nullptr;
  void (*forward_pool2x2_pairs)(const DirectGeom& g, const PairPlan& plan, const float* xp, const uint32_t* xq,
                                const uint32_t* wpairs, const float* bias, bool round_bf16, float* pooled,
                                uint8_t* argmax, int ocn, int64_t ph, int64_t pw) = nullptr;
  // Where the image is f16 (nullptr where a level has none: the driver then takes f32 columns): col in f16
  // (the image's values, exactly: half the bytes of f32 columns), and dot_rows reading them widened, in
  // dot_rows' order: the same sums, bit for bit.
  void (*columns_f16)(const DirectGeom& g, const float* xp, Half* col) = nullptr;
  void (*dot_rows_f16)(const float* dz, const Half* col, int64_t oc, int64_t k, int64_t positions, float* lanes,
                       int64_t lanes_k, float* db_lanes) = nullptr;
};

const DirectConvKernels& direct_conv_kernels_scalar();
const DirectConvKernels& direct_conv_kernels_avx512();
const DirectConvKernels& direct_conv_kernels_avx512bf16();

}  // namespace demi::kernels::cpu_internal
