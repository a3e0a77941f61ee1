// 2-D convolution on demi's GEMM (gemm.h), for any Conv2dParams geometry with groups = 1 (stride,
// asymmetric padding, dilation), NCHW in and out, every f32|bf16|f16 mix the oneDNN kernels take
// (onednn/conv.h has the same signatures and semantics; the oracles are ../reference/conv.h).
//
// How: images go to the threads (one image per GEMM, so no GEMM forks), each thread with one image's
// column matrix (C*KH*KW x OH*OW, f32) in workspace: im2col converts bf16/f16 input to f32 as it gathers,
// so low-precision storage runs the f32 FMA micro-kernel with no widened copy of the batch (oneDNN 2.6
// widens whole f16 tensors; its bf16 kernels run vdpbf16ps, at half the FMA rate on some CPUs).
//   forward           y[n] = act(W . col(x[n]) + bias)                 (W converted in the GEMM's packing;
//                     where conv2d_indirect_supported: y[n]^T = col^T W^T with col never formed)
//   backward-data     dx[n] = col2im(W^T . dy[n])                       (summed in f32, rounded once)
//   backward-weights  dW = sum_n dy[n] . col(x[n])^T, db = sum dy       (per-thread f32 partials, added;
//                     where conv2d_backward_weights_indirect_supported: dW^T = col . dy^T, col read through
//                     offsets into each padded image; at the amx level, bf16, stride 1, channels in
//                     multiples of 32: on the tile unit, per tap, tiles loaded from the padded images,
//                     conv_amx.h)
// bf16 operands where the CPU has AVX512-BF16 run the indirect products on vdpbf16ps pairs (channel pairs
// at a tap in the forward and the stride-1 data gradient; neighbouring positions in the weight gradient).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "demi/kernels/conv_params.h"

namespace demi::kernels::cpu {

// An operand of N images that the kernels read one image at a time: stored whole (`data`), or made on
// demand (`make`: image n, in the operand's dtype, into a buffer of `make_bytes` that the kernel takes for
// each thread before its threads start). The fused Conv2d -> ReLU -> MaxPool2d backward hands its output
// gradient this way, unpooled image by image, so that no batch-sized dense gradient exists (model B's
// second layer: 3 MiB in bf16, 6 MiB in f32, the largest workspace of its training peak). The values are
// the same either way, and so are the kernels' sums: each image is read where a stored one would be.
// `make` runs on the kernel's threads, several at once (each with its own buffer), and must not allocate.
struct Images {
  const void* data = nullptr;
  std::function<void(int64_t n, void* dst)> make;
  size_t make_bytes = 0;
};

// Whether these kernels take p (groups == 1, non-f64 dtypes).
bool conv2d_supported(const Conv2dParams& p);
// Whether conv2d_forward runs p as an indirect product (see conv.cc: no column matrix; the positions as
// the GEMM's rows, the weights packed once per call) rather than one small GEMM per image's column matrix:
// where the CPU level has the indirect micro-kernel and the packed weights (2 MiB) and one padded f32 image
// (4 MiB) fit. The dispatcher (../onednn/conv.h) offers only this form against oneDNN.
bool conv2d_indirect_supported(const Conv2dParams& p);
// Whether conv2d_forward runs p on the tile unit (conv_amx.h: the amx level, bf16 x and w, stride 1, C and
// OC multiples of 32, y bf16|f32), the form conv2d_indirect_supported then names.
bool conv2d_forward_on_tiles(const Conv2dParams& p);
// Whether conv2d_backward_data runs p as that indirect product (stride 1: the data gradient is the forward
// convolution of dy with the flipped weights, padded by (KH-1)*dilation - pad) rather than per image.
bool conv2d_backward_data_indirect_supported(const Conv2dParams& p);
// Whether conv2d_backward_weights runs p with no column matrix rather than per image: on the tile unit
// (conv_amx.h: the amx level, bf16 x and dy, stride 1, C and OC multiples of 32), else as an indirect
// product (dW^T = col . dy^T with col read through offsets into each padded image) where a padded image
// and a thread's K x OC f32 partial sums fit.
bool conv2d_backward_weights_indirect_supported(const Conv2dParams& p);

// x (N, C, H, W), w (OC, C, KH, KW), bias (OC) or nullptr -> y (N, OC, OH, OW) = act(conv(x, w) + bias)
void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);
// dy (N, OC, OH, OW), w -> dx (N, C, H, W) (dx += ... with p.accumulate)
void conv2d_backward_data(const Conv2dParams& p, const Images& dy, const void* w, void* dx);
inline void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  conv2d_backward_data(p, Images{.data = dy}, w, dx);
}
// x, dy -> dw (OC, C, KH, KW) and, unless db is nullptr, db (OC) = sums of dy (both += with p.accumulate)
void conv2d_backward_weights(const Conv2dParams& p, const void* x, const Images& dy, void* dw, void* db);
inline void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  conv2d_backward_weights(p, x, Images{.data = dy}, dw, db);
}

}  // namespace demi::kernels::cpu
