// The weight gradient of a stride-1 bf16 convolution on the tile unit (AMX), with no column matrix: for a
// tap (i, j), dW[:, :, i, j]^T (C, OC) = sum over positions of X_ij (C, positions) . dy^T (positions, OC),
// where the positions run over the output rows at the padded image's width wp (OH * wp of them; those past
// OW in a row have dy 0), so that X_ij's row c is wp * (OH) consecutive values of the padded image from
// channel c's (i * dilation_h) * wp + j * dilation_w on: a tile's 16 rows (16 channels) load straight
// from the padded image, one channel apart. dy is packed once per image into VNNI-2 pairs of positions
// (amx_conv_pack_dy) and read by every tap and channel block. The positions a zero of dy multiplies read
// real values of the padded image (the next row's first columns) or the zeros past it: an Inf or NaN
// there gives NaN where the exact sum has none, in a gradient that is then non-finite either way only if
// that value is read by a real position too — the loss scaler's overflow check sees a non-finite
// gradient; finite inputs give the exact products, summed in f32.
//
// Channels and output channels in multiples of 32 (2 x 2 tile blocks); reached only at the amx level
// (conv.cc decides); compiled for AMX.
#pragma once

#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels::cpu {

struct AmxConvWeights {
  int64_t c = 0, oc = 0, kh = 0, kw = 0, dilation_h = 1, dilation_w = 1;
  int64_t oh = 0, ow = 0;
  int64_t wp = 0;       // the padded image's width
  int64_t channel = 0;  // elements of one channel of the padded image (hp * wp)
  int64_t image = 0;    // elements from one padded image to the next: c * channel and the slack below
  // positions per image (oh * wp) rounded up to 32, and the zeros a padded image needs after its last
  // channel for the tiles' reads past it: (kw - 1) * dilation_w + positions - oh * wp
  int64_t positions() const { return (oh * wp + 31) / 32 * 32; }
  int64_t slack() const { return (kw - 1) * dilation_w + positions() - oh * wp; }
  int64_t packed_dy() const { return oc * positions(); }  // bf16 elements of one image's packed dy
};

// dy (OC, OH, OW) bf16 -> packed: tile column t (16 output channels) holds positions() / 2 rows of 16
// VNNI-2 words (positions 2q, 2q + 1 of channel 16 t + j), dy 0 past OW in a row and past OH rows.
// `row` is scratch for one dy row at the padded width (oc * positions() bf16).
void amx_conv_pack_dy(const AmxConvWeights& g, const BFloat16* dy, BFloat16* row, BFloat16* packed);

// sums [kh][kw][c][oc] f32 = (first) or += the weight gradient's sums over `images` images: padded images
// at xpad + n * image (zero around, g.slack() zeros after the last channel), packed dy at dy + n *
// packed_dy(). On the calling thread.
void amx_conv_weight_sums(const AmxConvWeights& g, const BFloat16* xpad, const BFloat16* dy, int64_t images,
                          float* sums, bool first);

}  // namespace demi::kernels::cpu
