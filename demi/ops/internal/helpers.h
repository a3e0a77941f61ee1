// Helpers shared by the op families: argument checks that name the op, shapes and dtypes, and the
// tensor-level calls backward rules use (they run kernels directly, not through the dispatch point, so a
// backward never shows up as a forward op in traces and never re-enters autograd).
#pragma once

#include <span>

#include "demi/core/tensor.h"
#include "demi/kernels/reference/elementwise.h"
#include "demi/ops/dispatch.h"
#include "demi/ops/op.h"

namespace demi::ops::internal {

// A demi::Error unless x is defined and floating: "Conv2d: input x must be floating, got int32(2, 3)".
void check_floating(Op op, const Tensor& x, const char* arg);
void check_rank(Op op, const Tensor& x, int rank, const char* arg, const char* layout);

// g converted to dtype (gradients reaching a node may be wider than its output).
Tensor grad_as(const Tensor& g, DType dtype);

// Whether the caller's handle (a backward rule's saved tensor) is the only one on `saved` and its bytes.
bool only_holder(const Tensor& saved);

// The buffer for an elementwise backward result of `saved`'s shape and dtype: `saved` itself where the
// backward rule holds its only reference (only_holder: every other reader already ran its backward and
// released it, so nothing can see it overwritten), else a new tensor. One activation-sized buffer less at
// backward's peak; for kernels that read each element before writing it, or that write a gradient after
// the last read of `saved` (Dense's data gradient into its input, once the weight gradient has read it).
Tensor reuse_or_empty(const Tensor& saved);

// The buffer for an elementwise backward result that reads each element of its incoming gradient `gy`
// before writing it (ReLU's mask): gy's own bytes where nothing else can see them, else a new tensor. gy is
// `incoming` (the gradient autograd's backward handed the rule: the engine's handle, dropped right after
// the rule, plus the rule's copy) or a conversion of it that only the rule holds. A gradient that also
// went to another node (an addition's backward passes one tensor to both inputs), or that shares its
// bytes with another tensor, is never written.
Tensor reuse_incoming_or_empty(const Tensor& incoming, const Tensor& gy);

// ReLU's mask kept as bits instead of its output (kernels::relu_mask): a uint8 tensor of (n + 7) / 8
// bytes, bit i = y[i] > 0.
Tensor relu_mask_of(const Tensor& y);
// ReLU's backward from that mask: gy where the bit is set, else +0, in gy's bytes where
// reuse_incoming_or_empty allows (incoming and gy as there).
Tensor relu_backward_from_mask(const Tensor& incoming, const Tensor& gy, const Tensor& bits);

// A weight input of an op, as this call reads it and as its backward keeps it. Recast: cast for this call
// only (Dispatch::input_uncached: no cast cache entry, no low-precision copy outlives the call) and the
// caller's tensor kept, which backward casts again with as_dtype_for_call. Otherwise Dispatch::input's
// tensor, kept as it is.
struct CallWeight {
  Tensor now;
  Tensor saved;
};
CallWeight weight_for_call(const Dispatch& d, size_t index, const Tensor& w_in, bool recast);

// t in dtype for one call: t itself, or its cast as workspace (freed with the returned tensor).
Tensor as_dtype_for_call(const Tensor& t, DType dtype);

// t as the operand of a product in `dtype` whose values are `stored`'s (the dtype the layer computes in):
// t itself when it has that dtype, else its cast, through `stored` first when t is wider (an FP32 data
// batch or master weight read as f16, then rounded to bf16 under F16Products::kBf16: the values
// the f16 layer reads, rounded once more). In the current memory category.
Tensor as_product_operand(const Tensor& t, DType stored, DType dtype);

// The dtype a layer's products read its input x_in as with no Cast (Conv2dParams::x_round,
// DenseParams::x_round: the same values as the cast input), or kF32 where x_in is cast as the op's inputs
// are. The data batch qualifies: an f32 input that needs no gradient, under a bf16 or f16 compute dtype,
// while layers may be fused (the numerics report unfuses them and sees the Cast), and not where f16
// values are multiplied as bf16 (their rounding goes through f16 first).
DType batch_read_as(const Dispatch& d, const Tensor& x_in);

// Kernel-level elementwise on tensors of one dtype (broadcasting for binary).
Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b);
Tensor unary(kernels::UnaryOp op, const Tensor& x);
Tensor affine(const Tensor& x, double alpha, double beta);  // alpha * x + beta
// Sums g (of a broadcast result's shape) down to `shape` (what broadcasting expanded).
Tensor sum_to(const Tensor& g, const Shape& shape);
// Broadcasts g (a shape that broadcasts to `shape`) up to `shape` (a copy).
Tensor expand_to(const Tensor& g, const Shape& shape);

}  // namespace demi::ops::internal
