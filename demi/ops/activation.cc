// Activations: ReLU, Sigmoid, Tanh, GELU (erf or tanh form), SiLU. Each saves what its backward reads
// (its input or its output, kernels::activation_saved) in the dtype it ran in; ReLU its mask as bits.
#include "demi/kernels/cpu/activation.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using kernels::Activation;

Tensor activation(Op op, Activation a, const Tensor& x_in) {
  internal::check_floating(op, x_in, "x");
  Dispatch d(op, {&x_in});
  Tensor x = d.input(0);
  Tensor y = empty(x.shape(), x.dtype());
  kernels::activation_forward(a, x.dtype(), x.raw_data(), y.raw_data(), x.numel());
  if (a == Activation::kReLU && d.needs_grad()) {
    // The mask as bits, not y: y then lives only as long as its next layer holds it (a Dense after it
    // writes its data gradient into y's bytes), and the mask is applied to that gradient in place.
    const Tensor bits = internal::relu_mask_of(y);
    const DType dtype = y.dtype();
    return d.finish(y, [bits, dtype](const TensorList& g) {
      return TensorList{internal::relu_backward_from_mask(g[0], internal::grad_as(g[0], dtype), bits)};
    });
  }
  Tensor saved = kernels::activation_saved(a) == kernels::ActivationSaved::kInput ? x : y;
  return d.finish(y, [a, saved](const TensorList& g) {
    Tensor gy = internal::grad_as(g[0], saved.dtype());
    Tensor dx = internal::reuse_or_empty(saved);
    kernels::activation_backward(a, saved.dtype(), saved.raw_data(), gy.raw_data(), dx.raw_data(), saved.numel());
    return TensorList{dx};
  });
}

}  // namespace

Tensor relu(const Tensor& x) { return activation(Op::kRelu, Activation::kReLU, x); }
Tensor sigmoid(const Tensor& x) { return activation(Op::kSigmoid, Activation::kSigmoid, x); }
Tensor tanh(const Tensor& x) { return activation(Op::kTanh, Activation::kTanh, x); }
Tensor gelu(const Tensor& x, bool approximate) {
  return activation(Op::kGelu, approximate ? Activation::kGeluTanh : Activation::kGelu, x);
}
Tensor silu(const Tensor& x) { return activation(Op::kSilu, Activation::kSiLU, x); }

}  // namespace demi::ops
