// FP16 products on bf16 hardware: every f16 value x splits exactly into two bf16 values, x = hi + lo (hi
// its top 8 significant bits, lo the remaining 3, both exact in bf16, whose exponent range covers f16's
// subnormals). A product of two f16 values is then the sum of four bf16 products, each exact in f32:
//
//     a b = ah bh + ah bl + al bh + al bl
//
// so a matrix product of f16 operands becomes one bf16 product over four times the inner dimension,
// A' = [ah ah al al] times B' = [bh; bl; bh; bl], accumulated in f32 — the same value as converting to
// f32 and multiplying there, up to the order of the sum. On a CPU with AMX-BF16 the 4K bf16 product runs
// faster than the f32 one (demi/kernels/onednn/matmul.cc decides when to use it).
//
// split_f16_bf16 writes the four segments of each source row wherever the caller's layout wants them:
// row i of src (cols values) goes to dst + i * row_stride + s * seg_stride for s = 0..3, each segment
// holding hi or lo as bit s of `lo_segments` says. A value whose hi is not finite (f16 Inf/NaN) gets lo 0, so
// Inf stays Inf through the four products instead of becoming Inf - Inf = NaN.
#pragma once

#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels {

inline constexpr int kSplitSegments = 4;

// Segment patterns: A' = [h h l l] (bits 2, 3 set), B' = [h l h l] (bits 1, 3 set).
inline constexpr unsigned kSplitLhs = 0b1100, kSplitRhs = 0b1010;

void split_f16_bf16(const Half* src, int64_t rows, int64_t cols, BFloat16* dst, int64_t row_stride,
                    int64_t seg_stride, unsigned lo_segments);

// The scalar reference (single-threaded), for tests.
void split_f16_bf16_reference(const Half* src, int64_t rows, int64_t cols, BFloat16* dst, int64_t row_stride,
                              int64_t seg_stride, unsigned lo_segments);

namespace cpu_internal {
// Rows [r0, r1) of the split: each variant's (core/kernel_registry.h's f16_split family).
struct F16SplitKernels {
  void (*rows)(const Half* src, int64_t r0, int64_t r1, int64_t cols, BFloat16* dst, int64_t row_stride,
               int64_t seg_stride, unsigned lo_segments);
};
const F16SplitKernels& f16_split_kernels_scalar();  // f16_split.cc
const F16SplitKernels& f16_split_kernels_avx512();  // f16_split_avx512.cc
}  // namespace cpu_internal

}  // namespace demi::kernels
