// The engine and multi-tensor helpers of ops.h: tensor-level entry points to kernels that the autograd
// engine and the AMP train step need, so neither reaches below ops.
#include <vector>

#include "demi/kernels/cpu/amp_kernels.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

// The FP32 buffers of `tensors` (undefined ones skipped) and each buffer's index in tensors.
template <typename Span>
void collect(std::span<const Tensor> tensors, const char* op, std::vector<Span>& bufs, std::vector<int64_t>* index) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) continue;
    DEMI_CHECK(t.dtype() == DType::kF32, op, ": gradients must be FP32 (master gradients), got ", t.describe());
    bufs.emplace_back(t.data<float>(), static_cast<size_t>(t.numel()));
    if (index) index->push_back(static_cast<int64_t>(i));
  }
}

}  // namespace

Tensor accumulate(const Tensor& a, const Tensor& b) {
  DEMI_ASSERT(a.dtype() == b.dtype() && a.numel() == b.numel(), "accumulate: ", a.describe(), " and ",
              b.describe(), " differ");
  return internal::binary(kernels::BinaryOp::kAdd, a, b.reshape(a.shape()));
}

int64_t unscale_and_check_finite(std::span<const Tensor> grads, float inv_scale, const char* op) {
  std::vector<std::span<float>> bufs;
  std::vector<int64_t> index;
  collect(grads, op, bufs, &index);
  kernels::UnscaleResult r = kernels::unscale_and_check_finite(bufs, inv_scale);
  return r.all_finite ? -1 : index[static_cast<size_t>(r.first_nonfinite)];
}

double sum_of_squares(std::span<const Tensor> tensors, const char* op) {
  std::vector<std::span<const float>> bufs;
  collect(tensors, op, bufs, nullptr);
  return kernels::sum_of_squares(bufs);
}

}  // namespace demi::ops
