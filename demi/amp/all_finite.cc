// The fused unscale + all-finite pass over every gradient (one read and one write per value), on the
// vectorised multi-tensor kernel behind ops::unscale_and_check_finite.
#include "demi/amp/loss_scale.h"
#include "demi/ops/ops.h"

namespace demi::amp {

int64_t unscale_and_check(std::vector<Tensor>& grads, float inv_scale) {
  if (inv_scale != 1.0f)
    for (size_t i = 0; i < grads.size(); ++i)
      DEMI_CHECK(!grads[i].defined() || !is_low_precision(grads[i].dtype()), "unscale: gradient ", i, " is ",
                 grads[i].describe(), " (an AMP O2/O3 low-precision parameter gradient); unscaling it in place "
                 "would flush the small values the loss scale saved. Check it with all_finite and pass the "
                 "factor to the optimizer (optimizer.step(inv_scale) multiplies low-precision gradients as it "
                 "reads them), or turn low-precision parameter gradients off (auto_mixed_precision's "
                 "low_precision_param_grads = false)");
  return ops::unscale_and_check_finite(grads, inv_scale, "unscale");
}

bool all_finite(const std::vector<Tensor>& grads) {
  // At 1.0 the pass only reads, FP32 and low-precision gradients alike: no FP32 copy of a low one is made.
  return ops::unscale_and_check_finite(grads, 1.0f, "all_finite") < 0;
}

}  // namespace demi::amp
