// MaxPool2d and AvgPool2d forward and backward, fast CPU kernels, and the fused ReLU -> MaxPool2d that
// models A and B use. Geometry (and MindSpore's pad_mode) in demi/kernels/pool_params.h; semantics,
// argmax encoding and tie rules in demi/kernels/reference/pool.h (the reference twins).
//
// The 2x2 / stride-2 window where no window reaches padding (models A and B) runs kernels that read each
// input once and write each output once, vectorised per CPU level (the variants:
// demi/core/kernel_registry.h; `demi info` prints them); other windows run the reference loops. Either way
// the planes are split over demi's thread pool.
//
// MaxPool saves one byte per output for backward (the selected position inside the window) rather than
// the input: a quarter of a byte per input element for 2x2, against 2 or 4 bytes to keep x.
//
// Data is f32, bf16 or f16 (f64 runs the reference); compute is f32 (bf16/f16 widened exactly, rounded
// to nearest even on store; max pooling never rounds).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/pool_params.h"
#include "demi/kernels/reference/pool.h"

namespace demi::kernels {

// x (N, C, H, W) -> y (N, C, OH, OW), argmax (N, C, OH, OW) u8 (nullable: inference), f32|bf16|f16|f64
void max_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y, uint8_t* argmax);

// y = max_pool2d(relu(x)) in one pass: x (N, C, H, W) -> y (N, C, OH, OW), argmax u8 (nullable) holding
// kArgmaxNone where the window's maximum was <= 0, so max_pool2d_backward gives relu's zero gradient too.
void relu_max_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y, uint8_t* argmax);

// dy (N, C, OH, OW), argmax (N, C, OH, OW) u8 from either forward -> dx (N, C, H, W), overwritten
void max_pool2d_backward(const Pool2dParams& p, DType dtype, const void* dy, const uint8_t* argmax, void* dx);

// ---- pooling straight from a convolution's own layout (the fused Conv2d -> ReLU -> MaxPool2d) ----
//
// oneDNN's convolutions write channel-blocked (nChw16c, f32) or channels-last (NHWC, bf16 on AMX) layouts;
// reordering their full-size output to NCHW and back for the gradient cost as much as the convolution itself
// on models A and B. These kernels read (forward) and write (backward) the tensor in that layout directly.
//
// Element (n, c, h, w) of a strided 4-D tensor lives at n sn + (c / cb) scb + (c % cb) sc + h sh + w sw:
// NCHW is {C H W, 0, H W, W, 1, C}, NHWC {H W C, 0, 1, W C, C, C}, nChw16c {Cp H W, 16 H W, 1, 16 W, 16, 16}.
struct StridedLayout4 {
  int64_t sn = 0, scb = 0, sc = 0, sh = 0, sw = 0, cb = 1;
  int64_t offset(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return n * sn + (c / cb) * scb + (c % cb) * sc + h * sh + w * sw;
  }
  // Plain NCHW with C channels of H x W.
  static StridedLayout4 nchw(int64_t c, int64_t h, int64_t w) { return {c * h * w, 0, h * w, w, 1, c}; }
};

// The pool these kernels serve: windows that neither overlap nor reach padding.
bool strided_pool_supported(const Pool2dParams& p);

// y = max_pool2d(relu(x)): x (N, C, H, W) in `xl`, f32|bf16 -> y (N, C, OH, OW) NCHW in y_dtype
// (f32|bf16|f16, rounded once), argmax NCHW (nullable) as relu_max_pool2d_forward writes it.
void relu_max_pool2d_forward_strided(const Pool2dParams& p, DType x_dtype, const void* x, const StridedLayout4& xl,
                                     DType y_dtype, void* y, uint8_t* argmax);

// The gradient of that pooling: dy (N, C, OH, OW) NCHW (f32|bf16|f16) and argmax -> dx (N, C, H, W) in `dxl`,
// f32|bf16: the whole buffer (dx_bytes, padding included) is zeroed, then each selected element gets its dy.
void max_pool2d_backward_strided(const Pool2dParams& p, DType dy_dtype, const void* dy, const uint8_t* argmax,
                                 DType dx_dtype, void* dx, const StridedLayout4& dxl, int64_t dx_bytes);

// x (N, C, H, W) -> y (N, C, OH, OW): window means (p.count_include_pad picks the divisor)
void avg_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y);

// dy (N, C, OH, OW) -> dx (N, C, H, W), overwritten
void avg_pool2d_backward(const Pool2dParams& p, DType dtype, const void* dy, void* dx);

}  // namespace demi::kernels
