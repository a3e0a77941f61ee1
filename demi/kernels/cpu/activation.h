// Pointwise activations (ReLU, Sigmoid, Tanh, GELU exact and tanh-approximated, SiLU), forward and
// backward, fast CPU kernels: one pass over memory, vectorised per CPU level (the variants:
// demi/core/kernel_registry.h; `demi info` prints them), split over demi's thread pool. The formulas, and
// which tensor each backward reads, are in demi/kernels/reference/activation.h (the reference twins these
// are tested against).
//
// Data is f32, bf16 or f16 (f64 runs the reference); compute is f32, bf16/f16 are widened exactly on load
// and rounded to nearest even on store. Outputs may alias inputs (in-place activations).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/activation.h"

namespace demi::kernels {

// x (n) -> y (n), f32|bf16|f16|f64
void activation_forward(Activation a, DType dtype, const void* x, void* y, int64_t n);

// saved (n) = x or y (activation_saved(a)), dy (n) -> dx (n), f32|bf16|f16|f64
void activation_backward(Activation a, DType dtype, const void* saved, const void* dy, void* dx, int64_t n);

// ReLU's backward from its mask kept as bits instead of its output (1/32 of an f32 y's bytes, 1/16 of a
// bf16 or f16 one): what the fused Dense+ReLU and ReLU save, so that y itself can go (its next layer's
// backward writes its data gradient into y's bytes) and the mask is applied to the incoming gradient in
// place. Semantics, and the reference twins: ref::relu_mask and ref::relu_backward_mask
// (reference/activation.h): bits[i / 8] bit i % 8 = y[i] > 0; dx[i] = bit ? dy[i] : +0, dx may alias dy.
void relu_mask(DType dtype, const void* y, uint8_t* bits, int64_t n);
void relu_backward_mask(DType dtype, const uint8_t* bits, const void* dy, void* dx, int64_t n);

}  // namespace demi::kernels
