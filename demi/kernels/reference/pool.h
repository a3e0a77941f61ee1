// MaxPool2d and AvgPool2d, reference twins: scalar loops over the output, obviously right; kept forever
// as the oracle for the fast kernels in demi/kernels/cpu/pool.h and as the f64 path.
//
// Geometry in demi/kernels/pool_params.h. Arithmetic is in AccT<T> (f32 for f32/bf16/f16, f64 for f64),
// rounded once on store.
//
// MaxPool's argmax is one byte per output: the position of the selected element inside its window,
// dh * KW + dw (so KH * KW <= 255). The first maximum in row-major window order wins a tie; a NaN wins
// over numbers (NaN propagates, as in PyTorch). The value kArgmaxNone (255) means "no gradient": the
// fused ReLU -> MaxPool2d writes it where the selected maximum was <= 0 (or NaN), so one backward
// kernel serves both.
#pragma once

#include <cstdint>

#include "demi/kernels/pool_params.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

inline constexpr uint8_t kArgmaxNone = 255;
inline constexpr int64_t kMaxPoolWindowMax = 255;  // KH * KW limit for one-byte argmax

}  // namespace demi::kernels

namespace demi::kernels::ref {

// x (N, C, H, W) -> y (N, C, OH, OW), argmax (N, C, OH, OW) u8 (nullable); T = float|double|Half|BFloat16
template <typename T>
void max_pool2d_forward(const Pool2dParams& p, const T* x, T* y, uint8_t* argmax);

// y = max_pool2d(relu(x)): x (N, C, H, W) -> y (N, C, OH, OW), argmax u8 (nullable; kArgmaxNone where
// the window's maximum was <= 0 or NaN, i.e. where ReLU blocks the gradient)
template <typename T>
void relu_max_pool2d_forward(const Pool2dParams& p, const T* x, T* y, uint8_t* argmax);

// dy (N, C, OH, OW), argmax (N, C, OH, OW) u8 -> dx (N, C, H, W) (overwritten; overlapping windows add)
template <typename T>
void max_pool2d_backward(const Pool2dParams& p, const T* dy, const uint8_t* argmax, T* dx);

// x (N, C, H, W) -> y (N, C, OH, OW): the mean over each window's elements (see count_include_pad)
template <typename T>
void avg_pool2d_forward(const Pool2dParams& p, const T* x, T* y);

// dy (N, C, OH, OW) -> dx (N, C, H, W) (overwritten): each window spreads dy / divisor over its elements
template <typename T>
void avg_pool2d_backward(const Pool2dParams& p, const T* dy, T* dx);

// The divisor of output (oy, ox) of an AvgPool with geometry p.
int64_t avg_pool2d_divisor(const Pool2dParams& p, int64_t oy, int64_t ox);

}  // namespace demi::kernels::ref
