// Dropout forward and backward, fast CPU kernels: the Philox words, the keep mask (one bit per element)
// and the scaled output in one pass; backward reads dy and the mask bits. Semantics (which elements are
// kept for a seed and counter, the mask layout, the scale) in demi/kernels/reference/dropout.h: the mask
// is the reference's bit for bit at every ISA level and thread count.
//
// The mask costs 1/8 byte per element, against 1 for a byte mask or 2-4 to keep x: on top of reading x and
// writing y it adds 1/32 (bf16, f16) or 1/64 (f32) to the traffic (bench/pointwise_bench.cc measures it).
//
// Data is f32, bf16 or f16 (f64 runs the reference); y = x * (1 / keep_prob) is computed in f32 and rounded
// once. y may alias x, dx may alias dy.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/dropout.h"

namespace demi::kernels {

// x (n) -> y (n), mask (dropout_mask_bytes(n)) u8 bits; f32|bf16|f16|f64
void dropout_forward(const DropoutParams& p, DType dtype, const void* x, void* y, uint8_t* mask, int64_t n);

// dy (n), mask (dropout_mask_bytes(n)) -> dx (n) = dy * mask / keep_prob; f32|bf16|f16|f64
void dropout_backward(float keep_prob, DType dtype, const void* dy, const uint8_t* mask, void* dx, int64_t n);

}  // namespace demi::kernels
