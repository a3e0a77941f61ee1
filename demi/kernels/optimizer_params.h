// The optimizers' element-wise update steps as plain structs (the hyper-parameters one update applies):
// part of the kernels' parameter vocabulary that ops' interface shows (demi/optim fills them; the kernels,
// demi/kernels/cpu/optimizer.h, apply them).
#pragma once

#include "demi/core/dtype.h"

namespace demi::kernels {

// Momentum (MindSpore's, PyTorch's SGD with momentum): v = m v + g + wd p; p -= lr v; with nesterov:
// gi = g + wd p; v = m v + gi; p -= lr (gi + m v).
struct MomentumStep {
  float momentum = 0, lr = 0, weight_decay = 0;
  bool nesterov = false;
};
// A Momentum update's gradient and state where they are not FP32 arrays (AMP O2: a gradient in f16 or bf16,
// the state in bf16): g of g_dtype (f32, f16, bf16) multiplied by g_scale (the gradient's unscale factor),
// v of v_dtype (f32, bf16; rounded back to nearest even).
struct MixedOperands {
  const void* g = nullptr;
  DType g_dtype = DType::kF32;
  float g_scale = 1;
  void* v = nullptr;
  DType v_dtype = DType::kF32;
};
// Plain SGD: p -= lr (g + wd p).
struct SgdStep {
  float lr = 0, weight_decay = 0;
};
// Adam / AdamW: gi = g + l2 p; m = beta1 m + (1 - beta1) gi; v = beta2 v + (1 - beta2) gi gi;
// p = p decay - step m / (sqrt(v) / bias_correction2_sqrt + eps). (The step's bias corrections, decoupled
// decay and L2 term are the optimizer's: demi/optim/optimizer.cc.)
struct AdamStep {
  float beta1 = 0, beta2 = 0, step = 0, bias_correction2_sqrt = 1, eps = 0, decay = 1, l2 = 0;
};

}  // namespace demi::kernels
