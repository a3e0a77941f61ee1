// Softmax and log-softmax along one axis, forward and backward, reference twins. The tensor is viewed as
// (outer, axis, inner) (demi/kernels/reference/reduce.h); the last axis is inner = 1. The maximum is
// subtracted before exponentiating, in AccT<T>, so huge logits (±1e4 in f32, 65504 in f16) never
// overflow. The output may be wider than the input (bf16 logits -> f32 probabilities); backward takes
// y and dy in the output's type and writes dx in the input's. Kept forever as the oracle for
// demi/kernels/cpu/softmax.h and as the f64 path.
#pragma once

#include "demi/kernels/reference/reduce.h"

namespace demi::kernels::ref {

// x (outer, axis, inner) -> y (same), T -> Out, Out in {T, float} (f64 -> f64)
template <typename T, typename Out>
void softmax_forward(const T* x, AxisView v, Out* y);
template <typename T, typename Out>
void log_softmax_forward(const T* x, AxisView v, Out* y);

// y, dy (outer, axis, inner) -> dx (same), Out -> T: dx = y * (dy - sum_axis(dy * y))
template <typename T, typename Out>
void softmax_backward(const Out* y, const Out* dy, AxisView v, T* dx);
// y (log-probabilities), dy -> dx: dx = dy - exp(y) * sum_axis(dy)
template <typename T, typename Out>
void log_softmax_backward(const Out* y, const Out* dy, AxisView v, T* dx);

}  // namespace demi::kernels::ref
