// The softmax of scaled dot-product attention, fast: p = softmax(scale * s + mask) over the keys from FP32
// scores, written in the low dtype (forward), and ds = scale * p * (dp - sum(dp * p)) (backward). The
// scores and their gradient are FP32 (the Q·Kᵀ and dO·Vᵀ products write FP32 whatever their operands), the
// maximum is subtracted in FP32 and the sums accumulate in FP32, so O2-fp16 attention cannot overflow
// here; only p and ds, the operands of the next bf16/fp16 products, are rounded. The f64 forms run the
// reference (demi/kernels/reference/attention.h: AttentionSoftmaxParams, the mask layout and the
// formulas). Vectorised per CPU level (the variants: demi/core/kernel_registry.h; `demi info` prints
// them); rows run in parallel.
#pragma once

#include "demi/core/dtype.h"
#include "demi/kernels/reference/attention.h"

namespace demi::kernels {

// s (N, Sq, Sk) f32|f64, mask in s's dtype (nullable) -> probs (N, Sq, Sk) in p_dtype (f32|bf16|f16 from f32
// scores; f64 from f64). scale must be positive.
void attention_softmax_forward(const void* s, DType s_dtype, const void* mask, const AttentionSoftmaxParams& p,
                               void* probs, DType p_dtype);

// probs (N, Sq, Sk) in p_dtype, dprobs in s_dtype (f32, f64 for f64 probs) -> ds (N, Sq, Sk) in p_dtype
void attention_softmax_backward(const void* probs, DType p_dtype, const void* dprobs, DType s_dtype,
                                const AttentionSoftmaxParams& p, void* ds);

}  // namespace demi::kernels
