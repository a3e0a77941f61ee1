#include "demi/kernels/reference/amp_kernels.h"

#include <cmath>

#include "demi/core/convert.h"

namespace demi::kernels::ref {
namespace {

float value_at(const GradBuffer& b, int64_t i) {
  switch (b.dtype) {
    case DType::kF16: return static_cast<float>(static_cast<const Half*>(b.data)[i]);
    case DType::kBF16: return static_cast<float>(static_cast<const BFloat16*>(b.data)[i]);
    default: return static_cast<const float*>(b.data)[i];
  }
}

}  // namespace

UnscaleResult unscale_and_check_finite(std::span<const GradBuffer> grads, float inv_scale) {
  UnscaleResult r;
  for (size_t b = 0; b < grads.size(); ++b) {
    const GradBuffer& buf = grads[b];
    bool finite = true;
    for (int64_t i = 0; i < buf.n; ++i) {
      float v = value_at(buf, i) * inv_scale;
      if (inv_scale != 1.0f && buf.dtype == DType::kF32) static_cast<float*>(buf.data)[i] = v;
      finite = finite && std::isfinite(v);
    }
    if (!finite && r.all_finite) {
      r.all_finite = false;
      r.first_nonfinite = static_cast<int64_t>(b);
    }
  }
  return r;
}

double sum_of_squares(std::span<const GradBuffer> bufs, double* per_buffer) {
  double total = 0;
  for (size_t b = 0; b < bufs.size(); ++b) {
    double s = 0;
    for (int64_t i = 0; i < bufs[b].n; ++i) {
      const double g = value_at(bufs[b], i);
      s += g * g;
    }
    if (per_buffer) per_buffer[b] = s;
    total += s;
  }
  return total;
}

}  // namespace demi::kernels::ref
