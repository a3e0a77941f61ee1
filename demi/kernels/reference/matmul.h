// Reference (scalar, obviously right) matrix products: the oracle the oneDNN kernels in onednn/matmul.h
// and onednn/dense.h are tested against, kept forever. Operands are widened exactly to the accumulation
// type (float for f32|bf16|f16, double for f64), multiplied in plain loops and rounded once on store.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/matmul_params.h"

namespace demi::kernels::ref {

// a (batch, M, K) or (batch, K, M) if trans_a, b (batch, K, N) or (batch, N, K) if trans_b,
// bias (N) -> c (batch, M, N); dtypes and semantics in matmul_params.h.
void matmul(const MatmulParams& p, const void* a, const void* b, void* c);

// Dense bias gradient: dy (rows, cols) -> db (cols) = column sums of dy, accumulated in f32 (f64 for f64);
// with `accumulate`, db += the sums. dy and db dtypes: f32|bf16|f16 (db may differ from dy), or both f64.
void bias_grad(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
               bool accumulate);

}  // namespace demi::kernels::ref
