// Elementwise kernels, fast: binary add/sub/mul/div with NumPy broadcasting, the sum that undoes a
// broadcast in backward, unary ops, and the scalar helpers (affine: scale / add a scalar; axpy).
// Inputs and output share one dtype (the ops layer casts first): f32, bf16, f16 compute in f32 and round
// once on store (bit-identical to demi::BFloat16(float) / demi::Half(float)); f64 runs the reference
// kernels (demi/kernels/reference/elementwise.h, which also defines BinaryOp, UnaryOp and
// broadcast_shape). Vectorised per CPU level (the variants: demi/core/kernel_registry.h; `demi info`
// prints them); large tensors run on demi's thread pool.
//
// Broadcast patterns are coalesced first, so same-shape, scalar, row (bias over features), column and
// channel ((N, C, H, W) with (C, 1, 1)) broadcasts all become contiguous inner loops.
// An output may alias an input of the same shape (in-place update).
#pragma once

#include <cstdint>
#include <span>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/elementwise.h"

namespace demi::kernels {

// a (a_shape), b (b_shape) -> out (broadcast_shape(a_shape, b_shape)); f32|bf16|f16|f64
void binary(BinaryOp op, DType dtype, const void* a, std::span<const int64_t> a_shape, const void* b,
            std::span<const int64_t> b_shape, void* out);

// grad (grad_shape) -> out (out_shape), where out_shape broadcasts to grad_shape: the backward of a
// broadcast, each out element the sum of the grad elements it was broadcast to; f32 accumulation
// (f64 for f64); f32|bf16|f16|f64
void sum_to_shape(DType dtype, const void* grad, std::span<const int64_t> grad_shape, void* out,
                  std::span<const int64_t> out_shape);

// x (n) -> y (n); f32|bf16|f16|f64
void unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n);

// x (n) -> y (n) = alpha * x + beta (alpha and beta rounded to f32 unless f64); f32|bf16|f16|f64
void affine(DType dtype, const void* x, double alpha, double beta, void* y, int64_t n);
inline void scale(DType dtype, const void* x, double alpha, void* y, int64_t n) { affine(dtype, x, alpha, 0.0, y, n); }
inline void add_scalar(DType dtype, const void* x, double alpha, void* y, int64_t n) {
  affine(dtype, x, 1.0, alpha, y, n);
}

// x (n), y (n) -> y += alpha * x; f32|bf16|f16|f64
void axpy(DType dtype, int64_t n, double alpha, const void* x, void* y);

}  // namespace demi::kernels
