// Matrix products with few output columns whose operands both run along K: c = a . b^T with a (M, K) and
// b (N, K) stored row-major (MatmulParams with trans_b and not trans_a), N <= kDotMaxN: a classifier's last
// Dense layer forward (x (B, 7200) . w (10, 7200)^T on model A), where a packing GEMM's 64-column panels
// would be 84% padding and oneDNN's f16 path widens both operands.
//
// How: each output is a dot product over K in 16-lane vectors, 2 rows x up to 12 columns at a time in 24 zmm
// accumulators (2 + 12 loads per 24 FMAs), the lanes added at the end; the operands read as f32, a
// low-precision b converted once per call (N x K, small by construction) and a low-precision a widened as
// it is loaded, so f16 and bf16 cost half the bytes of f32 and no full-size widened copy. A long K runs in
// chunks of about 24 KiB of b, each read (or converted, by each thread for itself) once for 8 row pairs, the
// lane sums kept between chunks. The epilogue is MatmulParams' (bias, accumulate, ReLU, rounded once into
// c's dtype). Threads take row pairs.
//
// A variant with 8-lane vectors keeps the same 16 lane sums, in two halves (the variants per CPU level:
// demi/core/kernel_registry.h; `demi info` prints them); the oracle is ../reference/matmul.h.
// kernels::matmul runs it where it measures fastest.
#pragma once

#include <cstdint>
#include <string>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu {

inline constexpr int64_t kDotMaxN = 32;

// Whether gemm_dot takes p: trans_b, not trans_a, 1 <= N <= kDotMaxN, f32|bf16|f16 operands and output.
bool gemm_dot_supported(const MatmulParams& p);

// Where a b that is not f32 as stored (low precision, or read rounded) is converted to f32 rows: one copy
// the threads share (converted by all of them, so half of it sits in the other core's cache), or, where the
// copy fits in a core's L2, a copy per thread, each converted by its own thread (faster on two threads,
// as many copies as threads). kernels::matmul measures both and prices the copies (its tune()).
enum class DotCopies { kShared, kPerThread };
// Whether p's b takes a copy per thread under DotCopies::kPerThread (else both ways are one run).
bool gemm_dot_copies_per_thread(const MatmulParams& p);

// c (batch, M, N) = act(a (batch, M, K) . b (batch, N, K)^T + bias (+ c)), as MatmulParams says. The same
// bits either way of copying b.
void gemm_dot(const MatmulParams& p, const void* a, const void* b, void* c, DotCopies copies = DotCopies::kShared);

// "demi-dot:avx512" (the variant this CPU runs) for diagnostics and `demi info`.
std::string gemm_dot_implementation();

}  // namespace demi::kernels::cpu
