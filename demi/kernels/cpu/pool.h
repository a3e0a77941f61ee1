// MaxPool2d and AvgPool2d forward and backward, fast CPU kernels, and the fused ReLU -> MaxPool2d that
// models A and B use. Geometry (and MindSpore's pad_mode) in demi/kernels/pool_params.h; semantics,
// argmax encoding and tie rules in demi/kernels/reference/pool.h (the reference twins).
//
// The 2x2 / stride-2 window where no window reaches padding (models A and B) runs kernels that read each
// input once and write each output once: AVX-512 (pool_avx512.cc), or a portable loop below that level;
// other windows run the reference loops. Either way the planes are split over demi's thread pool.
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

// x (N, C, H, W) -> y (N, C, OH, OW): window means (p.count_include_pad picks the divisor)
void avg_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y);

// dy (N, C, OH, OW) -> dx (N, C, H, W), overwritten
void avg_pool2d_backward(const Pool2dParams& p, DType dtype, const void* dy, void* dx);

}  // namespace demi::kernels
