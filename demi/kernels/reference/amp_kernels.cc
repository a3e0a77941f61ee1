#include "demi/kernels/reference/amp_kernels.h"

#include <cmath>

namespace demi::kernels::ref {

UnscaleResult unscale_and_check_finite(std::span<const std::span<float>> grads, float inv_scale) {
  UnscaleResult r;
  for (size_t b = 0; b < grads.size(); ++b) {
    bool finite = true;
    for (float& g : grads[b]) {
      float v = g * inv_scale;
      if (inv_scale != 1.0f) g = v;
      finite = finite && std::isfinite(v);
    }
    if (!finite && r.all_finite) {
      r.all_finite = false;
      r.first_nonfinite = static_cast<int64_t>(b);
    }
  }
  return r;
}

double sum_of_squares(std::span<const std::span<const float>> bufs, double* per_buffer) {
  double total = 0;
  for (size_t b = 0; b < bufs.size(); ++b) {
    double s = 0;
    for (float g : bufs[b]) s += static_cast<double>(g) * g;
    if (per_buffer) per_buffer[b] = s;
    total += s;
  }
  return total;
}

}  // namespace demi::kernels::ref
