// Reductions, fast: sum, mean, max with argmax, argmax, over one axis of a contiguous tensor viewed as
// (outer, axis, inner) (AxisView, demi/kernels/reference/reduce.h; all of it is (1, numel, 1)); keepdim
// is the caller's business. Accumulation is in f32 whatever the storage dtype (f64 for f64, which runs
// the reference); the result is stored in x's dtype or in f32 (bf16 in, f32 sum out). Vectorised per CPU
// level (the variants: demi/core/kernel_registry.h; `demi info` prints them); large reductions run on
// demi's thread pool, with results that do not depend on the thread count.
//
// sum_to_shape (the backward of broadcasting) shares this file's engine; it is declared in elementwise.h.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/reduce.h"

namespace demi::kernels {

// x (outer, axis, inner) -> y (outer, inner); x f32|bf16|f16|f64, y x's dtype or f32 (f64: f64)
void reduce_sum(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype);
void reduce_mean(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype);

// x (outer, axis, inner) -> y (outer, inner) the maximum (nullable), argmax (outer, inner) int64 its index
// along the axis (nullable); axis >= 1. Ties give the first index; a NaN is the maximum (the first NaN).
void reduce_max(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, int64_t* argmax);
inline void reduce_argmax(const void* x, DType x_dtype, AxisView v, int64_t* argmax) {
  reduce_max(x, x_dtype, v, nullptr, x_dtype, argmax);
}

}  // namespace demi::kernels
