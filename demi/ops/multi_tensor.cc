// The engine and multi-tensor helpers of ops.h: tensor-level entry points to kernels that the autograd
// engine and the AMP train step need, so neither reaches below ops.
#include <algorithm>
#include <vector>

#include "demi/kernels/cpu/amp_kernels.h"
#include "demi/kernels/cpu/optimizer.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

// The buffers of `tensors` (undefined ones skipped) and each buffer's index in tensors.
void collect(std::span<const Tensor> tensors, const char* op, std::vector<kernels::GradBuffer>& bufs,
             std::vector<int64_t>& index) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) continue;
    DEMI_CHECK(t.dtype() == DType::kF32 || is_low_precision(t.dtype()), op,
               ": gradients must be FP32, FP16 or BF16, got ", t.describe());
    bufs.push_back({t.raw_data(), t.numel(), t.dtype()});
    index.push_back(static_cast<int64_t>(i));
  }
}

}  // namespace

void momentum_update(const MomentumStep& s, float* v, float* p, const float* g, int64_t n) {
  kernels::momentum_update(s, v, p, g, n);
}

void momentum_update_mixed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n) {
  kernels::momentum_update_mixed(s, x, p, n);
}

void sgd_update(const SgdStep& s, float* p, const float* g, int64_t n) { kernels::sgd_update(s, p, g, n); }

void adam_update(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n) {
  kernels::adam_update(s, m, v, p, g, n);
}

Tensor accumulate(const Tensor& a, const Tensor& b) {
  DEMI_ASSERT(a.dtype() == b.dtype() && a.numel() == b.numel(), "accumulate: ", a.describe(), " and ",
              b.describe(), " differ");
  return internal::binary(kernels::BinaryOp::kAdd, a, b.reshape(a.shape()));
}

int64_t unscale_and_check_finite(std::span<const Tensor> grads, float inv_scale, const char* op) {
  std::vector<kernels::GradBuffer> bufs;
  std::vector<int64_t> index;
  collect(grads, op, bufs, index);
  kernels::UnscaleResult r = kernels::unscale_and_check_finite(bufs, inv_scale);
  return r.all_finite ? -1 : index[static_cast<size_t>(r.first_nonfinite)];
}

double sum_of_squares(std::span<const Tensor> tensors, const char* op, double* per_tensor) {
  std::vector<kernels::GradBuffer> bufs;
  std::vector<int64_t> index;
  collect(tensors, op, bufs, index);
  if (per_tensor == nullptr) return kernels::sum_of_squares(bufs);
  std::vector<double> per(bufs.size());
  const double total = kernels::sum_of_squares(bufs, per.data());
  std::fill_n(per_tensor, tensors.size(), 0.0);
  for (size_t k = 0; k < bufs.size(); ++k) per_tensor[index[k]] = per[k];
  return total;
}

float sum_of_squares_then_scale(std::span<const Tensor> tensors, const char* op, double* per_tensor,
                                const std::function<float(const double* per_tensor)>& coef) {
  std::vector<kernels::GradBuffer> bufs;
  std::vector<int64_t> index;
  collect(tensors, op, bufs, index);
  return kernels::sum_of_squares_then_scale(bufs, [&](const double* per) {
    std::fill_n(per_tensor, tensors.size(), 0.0);
    for (size_t k = 0; k < bufs.size(); ++k) per_tensor[index[k]] = per[k];
    return coef(per_tensor);
  });
}

}  // namespace demi::ops
