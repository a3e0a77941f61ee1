// The softmax of scaled dot-product attention, reference twins: scale, additive mask and softmax over the
// keys in one pass from FP32 scores (forward), and the matching backward. Kept forever as the oracle for
// demi/kernels/cpu/attention.h and as the f64 path.
//
// The scores come from the Q·Kᵀ product written in FP32 (f64 for f64) whatever dtype Q and K are in, and
// the maximum is subtracted in FP32 before exponentiating: O2-fp16 attention cannot overflow here, even
// when a score exceeds fp16's 65504. Only the probabilities are rounded to the low dtype (P·V's operand).
//
//   p = softmax_over_keys(scale * s + mask)                 a row whose every entry is -inf gives zeros
//                                                           (causal: hidden keys count as -inf)
//   ds = scale * p * (dp - sum_over_keys(dp * p))           (the gradient w.r.t. the unscaled scores)
#pragma once

#include <cstdint>

namespace demi::kernels {

struct AttentionSoftmaxParams {
  int64_t batch = 1;  // N = B * heads independent (rows, cols) score matrices
  int64_t heads = 1;  // matrix n reads the mask of b = n / heads
  int64_t rows = 0;   // queries (Sq)
  int64_t cols = 0;   // keys (Sk)
  float scale = 1.0f;
  // Mask element (n, i, j) is mask[(n / heads) * mask_batch_stride + i * mask_row_stride + j]: a stride of 0
  // broadcasts (batch stride 0: one mask for all; row stride 0: one row for every query, a key-padding mask).
  int64_t mask_batch_stride = 0;
  int64_t mask_row_stride = 0;
  // Causal (a decoder's self-attention, no mask tensor): query i sees keys j <= i + (cols - rows) only, so
  // with as many keys as queries each position sees itself and the past, and with more keys (a KV cache)
  // the queries are the last `rows` positions. Hidden keys get probability 0 and gradient 0.
  bool causal = false;
  int64_t numel() const { return batch * rows * cols; }
  // Keys query row i sees: the first visible_keys(i) (all of them unless causal; can be 0).
  int64_t visible_keys(int64_t i) const {
    if (!causal) return cols;
    const int64_t v = i + (cols - rows) + 1;
    return v < 0 ? 0 : (v > cols ? cols : v);
  }
};

namespace ref {

// s (N, Sq, Sk) S (float | double), mask (see AttentionSoftmaxParams; nullable) S -> p (N, Sq, Sk) P
// (float | BFloat16 | Half for float scores, double for double)
template <typename S, typename P>
void attention_softmax_forward(const S* s, const S* mask, const AttentionSoftmaxParams& p, P* probs);

// probs (N, Sq, Sk) P, dprobs (N, Sq, Sk) S -> ds (N, Sq, Sk) P
template <typename S, typename P>
void attention_softmax_backward(const P* probs, const S* dprobs, const AttentionSoftmaxParams& p, P* ds);

}  // namespace ref
}  // namespace demi::kernels
