// The fused unscale + all-finite pass over every gradient (one read and one write per value), on the
// vectorised kernel in demi/kernels/cpu/amp_kernels.h.
#include <cmath>

#include "demi/amp/loss_scale.h"
#include "demi/kernels/cpu/amp_kernels.h"

namespace demi::amp {
namespace {

// The FP32 buffers of `grads` (undefined gradients are skipped) and each buffer's index in grads.
void collect(const std::vector<Tensor>& grads, std::vector<std::span<float>>& bufs, std::vector<int64_t>& index) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    DEMI_CHECK(g.dtype() == DType::kF32, "unscale: gradients must be FP32 (master gradients), got ", g.describe());
    bufs.emplace_back(g.data<float>(), static_cast<size_t>(g.numel()));
    index.push_back(static_cast<int64_t>(i));
  }
}

}  // namespace

int64_t unscale_and_check(std::vector<Tensor>& grads, float inv_scale) {
  std::vector<std::span<float>> bufs;
  std::vector<int64_t> index;
  collect(grads, bufs, index);
  kernels::UnscaleResult r = kernels::unscale_and_check_finite(bufs, inv_scale);
  return r.all_finite ? -1 : index[static_cast<size_t>(r.first_nonfinite)];
}

bool all_finite(const std::vector<Tensor>& grads) {
  std::vector<Tensor> f32;
  for (const Tensor& g : grads) f32.push_back(g.defined() && g.dtype() != DType::kF32 ? g.to(DType::kF32) : g);
  std::vector<std::span<float>> bufs;
  std::vector<int64_t> index;
  collect(f32, bufs, index);
  return kernels::unscale_and_check_finite(bufs, 1.0f).all_finite;
}

}  // namespace demi::amp
