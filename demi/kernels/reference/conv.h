// Reference (scalar, obviously right) 2-D convolutions: the oracle the oneDNN kernels in onednn/conv.h
// are tested against, kept forever. Geometry, dtypes and semantics are those of Conv2dParams
// (conv_params.h); operands are widened exactly to the accumulation type (float for f32|bf16|f16, double
// for f64), summed in plain loops and rounded once on store.
#pragma once

#include "demi/kernels/conv_params.h"

namespace demi::kernels::ref {

// x (N, C, H, W) x_dtype, w (OC, C/groups, KH, KW) w_dtype, bias (OC) bias_dtype or nullptr
//   -> y (N, OC, OH, OW) y_dtype = act(conv(x, w) + bias)
void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);

// dy (N, OC, OH, OW) y_dtype, w (OC, C/groups, KH, KW) w_dtype -> dx (N, C, H, W) x_dtype
// (dx += ... with p.accumulate)
void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx);

// x (N, C, H, W) x_dtype, dy (N, OC, OH, OW) y_dtype -> dw (OC, C/groups, KH, KW) w_dtype and, unless
// db is nullptr, db (OC) bias_dtype = sums of dy over N, OH, OW (both += with p.accumulate)
void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db);

}  // namespace demi::kernels::ref
