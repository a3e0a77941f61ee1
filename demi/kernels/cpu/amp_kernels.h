// AMP kernels, fast: the fused gradient unscale + all-finite check that decides whether a mixed-precision
// step is applied or skipped, and the sum of squares behind global-norm gradient clipping. Both take the
// whole list of gradient buffers (f32, or f16/bf16: AMP O2/O3's parameter gradients) and make one pass:
// the buffers are cut into fixed blocks of kAmpBlock elements that run in parallel, vectorised per CPU
// level (the variants: demi/core/kernel_registry.h; `demi info` prints them). Cast itself is demi::convert
// (demi/core/convert.h). UnscaleResult is defined with the reference twins
// (demi/kernels/reference/amp_kernels.h).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "demi/kernels/reference/amp_kernels.h"

namespace demi::kernels {

// Elements per block; the blocks (not the thread count) fix the summation order.
inline constexpr int64_t kAmpBlock = 1 << 15;

// grads -> each f32 g becomes g * inv_scale in place (read-only when inv_scale == 1); f16 and bf16 buffers
// are only read, their values checked as g * inv_scale (the caller applies inv_scale when it reads them).
// Returns whether every unscaled value is finite and the index of the first buffer holding an inf or NaN.
// A finite g whose product overflows counts as non-finite. Every buffer is processed, overflow or not.
UnscaleResult unscale_and_check_finite(std::span<const GradBuffer> grads, float inv_scale);

// bufs -> sum of all squares (values widened to f32): f32 within each block, f64 across blocks;
// per_buffer (bufs.size()) each buffer's own sum (nullable).
double sum_of_squares(std::span<const GradBuffer> bufs, double* per_buffer = nullptr);

// Global-norm clipping on one block list: the buffers' sums of squares (as sum_of_squares, per buffer),
// then each f32 buffer multiplied in place by coef(per_buffer) unless it returns 1 (f16 and bf16 buffers
// are only read, as by unscale_and_check_finite). One scratch allocation whether it scales or not. Returns
// the coefficient.
float sum_of_squares_then_scale(std::span<const GradBuffer> bufs,
                                const std::function<float(const double* per_buffer)>& coef);

}  // namespace demi::kernels
