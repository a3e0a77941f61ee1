// Matrix products with a short inner dimension: c = op(a) . b with K <= kOuterMaxK, op(a) small (M x K <=
// kOuterMaxA values) and b (K, N) stored row-major: a Dense layer's data gradient from few outputs (model
// A's dx = dy (32, 10) . w (10, 7200), its FP32 master read as f16 or bf16) and its weight gradient from a
// small batch (dw = dy^T (10, 32) . x (32, 7200)), where a packing GEMM spends its time packing b and
// joining its threads rather than multiplying (10 or 32 multiply-adds per output), and oneDNN's f16 and
// rounded-operand paths copy whole operands.
//
// How: op(a) converted to f32 once (small by construction); the threads take runs of c's columns; per vector
// of columns, 12 rows of c at a time in accumulators, b's row k loaded once per 12 rows (converted as it is
// loaded; an f32 b read as bf16|f16 rounded there, bit for bit the cast b), each output's sum one fmadd chain
// over k from +0; then MatmulParams' epilogue (+ c with accumulate, + bias, ReLU) and one rounding into c's
// dtype. No packed copy of b, no f32 copy of a low-precision b. A fixed order per output: the thread count
// changes no bit.
//
// The variants per CPU level: demi/core/kernel_registry.h (`demi info` prints them); the oracle is
// ../reference/matmul.h. kernels::matmul runs it where it measures fastest.
#pragma once

#include <cstdint>
#include <string>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu {

inline constexpr int64_t kOuterMaxK = 64;
inline constexpr int64_t kOuterMaxA = 16384;

// Whether gemm_outer takes p: not trans_b, 1 <= K <= kOuterMaxK, M x K <= kOuterMaxA, f32|bf16|f16 operands
// and output, a as stored (a_round unset), no residual, products of the values as they are (not
// bf16_products).
bool gemm_outer_supported(const MatmulParams& p);

// c (batch, M, N) = act(op(a) (batch, M, K) . b (batch, K, N) + bias (+ c)), and a_row_sums, as MatmulParams
// says.
void gemm_outer(const MatmulParams& p, const void* a, const void* b, void* c);

// "demi-outer:avx512" (the variant this CPU runs) for diagnostics and `demi info`.
std::string gemm_outer_implementation();

}  // namespace demi::kernels::cpu
