// The Dense (fully connected) layer's kernels, in MindSpore's and PyTorch's weight layout (out, in):
// forward, input gradient and weight gradient are matrix products (matmul.h); the bias gradient is a
// column sum, a memory-bound loop of our own that accumulates in f32.
//
//   x (M, K), w (N, K), b (N) -> y (M, N) = act(x w^T + b)
//   dx (M, K) = dy (M, N) w (N, K)
//   dw (N, K) = dy^T (N, M) x (M, K)          db (N) = sum over M of dy
//
// dtypes per tensor as in Conv2dParams: x/dx in x_dtype, w/dw in w_dtype (f32 dw from bf16 or f16 x and
// dy writes AMP's master gradient directly), y/dy in y_dtype, b/db in bias_dtype; each f32|bf16|f16
// (or all f64). Oracles: ref::matmul and ref::bias_grad (../reference/matmul.h).
#pragma once

#include <cstdint>
#include <string>

#include "demi/core/dtype.h"

namespace demi::kernels::onednn {

struct DenseParams {
  int64_t m = 0;  // rows (the batch, or every leading dimension flattened)
  int64_t k = 0;  // in features
  int64_t n = 0;  // out features
  DType x_dtype = DType::kF32;
  DType w_dtype = DType::kF32;
  DType y_dtype = DType::kF32;
  DType bias_dtype = DType::kF32;
  // bf16|f16: an f32 w is read rounded to it, as if cast there (forward and input gradient; the products
  // round it in packing, MatmulParams::b_round). AMP's master weights need no low-precision copy then.
  DType w_round = DType::kF32;
  // bf16|f16: an f32 x is read rounded to it, as if cast there (forward and weight gradient: the products
  // round it in packing, MatmulParams::a_round / b_round). AMP's data batch needs no cast then.
  DType x_round = DType::kF32;
  bool relu = false;        // forward: fused ReLU after the bias
  bool accumulate = false;  // backward: dx += ..., dw += ..., db += ... instead of overwriting
};

// x (M, K) x_dtype, w (N, K) w_dtype, bias (N) bias_dtype or nullptr -> y (M, N) y_dtype; residual (M, N)
// y_dtype or nullptr: added before the ReLU, in the product's store (MatmulParams::residual); it may be y.
void dense_forward(const DenseParams& p, const void* x, const void* w, const void* bias, void* y,
                   const void* residual = nullptr);
// dy (M, N) y_dtype, w (N, K) w_dtype -> dx (M, K) x_dtype
void dense_backward_data(const DenseParams& p, const void* dy, const void* w, void* dx);
// x (M, K) x_dtype, dy (M, N) y_dtype -> dw (N, K) w_dtype, and db (N) bias_dtype unless db is nullptr
// (With bf16 x and dy and many rows, oneDNN's inner-product primitive or the product, whichever measured
// faster for the shape here, priced by its workspace: one choice per shape, CPU and thread count, kept
// beside the matmul choices.)
void dense_backward_weights(const DenseParams& p, const void* x, const void* dy, void* dw, void* db);
// Which way dense_backward_weights makes p's weight gradient here: "onednn-inner-product", or "product
// (<matmul_kernel's name>)"; measured now on zeroed operands if the choice is not made yet.
std::string dense_backward_weights_kernel(const DenseParams& p, bool with_bias);
// The choice file in use ("" when kept in memory only); another folder from now on ("" = the default).
std::string dense_weights_cache_path();
void set_dense_weights_cache_dir(const std::string& dir);

// dy (rows, cols) dy_dtype -> db (cols) db_dtype = column sums of dy, accumulated in f32 (f64 for f64);
// db += the sums with `accumulate`. Parallel over column blocks, each thread streaming every row.
void bias_grad(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
               bool accumulate);

}  // namespace demi::kernels::onednn
