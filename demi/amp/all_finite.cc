// The fused unscale + all-finite pass over every gradient (one read and one write per value), on the
// vectorised multi-tensor kernel behind ops::unscale_and_check_finite.
#include "demi/amp/loss_scale.h"
#include "demi/ops/ops.h"

namespace demi::amp {

int64_t unscale_and_check(std::vector<Tensor>& grads, float inv_scale) {
  return ops::unscale_and_check_finite(grads, inv_scale, "unscale");
}

bool all_finite(const std::vector<Tensor>& grads) {
  std::vector<Tensor> f32;
  for (const Tensor& g : grads) f32.push_back(g.defined() && g.dtype() != DType::kF32 ? g.to(DType::kF32) : g);
  return ops::unscale_and_check_finite(f32, 1.0f, "all_finite") < 0;
}

}  // namespace demi::amp
