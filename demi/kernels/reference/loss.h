// Losses, reference twins: softmax cross-entropy with logits (sparse integer labels or dense probability
// labels) and mean squared error, forward and backward, with reduction none / mean / sum. Losses are
// computed and returned in AccT<T> (f32 for f32/bf16/f16 logits, f64 for f64); gradients are written in
// the logits' type. Kept forever as the oracle for demi/kernels/cpu/loss.h and as the f64 path.
//
// Cross-entropy of row i (x the logits, p the label distribution):
//   lse_i = log(sum_c exp(x_ic))                 (computed with the row maximum subtracted)
//   sparse: loss_i = lse_i - x_i,label_i
//   dense:  loss_i = sum_c p_ic * (lse_i - x_ic) = lse_i * sum_c p_ic - sum_c p_ic x_ic
//   dlogits_ic = (softmax_ic * sum_c p_ic - p_ic) * g_i   (sparse: p is one-hot, sum_c p_ic = 1)
// where g_i = dloss_i (none), dloss (sum), dloss / N (mean). Mean divides by the number of rows N, as
// MindSpore's SoftmaxCrossEntropyWithLogits and PyTorch's CrossEntropyLoss do.
#pragma once

#include <cstdint>
#include <string_view>

#include "demi/kernels/reduction.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

// logits (n, c): n rows (the batch), c classes.
struct CrossEntropyParams {
  int64_t n = 0;
  int64_t c = 0;
  Reduction reduction = Reduction::kMean;
};

namespace ref {

// logits (n, c) T, labels (n) L in {int32, int64} -> loss (n) for kNone else (1), lse (n) (nullable: the
// per-row log-sum-exp that backward can reuse), AccT<T>. A label outside [0, c) is a demi::Error naming
// the row, the label and c.
template <typename T, typename L>
void softmax_cross_entropy_sparse_forward(const T* logits, const L* labels, CrossEntropyParams p, AccT<T>* loss,
                                          AccT<T>* lse);
// logits (n, c) T, labels (n) L, lse (n) AccT<T> (nullable: recomputed), dloss ((n) for kNone else (1))
// AccT<T> -> dlogits (n, c) T
template <typename T, typename L>
void softmax_cross_entropy_sparse_backward(const T* logits, const L* labels, const AccT<T>* lse,
                                           const AccT<T>* dloss, CrossEntropyParams p, T* dlogits);

// logits (n, c) T, probs (n, c) P in {T, float} (f64 -> f64) -> loss, lse as the sparse variant
template <typename T, typename P>
void softmax_cross_entropy_dense_forward(const T* logits, const P* probs, CrossEntropyParams p, AccT<T>* loss,
                                         AccT<T>* lse);
template <typename T, typename P>
void softmax_cross_entropy_dense_backward(const T* logits, const P* probs, const AccT<T>* lse, const AccT<T>* dloss,
                                          CrossEntropyParams p, T* dlogits);

// x, target (n) T -> loss ((n) for kNone else (1)) AccT<T>: (x - target)^2, mean over all n elements
template <typename T>
void mse_forward(const T* x, const T* target, int64_t n, Reduction r, AccT<T>* loss);
// x, target (n) T, dloss ((n) for kNone else (1)) -> dx (n) T = 2 (x - target) g, dtarget (n) T = -dx
// (nullable)
template <typename T>
void mse_backward(const T* x, const T* target, int64_t n, Reduction r, const AccT<T>* dloss, T* dx, T* dtarget);

}  // namespace ref
}  // namespace demi::kernels
