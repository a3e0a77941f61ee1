// The pieces of the direct convolution (../conv_direct.h) that differ per ISA: the forward tile, the
// transposed columns of an image and the weight-gradient accumulation. Blocking, padding, threading and the
// lists of nonzero gradients are portable (../conv_direct.cc).
//
// Layouts (f32 throughout):
//   xp    one image zero-padded: (C, HP, WP), row stride WP, followed by at least kDirectSlack floats (the
//         forward and the columns load 16 or 32 columns at a time past a row's end; those lanes are dropped);
//   wp    one forward tile's weights: [K][kDirectOcb], output channels past the tile's last zero;
//   colT  one image's columns transposed: (OH * OW, KPAD), KPAD = K rounded up to 16, zero past K.
#pragma once

#include <cstdint>

namespace demi::kernels::cpu_internal {

inline constexpr int kDirectOcb = 12;      // output channels per forward tile (12 x 2 vectors = 24 zmm)
inline constexpr int64_t kDirectSlack = 64;

struct DirectGeom {
  int64_t c = 0, kh = 0, kw = 0;  // input channels and kernel
  int64_t hp = 0, wp = 0;         // the padded image
  int64_t oh = 0, ow = 0;         // output (stride 1, dilation 1: OH = HP - KH + 1)
  int64_t k = 0, kpad = 0;        // C * KH * KW and it rounded up to 16
};

struct DirectConvKernels {
  const char* name = nullptr;
  // y (ocn, OH, OW) f32, y's channel planes OH * OW apart, = act(conv(xp, wp) + bias) for the tile's first ocn
  // (<= kDirectOcb) channels; bias: kDirectOcb values. Each output is fma(w, x, acc) over the taps in
  // (c, i, j) order from +0, then + bias, then max(v, 0) when relu (as relu: -0 and NaN stay).
  void (*forward)(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y,
                  int ocn) = nullptr;
  // colT (OH * OW, KPAD) of the padded image xp.
  void (*columns)(const DirectGeom& g, const float* xp, float* colT) = nullptr;
  // dw[0 : KPAD] = fma(val[i], colT[pos[i] * KPAD + 0 : KPAD], dw) for i = 0 .. count-1 in order.
  void (*accumulate)(const float* colT, int64_t kpad, const int32_t* pos, const float* val, int64_t count,
                     float* dw) = nullptr;
  // The nonzero entries of row[0 : n] (NaN included) in order: their positions and values; returns how many.
  // pos and val have room for n + 16 entries (whole vectors are stored past the last).
  int64_t (*nonzeros)(const float* row, int64_t n, int32_t* pos, float* val) = nullptr;
};

const DirectConvKernels& direct_conv_kernels_scalar();
const DirectConvKernels& direct_conv_kernels_avx512();

}  // namespace demi::kernels::cpu_internal
