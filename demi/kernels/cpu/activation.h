// Pointwise activations (ReLU, Sigmoid, Tanh, GELU exact and tanh-approximated, SiLU), forward and
// backward, fast CPU kernels: one pass over memory, 16 lanes at a time with AVX-512 (a portable loop
// below that), split over demi's thread pool. The formulas, and which tensor each backward reads, are in
// demi/kernels/reference/activation.h (the reference twins these are tested against).
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

}  // namespace demi::kernels
