// AMP kernels, reference twins: the fused gradient unscale + all-finite check, and the sum of squares
// behind global-norm gradient clipping, over a list of gradient buffers (FP32, or the low-precision
// parameter gradients of AMP O2/O3). Kept forever as the oracle for demi/kernels/cpu/amp_kernels.h.
#pragma once

#include <cstdint>
#include <span>

#include "demi/core/dtype.h"

namespace demi::kernels {

struct UnscaleResult {
  bool all_finite = true;
  int64_t first_nonfinite = -1;  // index of the first buffer holding an inf or NaN (after unscaling), or -1
};

// One gradient buffer: n values of dtype (f32, f16 or bf16) at data.
struct GradBuffer {
  void* data = nullptr;
  int64_t n = 0;
  DType dtype = DType::kF32;

  static GradBuffer f32(std::span<float> s) { return {s.data(), static_cast<int64_t>(s.size()), DType::kF32}; }
};

namespace ref {

// grads -> each f32 value g becomes g * inv_scale in place (no writes when inv_scale == 1); f16 and bf16
// values are never written (unscaling them in their own dtype would flush the small ones that the loss
// scale saved): the caller applies inv_scale when it reads them. The check is on the unscaled values of
// every dtype, so a finite g whose product overflows counts as non-finite.
UnscaleResult unscale_and_check_finite(std::span<const GradBuffer> grads, float inv_scale);

// bufs -> sum of all squares (values as stored, widened to f32), f64; per_buffer (bufs.size()) each
// buffer's own sum (nullable).
double sum_of_squares(std::span<const GradBuffer> bufs, double* per_buffer = nullptr);

}  // namespace ref
}  // namespace demi::kernels
