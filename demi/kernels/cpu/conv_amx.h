// Stride-1 bf16 convolutions on the tile unit (AMX). The weight gradient, with no column matrix: for a
// tap (i, j), dW[:, :, i, j]^T (C, OC) = sum over positions of X_ij (C, positions) . dy^T (positions, OC),
// where the positions run over the output rows at the padded image's width wp (OH * wp of them; those past
// OW in a row have dy 0), so that X_ij's row c is OH * wp consecutive values of the padded image from
// channel c's (i * dilation_h) * wp + j * dilation_w on: a tile's 16 rows (16 channels) load straight
// from the padded image, one channel apart. dy is packed once per image into VNNI-2 pairs of positions
// (amx_conv_pack_dy) and read by every tap and channel block. With finite inputs the products are exact
// and summed in f32. The positions where dy is 0 read real values of the padded image (the next row's first
// columns, or the zeros past the last channel): an Inf or NaN in x there can make a sum NaN where the
// exact one is +-Inf or finite. Such an x is an overflow that AMP's check meets in the loss and gradients
// anyway (the step is skipped).
//
// The forward (and so the stride-1 data gradient) likewise below; f16 values there split exactly into bf16
// parts (../f16_split.h's split; amx_conv_pad_pairs: conv.cc's split_f16 lays them out as 4C channels). Channels and
// output channels in multiples of 32 (2 x 2 tile blocks); reached only at the amx level (conv.cc decides);
// compiled for AMX.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi::kernels::cpu {

// A stride-1 layer's geometry as the tile kernels read it.
struct AmxConvGeometry {
  int64_t c = 0, oc = 0, kh = 0, kw = 0, dilation_h = 1, dilation_w = 1;
  int64_t oh = 0, ow = 0;
  int64_t wp = 0;       // the padded image's width
  int64_t channel = 0;  // elements of one channel of the padded image (hp * wp)
  int64_t image = 0;    // (weight gradient) elements from one padded image to the next: c * channel and slack
  // (forward) the channels of the padded image, where fewer than c (a divisor of it): the weights' channel
  // block cb reads the image's cb % image_c (f16 split: 4C weight channels hi, hi, lo, lo against the image's
  // 2C, hi, lo); 0: c
  int64_t image_c = 0;
  int64_t image_channels() const { return image_c > 0 ? image_c : c; }
  // positions per image (oh * wp) rounded up to 32, and the zeros a padded image needs after its last
  // channel for the tiles' reads past it: (kw - 1) * dilation_w + positions - oh * wp
  int64_t positions() const { return (oh * wp + 31) / 32 * 32; }
  int64_t slack() const { return (kw - 1) * dilation_w + positions() - oh * wp; }
  int64_t packed_dy() const { return oc * positions(); }  // bf16 elements of one image's packed dy
};

// dy (OC, OH, OW) bf16 -> packed: tile column t (16 output channels) holds positions() / 2 rows of 16
// VNNI-2 words (positions 2q, 2q + 1 of channel 16 t + j), dy 0 past OW in a row and past OH rows.
// `row` is scratch for dy at the padded width (oc * positions() bf16).
void amx_conv_pack_dy(const AmxConvGeometry& g, const BFloat16* dy, BFloat16* row, BFloat16* packed);

// The forward of one image on the tile unit, stride 1 (the data gradient of a stride-1 convolution is one:
// conv.cc), with no column matrix: out (OC, positions()) f32 = sum over taps and channel blocks of W_tap
// (OC, C) . X_tap (C, positions), X_tap's rows read as B tiles straight from the image padded in channel
// pairs (pairs (C / 2, Hp, Wp, 2) bf16, g.slack() pairs of zeros after it): a tile's 16 rows are 16
// channel pairs, one channel's plane apart, each 16 positions of the two channels side by side. wt holds
// the weights as [tap][oc][c] bf16. The positions past OW in a row (and past OH rows) hold sums of other
// values; the caller stores only the others.
void amx_conv_forward_image(const AmxConvGeometry& g, const BFloat16* wt, const BFloat16* pairs, float* out);

// y (OC, OH, OW), f32, bf16 or f16, <- out's positions inside the output (amx_conv_forward_image's), each
// plus bias[o] (bias nullptr: none), plus what y holds (accumulate), ReLU (relu), rounded once into y_dtype.
// `plane` is scratch for OH * OW floats.
void amx_conv_store(const AmxConvGeometry& g, const float* out, const float* bias, bool relu, bool accumulate,
                    void* y, DType y_dtype, float* plane);

// image x (C, h, w) -> dst padded in channel pairs as amx_conv_forward_image reads it
// ((g.image_channels() / 2, Hp, Wp, 2) bf16, x's values at (pad_top, pad_left), zero around; not the slack
// after it): x bf16 (image_channels() = C), or f16 split (image_channels() = 2 C: the channels' hi parts,
// then their lo parts, as ../f16_split.h splits them).
void amx_conv_pad_pairs(const AmxConvGeometry& g, int64_t h, int64_t w, int64_t pad_top, int64_t pad_left,
                        const void* x, bool split, BFloat16* dst);

// sums [kh][kw][c][oc] f32 = (first) or += the weight gradient's sums over `images` images: padded images
// at xpad + n * image (zero around, g.slack() zeros after the last channel), packed dy at dy + n *
// packed_dy(). On the calling thread.
void amx_conv_weight_sums(const AmxConvGeometry& g, const BFloat16* xpad, const BFloat16* dy, int64_t images,
                          float* sums, bool first);

}  // namespace demi::kernels::cpu
