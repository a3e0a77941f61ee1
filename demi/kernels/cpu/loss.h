// Losses, fast: softmax cross-entropy with logits — sparse (int32/int64 class labels) or dense
// (probability labels) — and mean squared error, forward and backward, reduction none / mean / sum
// (Reduction and CrossEntropyParams are defined with the reference twins, demi/kernels/reference/loss.h,
// which also gives the formulas). Logits may be f32, bf16 or f16; the loss is always f32, accumulated in
// f32; gradients are written in the logits' dtype. The f64 overloads run the reference (gradient checks).
//
// Cross-entropy is fused: forward computes log-softmax and the NLL in one row pass (after a max pass) and
// can hand its per-row log-sum-exp to backward, which then writes (softmax - labels) * dloss [/ N] in one
// pass. A label outside [0, c) is a demi::Error naming the row, the label and the number of classes.
// Vectorised per CPU level (the variants: demi/core/kernel_registry.h; `demi info` prints them); rows
// run in parallel.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/loss.h"

namespace demi::kernels {

// logits (n, c) f32|bf16|f16, labels (n) i32|i64 -> loss f32 ((n) for kNone, else (1)); lse (n) f32 the
// per-row log-sum-exp for backward (nullable)
void softmax_cross_entropy_sparse_forward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                          CrossEntropyParams p, float* loss, float* lse = nullptr);
// logits (n, c), labels (n), lse (n) f32 from forward (nullable: recomputed), dloss f32 ((n) for kNone, else
// (1)) -> dlogits (n, c) in the logits' dtype
void softmax_cross_entropy_sparse_backward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                           const float* lse, const float* dloss, CrossEntropyParams p, void* dlogits);

// logits (n, c) f32|bf16|f16, probs (n, c) in the logits' dtype or f32 -> loss f32, lse (n) f32 (nullable)
void softmax_cross_entropy_dense_forward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                         CrossEntropyParams p, float* loss, float* lse = nullptr);
void softmax_cross_entropy_dense_backward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                          const float* lse, const float* dloss, CrossEntropyParams p, void* dlogits);

// x, target (n) f32|bf16|f16 -> loss f32 ((n) for kNone, else (1)) of (x - target)^2; mean over all n
void mse_forward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, float* loss);
// x, target (n), dloss f32 ((n) for kNone, else (1)) -> dx (n) = 2 (x - target) dloss [/ n], dtarget = -dx
// (nullable), in x's dtype
void mse_backward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, const float* dloss, void* dx,
                  void* dtarget = nullptr);

// The f64 versions (dtype must be float64; probabilities float64): the reference kernels.
void softmax_cross_entropy_sparse_forward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                          CrossEntropyParams p, double* loss, double* lse = nullptr);
void softmax_cross_entropy_sparse_backward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                           const double* lse, const double* dloss, CrossEntropyParams p,
                                           void* dlogits);
void softmax_cross_entropy_dense_forward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                         CrossEntropyParams p, double* loss, double* lse = nullptr);
void softmax_cross_entropy_dense_backward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                          const double* lse, const double* dloss, CrossEntropyParams p,
                                          void* dlogits);
void mse_forward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, double* loss);
void mse_backward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, const double* dloss,
                  void* dx, void* dtarget = nullptr);

}  // namespace demi::kernels
