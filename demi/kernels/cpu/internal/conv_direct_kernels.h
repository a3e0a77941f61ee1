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
//         the lanes only at the end;
//   the tile unit's (AMX), TileGeom:
//   taps  the forward's B matrix: (fwd_slots / 2, Q) 32-bit words, word (s, q) = the bf16 of taps 2s and
//         2s + 1 at position q = oy * WP + ox (the padded width: a tap's values are one run of xp from its
//         offset), low and high half; 0 past the K taps;
//   wt    the forward's A matrix: (OCP, fwd_slots) bf16, 0 past OC and past K;
//   tcol  the weight gradient's A matrix for CP of the positions from p0 (a chunk: TileGeom::cp):
//         (grad_slots, CP) bf16, row k < K tap k at the dense positions oy * OW + ox, row K 1.0 (its sums are
//         the bias gradient's), 0 past P = OH * OW and past row K;
//   dzt   the weight gradient's B matrix, per 16 output channels: PP / 2 rows of 16 words (VNNI-2: the
//         channel's positions 2r, 2r + 1), 0 past P and past OC;
//   an f16 weight gradient's (weight_sums_tiles_f16), each f16 value split exactly into bf16 hi + lo
//   (../f16_split.h): the padded image's hi and lo parts (image_split_values each), then for SR output rows
//   at a time (TileGeom: positions r * WQ + ox, SP of them) tcol's hi and lo parts (grad_slots, SP) each,
//   copied from them (0 past OW), then dz's hi and lo parts laid out as dzt for those SP positions (0 past
//   OW), OC / 16 blocks (rounded up) of SP / 2 rows of 16 words each.
#pragma once

#include <algorithm>
#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kDirectOcb = 12;      // output channels per forward tile (12 x 2 vectors = 24 zmm)
inline constexpr int kDirectPoolOcb = 6;   // per fused forward tile (6 x 2 rows x 2 vectors)
// (the tile unit's forward reads a tap's run up to KW + 62 floats past the last plane: K <= 64)
inline constexpr int64_t kDirectSlack = 160;

struct DirectGeom {
  int64_t c = 0, kh = 0, kw = 0;  // input channels and kernel
  int64_t hp = 0, wp = 0;         // the padded image
  int64_t oh = 0, ow = 0;         // output (stride 1, dilation 1: OH = HP - KH + 1)
  int64_t k = 0;                  // C * KH * KW
};

// Tap t = (c, i, j)'s offset in the padded image from its output position.
inline int64_t tap_offset(const DirectGeom& g, int64_t t) {
  return ((t / g.kw / g.kh) * g.hp + t / g.kw % g.kh) * g.wp + t % g.kw;
}

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
    pp.tap0[pp.n] = static_cast<int8_t>(t0);
    pp.tap1[pp.n] = static_cast<int8_t>(t1);
    pp.off0[pp.n] = tap_offset(g, t0);
    pp.off1[pp.n] = t1 < 0 ? -1 : tap_offset(g, t1);
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

// The tile unit's padded sizes (taps, output channels, positions) for a layer of OC output channels.
struct TileGeom {
  int64_t fwd_slots = 0;   // the forward's tap slots: K rounded up to 32 (one tile step of k)
  int64_t grad_slots = 0;  // the weight gradient's: K + 1 (the bias's row) rounded up to 32
  int64_t ocp = 0;         // output channels rounded up to 32 (a 2 x 2 block of C tiles)
  int64_t q = 0;           // forward positions: OH rows at the padded width WP, rounded up to 32, and a block
                           // of 32 more (the fused pool's reads past the last row)
  int64_t pp = 0;          // weight-gradient positions: OH * OW rounded up to 32
  int64_t cp = 0;          // the weight gradient's columns per chunk of positions: min(PP, kTileColumnChunk)
  // An f16 weight gradient's (weight_sums_tiles_f16) positions: output row oy's at oy * WQ, WQ = OW rounded up
  // to 32 (so that 32 positions are one load of an image row and of a dz row); SR rows at a time, SP = SR * WQ
  // positions per chunk.
  int64_t wq = 0, sr = 0, sp = 0;
};

// Positions of the weight gradient's columns built at a time (32 KiB of them at 32 slots): the columns of a
// whole image were most of the layer's scratch at model A's O2 training peak (32 x 928 bf16 per thread).
// The sums go chunk by chunk in the same order of tile steps, so the chunk changes no bit. (Chunks of 256
// measured 5% slower on model A's first layer, 512 as fast as whole images.)
inline constexpr int64_t kTileColumnChunk = 512;
// Positions of an f16 weight gradient's operands split at a time (whole output rows, at least one): its
// columns and dz, hi and lo parts, are built a chunk at a time from the image and dz's f16 rows, so that they
// stay in L1 (and out of the training peak) while the tile unit multiplies them.
inline constexpr int64_t kTileSplitChunk = 128;

inline TileGeom tile_geom(const DirectGeom& g, int64_t oc) {
  const auto up32 = [](int64_t v) { return (v + 31) / 32 * 32; };
  const int64_t pp = up32(g.oh * g.ow);
  const int64_t wq = up32(g.ow), sr = std::max<int64_t>(1, std::min(g.oh, kTileSplitChunk / wq));
  return {up32(g.k), up32(g.k + 1), up32(oc),  up32(g.oh * g.wp) + 32, pp, std::min(pp, kTileColumnChunk),
          wq,        sr,            sr * wq};
}

// An f16 weight gradient's split image (weight_sums_tiles_f16): the padded image's values, hi and lo parts
// this many each (C * HP * WP rounded up to 32, within xp's slack).
inline int64_t image_split_values(const DirectGeom& g) { return (g.c * g.hp * g.wp + 31) / 32 * 32; }

// Bytes of the scratch weight_sums_tiles_f16 takes (`split`).
inline int64_t split_scratch_bytes(const DirectGeom& g, const TileGeom& t) {
  return (2 * image_split_values(g) + 2 * (t.grad_slots + t.ocp) * t.sp) * 2;
}

// The fused pool's chunks on the tile unit (DirectConvKernels::forward_pool2x2_tiles): a few pooled rows at
// a time, their sums (OCP x their positions, whole blocks of 32 with up to 96 of alignment and read-ahead)
// within 32 KiB where one row pair allows, so that they stay in L1 until pooled.
struct TilePoolChunk {
  int64_t rows = 0;    // pooled rows per chunk
  int64_t floats = 0;  // the most sums one chunk holds
};

inline TilePoolChunk tile_pool_chunk(const DirectGeom& g, const TileGeom& t) {
  constexpr int64_t kChunkFloats = (int64_t{32} << 10) / 4;
  const int64_t rows = std::max<int64_t>(1, (kChunkFloats / t.ocp - 96) / (2 * g.wp));
  return {rows, t.ocp * (rows * 2 * g.wp + 96)};
}

// An image's dz for an f16 weight gradient on the tile unit (weight_sums_tiles_f16): its rows as given (16
// channels a block, OH * OW f16 apart), or, for the fused Conv2d -> ReLU -> 2x2 / stride-2 MaxPool2d, built
// from the pool's gradient as it is packed: dz[o][y][x] = dy[o][y / 2][x / 2] where argmax (the window's
// index, 2 (y % 2) + x % 2; any other value: none) names (y, x), else 0 — max_pool2d_backward's values, with
// no dense dz held.
struct F16Dz {
  const Half* const* rows = nullptr;  // (null: pooled)
  const Half* dy = nullptr;           // (OC, PH, PW)
  const uint8_t* argmax = nullptr;    // (OC, PH, PW)
  int64_t ph = 0, pw = 0;
};

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
  // The tile unit's (AMX only; nullptr elsewhere), for a bf16 image and bf16 weights (or dz), layouts above. Products
  // exact, summed in f32 by the tile unit (bf16 subnormals read as 0, f32 results below 2^-126 flushed to 0,
  // as vdpbf16ps does). Each output's sum depends only on its own taps and positions, in a fixed order.
  // forward_tiles: y (oc, OH, OW) = act(wt . taps + bias) (bias: OCP values), f32 or rounded once to bf16
  // (y_bf16), taps built here from xp and followed by room for the sums at the padded width (OCP, Q) f32 and
  // an f32 plane (OH * OW).
  void (*forward_tiles)(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* wt,
                        const float* bias, bool relu, uint32_t* taps, void* y, bool y_bf16, int64_t oc) = nullptr;
  // forward_pool2x2_tiles: forward_pool2x2 for all oc channels from the tile unit's sums (taps, then room
  // for tile_pool_chunk's sums): pooled (oc, PH, PW) f32 and argmax (nullable), bit for bit relu_max_pool2d_forward on
  // forward_tiles' output (in bf16 when round_bf16).
  void (*forward_pool2x2_tiles)(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* wt,
                                const float* bias, bool round_bf16, uint32_t* taps, float* pooled, uint8_t* argmax,
                                int64_t oc, int64_t ph, int64_t pw) = nullptr;
  // The weight gradient of one image: dzt (16 channels: on of them, dz's rows of `positions` bf16) packed,
  // then sums (grad_slots, OCP) += tcol . dzt^T over every 16-channel block of dzt, a chunk of CP positions
  // at a time (tcol: the chunk's columns from xp, built in the scratch given: grad_slots x CP bf16).
  void (*pack_dz_tiles)(const BFloat16* dz, int64_t on, int64_t positions, int64_t pp, BFloat16* dzt) = nullptr;
  void (*weight_sums_tiles)(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* dzt,
                            BFloat16* tcol, float* sums) = nullptr;
  // The weight gradient of one image whose values and dz are f16 (xp: the image's f16 values widened, dz:
  // F16Dz, its rows' blocks holding the last block's oc % 16 rows only): sums
  // (grad_slots, OCP) += tcol . dzt^T as weight_sums_tiles (the channels past OC untouched), each f16 value
  // split into bf16 hi + lo (exact) and each product taken as its four bf16 products (hi hi, hi lo, lo hi,
  // lo lo), exact in f32, summed in f32 by the tile unit — the f32 dot products' value up to the order of the
  // sum. Chunks of TileGeom::sr output rows, their split operands in `split` (layouts above;
  // split_scratch_bytes).
  void (*weight_sums_tiles_f16)(const DirectGeom& g, const TileGeom& t, const float* xp, const F16Dz& dz, int64_t oc,
                                BFloat16* split, float* sums) = nullptr;
};

const DirectConvKernels& direct_conv_kernels_scalar();
const DirectConvKernels& direct_conv_kernels_avx512();
const DirectConvKernels& direct_conv_kernels_avx512bf16();
const DirectConvKernels& direct_conv_kernels_amx();

}  // namespace demi::kernels::cpu_internal
