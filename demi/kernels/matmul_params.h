// The description of one (batched) matrix product, shared by the oneDNN kernel (onednn/matmul.h) and its
// reference twin (reference/matmul.h), so both read the same contract:
//
//   for every b < batch:  c[b] = act(op(a[b]) · op(b[b]) + bias + (accumulate ? c[b] : 0) + residual[b])
//
//   a: (batch, M, K), or (batch, K, M) stored when trans_a    op(a) is (M, K)
//   b: (batch, K, N), or (batch, N, K) stored when trans_b    op(b) is (K, N)
//   c: (batch, M, N)                    bias: (N) or none     act: ReLU or identity
//
// residual (none when null): a (batch, M, N) matrix in c_dtype, laid out as c, added before the ReLU (a
// residual connection's add fused into the product: read by the store, so the product's output and the sum
// are never two tensors; one rounding instead of two). It may be c itself (then it is accumulate), and
// cannot be combined with accumulate.
//
// a_row_sums (none when null; batch 1 only): M f32 values written with the sums over K of op(a)'s rows,
// of a's values as the product reads them (a_round applied; not with bf16_products), each summed in f32 with
// k ascending — a Dense weight gradient's bias gradient (op(a) = dy^T) from the same pass over dy: demi's
// GEMM sums the blocks of a it packs; the other kernels sum a in a pass of their own.
//
// All row-major and contiguous. The product accumulates in f32 (f64 when every operand is f64) and is
// rounded once into c_dtype. Operand dtypes are f32, bf16 or f16 and may differ from each other and
// from c_dtype (bf16 x bf16 -> f32 and f16 x f16 -> f32 write AMP's weight gradients straight into FP32);
// f64 is allowed only when every dtype is f64. ReLU is applied last, after the accumulation.
//
// b_round (bf16 or f16; f32 = none): b is stored in f32 and its values are read rounded to b_round, bit
// for bit as if b had been cast to b_round first (round to nearest even, overflow to inf) — AMP's FP32
// master weights read by a low-precision product with no low-precision copy of them held anywhere (demi's
// GEMM rounds in its packing; the other kernels get a rounded copy for the call). a_round the same for a:
// AMP's FP32 data batch read by a low-precision layer with no cast of it.
//
// bf16_products (an explicit opt-in: F16Products::kBf16, never set silently): every operand value
// is f16 or bf16, and the f16 ones (a f16 a, a f16 b, an f32 b read as f16) are multiplied rounded to bf16
// (round to nearest even: 8 significant bits instead of 11), exactly as if they had been cast to bf16 first;
// products of bf16 values are exact in f32 and the sums run in f32. On a CPU without fp16 arithmetic this
// runs an f16 product on the bf16 pair kernel (vdpbf16ps) at twice the f32 FMA rate; the numbers change.
#pragma once

#include <cstdint>
#include <string>

#include "demi/core/dtype.h"

namespace demi::kernels {

struct MatmulParams {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool trans_a = false;
  bool trans_b = false;
  DType a_dtype = DType::kF32;
  DType b_dtype = DType::kF32;
  DType c_dtype = DType::kF32;
  bool accumulate = false;     // beta = 1: add the product to what c holds (gradient accumulation)
  const void* bias = nullptr;  // (N) added to every row, or nullptr
  DType bias_dtype = DType::kF32;
  bool relu = false;  // fused ReLU, applied last
  const void* residual = nullptr;  // (batch, M, N) c_dtype added in the store, or nullptr (see above)
  float* a_row_sums = nullptr;     // (M) f32: the sums over K of op(a)'s rows, or nullptr (see above)
  DType a_round = DType::kF32;  // bf16|f16: a (f32) read as if cast to it; kF32: as stored
  DType b_round = DType::kF32;  // the same for b
  bool bf16_products = false;   // f16 operand values multiplied rounded to bf16 (see the top of this file)
};

// The dtype a's and b's values have: a_round, b_round where set, else a_dtype, b_dtype.
inline DType a_value_dtype(const MatmulParams& p) { return p.a_round == DType::kF32 ? p.a_dtype : p.a_round; }
inline DType b_value_dtype(const MatmulParams& p) { return p.b_round == DType::kF32 ? p.b_dtype : p.b_round; }
// The dtype of the values the product multiplies: with bf16_products an f16 value is multiplied as bf16.
inline DType a_product_dtype(const MatmulParams& p) {
  const DType v = a_value_dtype(p);
  return p.bf16_products && v == DType::kF16 ? DType::kBF16 : v;
}
inline DType b_product_dtype(const MatmulParams& p) {
  const DType v = b_value_dtype(p);
  return p.bf16_products && v == DType::kF16 ? DType::kBF16 : v;
}

// "matmul a(2, 7, 3) bf16 x b^T(2, 5, 3) bf16 -> c(2, 7, 5) f32, bias(5) f32, relu, accumulate":
// the shapes as stored, for error messages.
std::string describe(const MatmulParams& p);

// Throws demi::Error (naming `op`, the shapes and the dtypes) unless p is a valid product.
void check_matmul_params(const MatmulParams& p, const char* op);

}  // namespace demi::kernels
