// Softmax and log-softmax along one axis, fast, forward and backward. The tensor is viewed as
// (outer, axis, inner) (AxisView, demi/kernels/reference/reduce.h): the last axis is inner = 1, a channel
// axis of NCHW is (N, C, H*W). The maximum is subtracted in f32 before exponentiating and the sums
// accumulate in f32 whatever the storage dtype, so ±1e4 logits in f32 and values near 65504 in f16
// never overflow. x may be f32, bf16 or f16 and y x's dtype or f32 (bf16 logits -> f32 probabilities);
// f64 runs the reference. Backward takes y and dy in y's dtype and writes dx in x's. Vectorised per CPU
// level (the variants: demi/core/kernel_registry.h; `demi info` prints them); rows or column blocks run
// in parallel.
#pragma once

#include "demi/core/dtype.h"
#include "demi/kernels/reference/reduce.h"

namespace demi::kernels {

// x (outer, axis, inner) -> y (same); x f32|bf16|f16|f64, y x's dtype or f32 (f64: f64)
void softmax_forward(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype);
// x -> y = log(softmax(x)) = x - max - log(sum(exp(x - max)))
void log_softmax_forward(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype);

// y, dy (outer, axis, inner) in y_dtype -> dx (same) in dx_dtype: dx = y * (dy - sum_axis(dy * y))
void softmax_backward(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype);
// y (log-probabilities), dy -> dx = dy - exp(y) * sum_axis(dy)
void log_softmax_backward(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype);

}  // namespace demi::kernels
