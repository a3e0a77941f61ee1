// Embedding lookup, fast: gather rows of a (V, D) table by int32/int64 ids, converting an FP32 table
// straight into the low dtype under AMP (forward), and the dense FP32 table gradient by scatter-add
// (backward; rows owned by one thread each, so the sums are deterministic). The f64 forms run the
// reference (demi/kernels/reference/embedding.h, which also states the formulas). Vectorised per CPU
// level (the variants: demi/core/kernel_registry.h; `demi info` prints them).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/embedding.h"

namespace demi::kernels {

// ids (N) int32|int64 in [0, V), table (V, D) f32|bf16|f16|f64 -> y (N, D) in y_dtype: the table's dtype, or
// bf16/f16 from an f32 table. An id outside [0, V) is a demi::Error naming it and its position.
void embedding_forward(const void* ids, DType id_dtype, int64_t n, const void* table, DType table_dtype, int64_t vocab,
                       int64_t dim, void* y, DType y_dtype);

// ids (N) int32|int64, dy (N, D) f32|bf16|f16 (or f64) -> dtable (V, D) f32 (f64 for f64 dy), overwritten.
void embedding_backward(const void* ids, DType id_dtype, int64_t n, const void* dy, DType dy_dtype, int64_t vocab,
                        int64_t dim, void* dtable, DType dtable_dtype);

}  // namespace demi::kernels
