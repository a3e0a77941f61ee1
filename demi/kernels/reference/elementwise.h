// Elementwise kernels, reference twins: binary add/sub/mul/div with NumPy broadcasting, the sum that
// undoes a broadcast in backward (sum_to_shape), unary ops, and the scalar helpers (affine, axpy).
// Scalar loops over the output index, obviously right; kept forever as the oracle for the fast kernels
// in demi/kernels/cpu/elementwise.h and as the f64 path.
//
// Broadcasting follows NumPy: shapes are aligned at their innermost dimension, a missing or size-1
// dimension stretches to the other's size, anything else is an error naming both shapes. Ranks up to 8.
// Arithmetic is in AccT<T> (f32 for f32/bf16/f16, f64 for f64), rounded once on store.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "demi/core/shape.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };
enum class UnaryOp : uint8_t { kNeg, kAbs, kSquare, kSqrt, kExp, kLog, kReciprocal };

std::string_view binary_op_name(BinaryOp op);  // "add", "sub", "mul", "div"
std::string_view unary_op_name(UnaryOp op);    // "neg", "abs", "square", "sqrt", "exp", "log", "reciprocal"

// "(2, 3, 4)", as Shape::to_string, for dims of any rank (error messages).
std::string shape_string(std::span<const int64_t> dims);

// The shape of a binary op's result; a demi::Error naming `op` and both shapes if they do not broadcast.
Shape broadcast_shape(std::span<const int64_t> a, std::span<const int64_t> b, std::string_view op = "broadcast");
// Whether `from` broadcasts to exactly `to` (what sum_to_shape can reduce `to` back down to).
bool broadcasts_to(std::span<const int64_t> from, std::span<const int64_t> to);

namespace ref {

// a (a_shape), b (b_shape) -> out (broadcast_shape(a_shape, b_shape)), all T
template <typename T>
void binary(BinaryOp op, const T* a, std::span<const int64_t> a_shape, const T* b, std::span<const int64_t> b_shape,
            T* out);

// grad (grad_shape) -> out (out_shape), T, where out_shape broadcasts to grad_shape: each out element is
// the sum of the grad elements it was broadcast to (the backward of broadcasting), accumulated in AccT<T>.
template <typename T>
void sum_to_shape(const T* grad, std::span<const int64_t> grad_shape, T* out, std::span<const int64_t> out_shape);

// x (n) -> y (n), T
template <typename T>
void unary(UnaryOp op, const T* x, T* y, int64_t n);

// x (n) -> y (n) = alpha * x + beta, T (scale: beta = 0; add a scalar: alpha = 1)
template <typename T>
void affine(const T* x, double alpha, double beta, T* y, int64_t n);

// x (n), y (n) -> y += alpha * x, T
template <typename T>
void axpy(int64_t n, double alpha, const T* x, T* y);

}  // namespace ref
}  // namespace demi::kernels
