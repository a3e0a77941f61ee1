// demi's differentiable tensor ops: every call goes through the one dispatch point (dispatch.h), which
// records it for autograd, applies the AMP precision policy and notifies the op observers (trace, profiler, ...).
//
// Shapes are outermost-first, NCHW for images. Floating ops accept f32, f16, bf16 (and f64, for gradient
// checks); binary ops promote their inputs (f16 with bf16 -> f32). Reductions, softmax and the losses
// accumulate in f32; the losses always return f32.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "demi/core/rng.h"
#include "demi/core/tensor.h"
#include "demi/kernels/conv_params.h"
#include "demi/kernels/optimizer_params.h"
#include "demi/kernels/reduction.h"
#include "demi/ops/dispatch.h"
#include "demi/ops/trace.h"

namespace demi::ops {

// ---- shape ----
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible; one -1 allowed
Tensor flatten(const Tensor& x, int start_dim = 1);   // (N, C, H, W) -> (N, C*H*W)

// ---- elementwise (NumPy broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);
// The broadcast shape of a and b, or a demi::Error naming both shapes and the op.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

// ---- matrix products ----
// a (M, K) [or (K, M) if trans_a] · b (K, N) [or (N, K) if trans_b] -> (M, N)
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// a (B, M, K) · b (B, K, N) -> (B, M, N), with the same transpose flags per batch
Tensor batch_matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// The kernel a product of these sizes, layout, dtypes and epilogue runs on this machine, e.g.
// "demi-f32 (demi:avx512_bf16:f32)" or "onednn (brg:avx512_core)" (kernels/matmul.h: chosen by measurement
// at first use, tuned now if it has not run yet). For `demi info` and benchmarks.
std::string matmul_kernel(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, DType a, DType b, DType c,
                          bool bias = false, bool relu = false);
// The file those choices are kept in ("" when only in memory).
std::string matmul_kernel_cache();
// How a Dense layer's weight gradient (x (rows, in) and dy (rows, out) in `dtype`, dW and db into FP32) is
// made here: "onednn-inner-product" or "product (<matmul_kernel>)" (kernels/onednn/dense.h; measured now
// if not yet). For `demi info`.
std::string dense_weights_kernel(int64_t rows, int64_t in, int64_t out, DType dtype);
// The file those choices are kept in ("" when only in memory).
std::string dense_weights_kernel_cache();
// How scaled dot-product attention's bf16 core (`sequences` x `heads` matrices of `tokens` queries and keys,
// `head_dim` per head, no mask) runs here, forward or backward: "tiles" (fused on the tile unit),
// "products" (batched products around the softmax; kernels/attention.h: measured now if not yet), or
// "products (no tile unit)" where the CPU has none. For `demi info`.
std::string attention_kernel(int64_t sequences, int64_t heads, int64_t tokens, int64_t head_dim, bool backward);
// The file those choices are kept in ("" when only in memory).
std::string attention_kernel_cache();
// x (M, K), w (N, K), b (N) or undefined -> y (M, N) = x·wᵀ + b, optionally ReLU fused
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), bool relu = false);
// residual (M, N) + dense(x, w, b) as one op (a residual connection's add): where the sum is in the
// Dense's own dtype (the residual has it, and an Add of the two would compute and return it), the product
// adds the residual in its store (one rounding instead of two, no tensor for the product alone, no Add's
// pass); anywhere else, and while FusionScope is off, exactly add(residual, dense(x, w, b)).
Tensor dense_add(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual);

// ---- convolution and pooling ----
// How a bf16 convolution of x (N, C, H, W) with OC filters of kh x kw (stride 1, symmetric padding `pad`)
// computes on this machine: "onednn-bf16 (<impl>)" or "onednn-f32 (<impl>)" on widened operands
// (kernels/onednn/conv.h: measured at a geometry's first use, tuned now if it has not run yet). For
// `demi info` and benchmarks.
std::string conv2d_bf16_kernel(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                               int64_t pad);
// The file those choices are kept in ("" when only in memory).
std::string conv2d_kernel_cache();
// Which kernel runs the forward and the weight gradient of that convolution (x in `dtype`) on this machine:
// "demi-direct" (kernels/cpu/conv_direct.h, few input channels), "onednn", or "onednn (not a direct
// geometry)"; measured now if not yet. For `demi info` and benchmarks.
struct ConvKernelChoice {
  std::string forward, weight_gradient;
};
ConvKernelChoice conv2d_direct_kernels(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                                       int64_t pad, DType dtype);
// The file the direct convolution's choices are kept in ("" when only in memory).
std::string conv2d_direct_cache();
// The forward's kernel for a geometry and input dtype as a conv layer runs it: "demi-direct", "demi-gemm"
// (kernels/cpu/conv.h, the indirect product), "onednn" or "onednn (not an indirect geometry)"; measured now
// if not yet. For `demi info`.
std::string conv2d_forward_kernel(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                                  int64_t pad, DType dtype);
// The file the indirect convolution's choices are kept in ("" when only in memory).
std::string conv2d_gemm_cache();
// MindSpore's pad_mode: "same", "valid", "pad" (resolved in demi/kernels/conv_params.h).
using kernels::PadMode;
using kernels::pad_mode_name;
using kernels::parse_pad_mode;

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  PadMode pad_mode = PadMode::kSame;
  std::array<int64_t, 4> padding{0, 0, 0, 0};  // top, bottom, left, right (pad_mode kPad only)
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool relu = false;  // fuse a ReLU after the bias
};
// x (N, C, H, W), w (OC, C/groups, KH, KW), b (OC) or undefined -> (N, OC, OH, OW)
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options);

// The transposed convolution (MindSpore's nn.Conv2dTranspose / ops.Conv2DTranspose, PyTorch's
// conv_transpose2d): the adjoint of conv2d, computed as its backward-data. x (N, IC, H, W), w (IC, OC/groups,
// KH, KW), b (OC) or undefined -> (N, OC, OH, OW) with MindSpore's output size (dk = dilation * (k - 1) + 1):
//   "same":  OH = H * stride
//   "valid": OH = H * stride + max(dk - stride, 0)
//   "pad":   OH = (H - 1) * stride + dk - (top + bottom) + output_padding   (PyTorch's, with top = bottom)
// The padding is that of the convolution OH -> H it is the adjoint of ("same" splits it as Conv2d does,
// the odd one at the bottom / right). output_padding (rows at the bottom, columns at the right; pad_mode
// "pad" only) must be below the stride or the dilation, as in PyTorch.
struct Conv2dTransposeOptions {
  std::array<int64_t, 2> stride{1, 1};
  PadMode pad_mode = PadMode::kSame;
  std::array<int64_t, 4> padding{0, 0, 0, 0};  // top, bottom, left, right (pad_mode kPad only)
  std::array<int64_t, 2> output_padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};
Tensor conv2d_transpose(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dTransposeOptions& options);
// Throws a demi::Error naming the op unless the options are valid (the layer checks them when built).
void check_conv2d_transpose_options(const Conv2dTransposeOptions& options);
// The output's (OH, OW) for an input's (H, W), or a demi::Error naming the op and the sizes.
std::array<int64_t, 2> conv2d_transpose_output_size(int64_t h, int64_t w, int64_t kh, int64_t kw,
                                                    const Conv2dTransposeOptions& options);

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{1, 1};
  std::array<int64_t, 2> stride{1, 1};
  PadMode pad_mode = PadMode::kValid;
  std::array<int64_t, 4> padding{0, 0, 0, 0};
};
// x (N, C, H, W) -> (N, C, OH, OW)
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
// max_pool2d(relu(x)) in one pass, forward and backward
Tensor relu_max_pool2d(const Tensor& x, const Pool2dOptions& options);
// relu_max_pool2d(conv2d(x, w, b, conv), pool) as one op: the convolution's full-size output stays in
// workspace in oneDNN's own layout and only the pooled result is stored (kernels/onednn/conv.h); the values
// are the two ops'. Pools whose windows overlap or reach padding, and f64, run the two ops.
Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& conv,
                              const Pool2dOptions& pool);

// ---- activations ----
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x, bool approximate = false);  // exact erf form unless approximate (tanh)
Tensor silu(const Tensor& x);

// ---- reductions (accumulate in f32) ----
// Over `axes` (all axes when empty); keepdim keeps reduced axes as size 1.
Tensor sum(const Tensor& x, std::vector<int> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int> axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, int axis, bool keepdim = false);
Tensor argmax(const Tensor& x, int axis);  // int64 indices; not differentiable

// ---- softmax and losses ----
Tensor softmax(const Tensor& x, int axis = -1);
Tensor log_softmax(const Tensor& x, int axis = -1);

using kernels::Reduction;
Reduction parse_reduction(std::string_view s);  // "mean", "sum", "none"
// logits (N, C); labels (N) int32/int64 class ids when sparse, else (N, C) probabilities.
// Returns f32 (f64 for f64 logits): a scalar for mean/sum, (N) for none.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool sparse, Reduction reduction);
Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction);

// ---- normalisation and regularisation ----
struct BatchNormOptions {
  bool training = true;
  double momentum = 0.9;  // MindSpore: running = momentum * running + (1 - momentum) * batch
  double eps = 1e-5;
};
// x (N, C) or (N, C, H, W); gamma, beta, running_mean, running_var (C) in f32. In training the running
// statistics are updated in place (not differentiated). Statistics and the affine are always computed in
// FP32; when the op is kept in FP32 (O2) and x is float16/bfloat16, x is read as is and y (and, in
// backward, dx) written in x's dtype: the values of cast → FP32 BatchNorm → cast, without the casts.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& options);
// Zeroes each element with probability 1 - keep_prob and scales the rest by 1/keep_prob (identity when
// not training). The mask comes from `gen` (counter-based: independent of the thread count).
Tensor dropout(const Tensor& x, double keep_prob, Generator& gen, bool training = true);

// ---- transformer (demi/ops/transformer_ops.cc) ----
// ids (*) int32|int64 in [0, V), table (V, D) -> (*, D): the rows of the table (MindSpore's nn.Embedding
// lookup). The table's gradient is dense (V, D), summed in FP32 (f64 for f64); ids get none.
Tensor embedding(const Tensor& ids, const Tensor& table);
// x (*, D) normalised over its last axis; gamma, beta (D) or undefined (1 and 0) -> (*, D). Statistics,
// normalisation and affine in FP32 (f64 for f64) at every AMP level; y keeps the dtype x arrives in (a
// low-precision activation stays low, as MindSpore's O2 casts a black-listed cell's output back).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
// x with its axes permuted (a copy): y's axis j is x's axis perm[j]; negative axes count from the end.
Tensor transpose(const Tensor& x, const std::vector<int>& perm);
// x cut along `axis` into `sections` equal parts (MindSpore's ops.split with an int). Parts along the
// outermost non-unit extent are views; otherwise copies. Backward writes every part's gradient (zeros for
// parts that got none) into one tensor of x's shape.
std::vector<Tensor> split(const Tensor& x, int axis, int64_t sections);
// xs (one or more, equal in every dimension but `axis`) joined along `axis` (torch.cat, MindSpore's
// ops.concat), in their promoted dtype; the gradient is cut back into each input's part.
Tensor concat(std::span<const Tensor> xs, int axis);
// Scaled dot-product attention, one fused op: q (N, Sq, Dk), k (N, Sk, Dk), v (N, Sk, Dv) ->
// (N, Sq, Dv) = softmax(scale * q·kᵀ + mask) · v over the keys. The scores are written and soft-maxed in
// FP32 whatever dtype q, k, v compute in (O2-fp16 cannot overflow them); the probabilities are kept in the
// compute dtype for ·v and for backward. mask: undefined, or additive floating (Sq, Sk) for every matrix,
// (B, Sq, Sk) or (B, 1, Sk) (key padding) where N = B * heads and matrix n reads mask b = n / heads; -inf
// masks a key out, and a query whose every key is masked attends to nothing (a zero output row). scale 0
// means 1 / sqrt(Dk). The mask gets no gradient. causal: query i also sees only keys j <= i + (Sk - Sq) (a
// decoder; with Sk > Sq the queries are the last positions, as with a KV cache), applied inside the
// softmax kernel: no (Sq, Sk) mask tensor exists. recompute_probs: backward recomputes the probabilities
// from q, k and the mask (kept anyway) instead of keeping them from the forward, as FlashAttention does — the
// same kernels on the same operands, so the same gradients, bit for bit — for one more q·kᵀ product and
// softmax in backward (on model D, a lower training peak at O0 and O2-bf16 for a longer step: bench/memory.py's
// +recompute-attn rows measure the peak, bench/ab.py with `demi train --recompute-attention` the step time).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                                    double scale = 0, int64_t heads = 1, bool causal = false,
                                    bool recompute_probs = false);
// Self-attention with its heads read and written in place: qkv (B, S, 3 E) as a packed in-projection writes
// it (each token's [q | k | v], each E = heads x d, head-major) -> (B, S, E), the heads merged: what
// splitting the heads apart ((B·H, S, d) each), scaled_dot_product_attention (scale 1/sqrt(d), mask and
// causal as there) and merging them give, bit for bit, without the permutations before and after (or
// their gradients'). Only where attention_heads_fused holds: qkv in the op's compute dtype, bf16, and the
// fused kernels chosen for the shape (kernels/attention.h, measured now if not yet); anything else is an
// error.
bool attention_heads_fused(const Tensor& qkv, int64_t heads, const Tensor& mask = Tensor(), bool causal = false);
Tensor attention_heads(const Tensor& qkv, int64_t heads, const Tensor& mask = Tensor(), bool causal = false,
                       bool recompute_probs = false);

// ---- engine and multi-tensor helpers: the kernels run directly (not recorded, no AMP policy, no trace) ----
// The optimizers' updates of n contiguous FP32 elements (parameter p, gradient g, state), on the calling
// thread at the CPU's widest vectors, the same bits at every ISA level (kernels/optimizer_params.h gives
// each formula): demi/optim's update loops.
using kernels::AdamStep;
using kernels::MixedOperands;
using kernels::MomentumStep;
using kernels::SgdStep;
void momentum_update(const MomentumStep& s, float* v, float* p, const float* g, int64_t n);
void momentum_update_mixed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n);
void sgd_update(const SgdStep& s, float* p, const float* g, int64_t n);
void adam_update(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n);
// a + b, both of one dtype and one number of elements (b is read in a's shape): how the autograd engine
// sums the gradients that reach one tensor along several paths.
Tensor accumulate(const Tensor& a, const Tensor& b);
// grads: FP32, FP16 or BF16 tensors (undefined ones skipped) -> each FP32 g becomes g * inv_scale in place
// (read only when inv_scale == 1) in one fused, vectorised pass; FP16/BF16 ones (AMP O2/O3's parameter
// gradients) are only read, checked as g * inv_scale: the caller applies inv_scale when it reads them
// (Optimizer::step's low_grad_multiplier). Returns -1 when every unscaled value is finite, else the index
// in grads of the first tensor holding an inf or NaN (every tensor is processed either way). A finite g
// whose product overflows counts as non-finite. `op` names the caller in the error for another dtype.
int64_t unscale_and_check_finite(std::span<const Tensor> grads, float inv_scale, const char* op);
// The sum of the squares of every value (widened to f32) of the FP32, FP16 or BF16 `tensors` (undefined
// ones skipped): f32 within fixed blocks, f64 across them, so the result does not depend on the thread
// count. per_tensor (tensors.size(), nullable): each tensor's own sum.
double sum_of_squares(std::span<const Tensor> tensors, const char* op, double* per_tensor = nullptr);
// Gradient clipping's two passes over one list of blocks: sum_of_squares into per_tensor (tensors.size()),
// then every FP32 tensor multiplied in place by coef(per_tensor) unless it returns 1 (FP16/BF16 ones are
// only read: the caller applies the coefficient where it reads them). The step allocates alike whether
// it clips or not, so graph mode's static plan holds for both. Returns the coefficient.
float sum_of_squares_then_scale(std::span<const Tensor> tensors, const char* op, double* per_tensor,
                                const std::function<float(const double* per_tensor)>& coef);

}  // namespace demi::ops
