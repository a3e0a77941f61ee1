// AMP kernels, reference twins: the fused gradient unscale + all-finite check, and the sum of squares
// behind global-norm gradient clipping, over a list of f32 gradient buffers. Kept forever as the oracle
// for demi/kernels/cpu/amp_kernels.h.
#pragma once

#include <cstdint>
#include <span>

namespace demi::kernels {

struct UnscaleResult {
  bool all_finite = true;
  int64_t first_nonfinite = -1;  // index of the first buffer holding an inf or NaN (after unscaling), or -1
};

namespace ref {

// grads: buffers of f32 -> each value g becomes g * inv_scale in place (no writes when inv_scale == 1);
// the check is on the unscaled values, so a finite g whose product overflows counts as non-finite.
UnscaleResult unscale_and_check_finite(std::span<const std::span<float>> grads, float inv_scale);

// bufs: buffers of f32 -> sum of all squares, f64; per_buffer (bufs.size()) each buffer's (nullable).
double sum_of_squares(std::span<const std::span<const float>> bufs, double* per_buffer = nullptr);

}  // namespace ref
}  // namespace demi::kernels
