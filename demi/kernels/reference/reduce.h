// Reductions over one axis, reference twins: sum, mean, max with argmax. The tensor is viewed as
// (outer, axis, inner) — any axis of a contiguous tensor, or all of it as (1, numel, 1) — and reduced to
// (outer, inner); keepdim is the caller's business (the same memory either way). Accumulation is in
// AccT<T> (f32 for f32/bf16/f16, f64 for f64) in index order. Kept forever as the oracle for
// demi/kernels/cpu/reduce.h and as the f64 path.
#pragma once

#include <cstdint>

#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

// A contiguous tensor seen as (outer, axis, inner), reduced (or normalised, for softmax) along `axis`.
struct AxisView {
  int64_t outer = 1;
  int64_t axis = 1;
  int64_t inner = 1;
  int64_t numel() const { return outer * axis * inner; }
};

namespace ref {

// x (outer, axis, inner) -> y (outer, inner); T -> Out, Out in {T, float} (f64 -> f64)
template <typename T, typename Out>
void reduce_sum(const T* x, AxisView v, Out* y);
template <typename T, typename Out>
void reduce_mean(const T* x, AxisView v, Out* y);

// x (outer, axis, inner) -> y (outer, inner) the maximum, argmax (outer, inner) int64 its index along the
// axis; either output may be null; axis >= 1. Ties give the first index; a NaN is the maximum (the first
// NaN wins), as in NumPy and PyTorch.
template <typename T, typename Out>
void reduce_max(const T* x, AxisView v, Out* y, int64_t* argmax);

}  // namespace ref
}  // namespace demi::kernels
